"""Issue 43 on the real `opencode serve` with the plugin: of a `watch` serving the plugin's
endpoint and one with `--plugin-socket off`, started in either order or together, the one
the plugin asks acts, and every loop gets one intervention (the plugin's refusal, in band);
and two `watch` of one server under two spellings of its URL give one acting monitor."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.kit.sandbox import OpencodeServer, tool_parts
from monitor.kit.scripted_model import script
from tests.harness import user_texts, watch_args
from tests.monitor_process import MonitorProcess

pytestmark = pytest.mark.real_server

APPEND = ("bash", {"command": "echo x >> out.txt", "description": "append a line"})
LOOPS = 3


async def one_loop(server: OpencodeServer, http, acting: MonitorProcess, n: int) -> str:
    """A run of 4 identical appends: refused in band at the 4th by the monitor the plugin
    asks, nothing else (no abort, no feedback message). The session's id."""
    (server.project / "out.txt").unlink(missing_ok=True)
    client = server.client(http)
    session = await client.create_session(f"appends {n}")
    await client.prompt_async(session["id"], script([APPEND], 4, delay=0.1))
    messages = await client.wait_idle(session["id"], 60)
    assert (server.project / "out.txt").read_text().splitlines() == ["x"] * 3, n
    assert [p["state"]["status"] for p in tool_parts(messages)][-1] == "error", n
    assert all(m["info"].get("error") is None for m in messages), n  # no abort
    assert len(user_texts(messages)) == 1, n  # no feedback message

    def of_session(records: list) -> list:
        return [
            r
            for r in records
            if r.get("event") == "intervention.outcome" and r.get("session_id") == session["id"]
        ]

    outcome = of_session(await acting.wait_for(of_session))
    assert [(o["outcome"], o["call_index"]) for o in outcome] == [("blocked", 4)], n
    return str(session["id"])


async def settled(served: MonitorProcess, bare: MonitorProcess) -> None:
    """Both follow the stream and the endpoint monitor acts (at once, or a poll after the
    bare one gave it the role)."""
    for monitor in (served, bare):
        await monitor.wait_event("stream.resynced")
    await served.wait_for(
        lambda rs: any(r.get("event") in ("monitor.acting", "monitor.took_over") for r in rs)
    )


@pytest.mark.parametrize("order", ["endpoint first", "bare first", "together"])
async def test_the_monitor_the_plugin_asks_acts_whichever_starts_first(
    plugin_server: OpencodeServer, start_monitor, http, socket_path: Path, order: str
) -> None:
    served_args = watch_args(plugin_server, "--plugin-socket", str(socket_path))
    bare_args = watch_args(plugin_server, "--plugin-socket", "off")
    if order == "endpoint first":
        served = start_monitor(*served_args)
        await served.wait_event("plugin.listening")
        bare = start_monitor(*bare_args)
    elif order == "bare first":
        bare = start_monitor(*bare_args)
        await bare.wait_event("monitor.acting")
        served = start_monitor(*served_args)
    else:
        served, bare = start_monitor(*served_args), start_monitor(*bare_args)
    await settled(served, bare)
    if order == "bare first":
        assert bare.events("monitor.gave_way") and served.events("monitor.took_over")
    sessions = [await one_loop(plugin_server, http, served, n) for n in range(LOOPS)]

    # The bare one saw each loop, and left it to the endpoint monitor: one intervention each.
    def standby_outcomes(records: list) -> list:
        return [r for r in records if r.get("event") == "intervention.outcome"]

    await bare.wait_for(lambda rs: len(standby_outcomes(rs)) >= LOOPS)
    left = standby_outcomes(bare.records())
    assert sorted((r["session_id"], r["outcome"]) for r in left) == sorted(
        (s, "standby") for s in sessions
    )
    assert len(served.events("intervention.outcome")) == LOOPS
    assert bare.events("loop.detected") == [] and len(bare.events("loop.standby")) == LOOPS
    assert bare.events("feedback.sent") == served.events("feedback.sent") == []


async def test_two_spellings_of_the_server_give_one_acting_monitor(
    plugin_server: OpencodeServer, start_monitor, http, socket_path: Path
) -> None:
    assert plugin_server.url.startswith("http://127.0.0.1:")
    localhost = plugin_server.url.replace("127.0.0.1", "localhost", 1)
    first = start_monitor(*watch_args(plugin_server, "--plugin-socket", str(socket_path)))
    await first.wait_event("stream.resynced")
    args = ["watch", "--url", localhost, "--log-format", "json", "--plugin-socket", "off"]
    second = start_monitor(*args)
    await second.wait_event("stream.resynced")
    [standby] = second.events("monitor.standby")
    assert first.process is not None and standby["acting_pid"] == first.process.pid
    assert first.events("monitor.acting") and second.events("monitor.acting") == []
    session = await one_loop(plugin_server, http, first, 0)
    [left] = await second.wait_event("intervention.outcome")
    assert (left["session_id"], left["outcome"]) == (session, "standby")
