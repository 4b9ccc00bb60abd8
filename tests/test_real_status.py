"""`status` against a real monitor process following a real `opencode serve`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from monitor.kit.poll import until
from monitor.kit.sandbox import free_loopback_port, tool_parts
from monitor.kit.scripted_model import script
from tests.harness import status, user_texts

pytestmark = pytest.mark.real_server

READ = ("read", {"filePath": "README.md"})


async def test_status_of_a_running_monitor(opencode_server, start_monitor, http):
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = start_monitor(
        "watch", "--url", opencode_server.url, "--log-format", "json", "--metrics-addr", address
    )
    await monitor.wait_event("stream.connected")
    client = opencode_server.client(http)
    session = await client.create_session("loop")
    await client.prompt_async(session["id"], script([READ], 10, delay=0.2))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    assert len(tool_parts(messages)) == 4
    await monitor.wait_event("feedback.sent")

    code, out = await status(address, "--json")
    assert code == 0
    answer = json.loads(out)
    assert answer["stream"]["state"] == "connected" and answer["stream"]["frames"] > 0
    assert answer["url"] == opencode_server.url
    [entry] = [s for s in answer["sessions"] if s["session_id"] == session["id"]]
    assert entry["directory"] == opencode_server.directory
    assert entry["interventions"] == 1 and entry["state"] in ("idle", "busy")
    assert answer["totals"]["interventions"] == 1 and answer["totals"]["held"] == 0

    code, table = await status(address)
    assert code == 0
    assert table.splitlines()[0] == f"monitor 0.1.0 watching {opencode_server.url}"
    assert any(line.startswith(session["id"] + "  ") for line in table.splitlines())


async def test_a_held_session_stays_held_across_a_restart_until_a_person_writes(
    opencode_server, start_monitor, http
):
    address = f"127.0.0.1:{free_loopback_port()}"
    flags = ("--url", opencode_server.url, "--log-format", "json", "--metrics-addr", address)
    first = start_monitor("watch", *flags, "--on-loop", "hold")
    await first.wait_event("stream.connected")
    client = opencode_server.client(http)
    session = await client.create_session("held")
    await client.prompt_async(session["id"], script([READ], 10, delay=0.2))
    await first.wait_event("feedback.sent")

    async def held_feedback_stored() -> list[dict[str, Any]] | None:
        messages = await client.messages(session["id"])
        last = messages[-1]["info"]["role"] == "user" and "on hold" in user_texts(messages)[-1]
        idle = session["id"] not in await client.status()
        return messages if last and idle else None

    messages = await until(held_feedback_stored, 60, 0.2, "the held feedback stored")
    assert len(tool_parts(messages)) == 4
    code, out = await status(address, "--json")
    [entry] = [s for s in json.loads(out)["sessions"] if s["session_id"] == session["id"]]
    assert (code, entry["state"]) == (0, "held")
    await first.stop()

    # A new monitor finds the hold in the session's messages: the session is idle.
    second = start_monitor("watch", *flags)
    [resynced] = await second.wait_event("stream.resynced")
    assert resynced["held"] == 1
    code, out = await status(address, "--json")
    answer = json.loads(out)
    [entry] = [s for s in answer["sessions"] if s["session_id"] == session["id"]]
    assert (code, entry["state"], entry["interventions"]) == (0, "held", 1)
    assert answer["totals"]["held"] == 1

    # A person writes (stored only, so the scripted model does not loop again): not held.
    await client.api.prompt(
        session["id"], opencode_server.directory, "ok, stop", no_reply=True, route=1
    )

    async def unheld() -> bool:
        code, out = await status(address, "--json")
        assert code == 0
        return json.loads(out)["totals"]["held"] == 0

    await until(unheld, 30, 0.2, "the hold to end")
