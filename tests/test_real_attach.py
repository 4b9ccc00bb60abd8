"""`opencode-loop-monitor attach` against the real `opencode serve`, checked on the server.

The scripted model (monitor/kit/scripted_model.py) makes the calls; its `delay` leaves time to
attach while a run is under way. Assertions read the server's record of the session (its
messages and tool parts) and the monitor's JSON log.
"""

from __future__ import annotations

import pytest

from monitor.kit.poll import until
from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import start_watching

pytestmark = pytest.mark.real_server

READ = ("read", {"filePath": "README.md"})


def attach_args(server, session_id, *flags):
    return [
        "attach",
        session_id,
        "--url",
        server.url,
        "--log-format",
        "json",
        "--log-level",
        "debug",
        *flags,
    ]


def user_count(messages):
    return sum(m["info"]["role"] == "user" for m in messages)


async def wait_tool_parts(client, session_id, count, timeout=90.0):
    """Wait until the session's current messages hold at least `count` tool parts (the real
    server beside three other workers once took over 30 s for 5 calls 1 s apart)."""

    async def enough():
        parts = tool_parts(await client.messages(session_id))
        return parts if len(parts) >= count else None

    return await until(enough, timeout, what=f"{count} tool parts in session {session_id}")


async def test_attached_mid_run_aborts_at_the_fourth_call(opencode_server, start_monitor, http):
    client = opencode_server.client(http)
    session = await client.create_session("slow loop")
    await client.prompt_async(session["id"], script([READ], 20, delay=0.8))
    await wait_tool_parts(client, session["id"], 1)
    monitor = start_monitor(*attach_args(opencode_server, session["id"]))
    [seeded] = await monitor.wait_event("session.seeded")
    assert seeded["session_id"] == session["id"] and seeded["loop"] is False
    assert 1 <= seeded["calls"] <= 3  # attached before the cycle was complete

    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    parts = tool_parts(messages)
    assert len(parts) == 4  # nothing ran after the 4th call
    [detected] = monitor.events("intervention.outcome")
    assert detected["part_id"] == parts[3]["id"] and detected["call_index"] == 4
    assert detected["outcome"] == "aborted" and detected["session_id"] == session["id"]
    assert detected["directory"] == opencode_server.directory
    assert user_count(messages) == 2  # the feedback
    assert monitor.events("feedback.sent")[0]["session_id"] == session["id"]
    code, took = await monitor.stop()
    assert code == 0 and took < 5


async def test_attached_after_the_loop_acts_at_once(opencode_server, start_monitor, http):
    client = opencode_server.client(http)
    session = await client.create_session("looped already")
    await client.prompt_async(session["id"], script([READ], 20, delay=1.0))
    before = await wait_tool_parts(client, session["id"], 5)
    monitor = start_monitor(*attach_args(opencode_server, session["id"]))
    [seeded] = await monitor.wait_event("session.seeded")
    assert seeded["loop"] is True and seeded["calls"] >= 5

    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    parts = tool_parts(messages)
    # Stopped at once: at most the call that was already on its way when we attached.
    assert len(parts) <= seeded["calls"] + 1 < 20
    [detected] = monitor.events("intervention.outcome")
    # The position where `watch` would have stopped it: the 4th identical call.
    assert detected["part_id"] == before[3]["id"] == parts[3]["id"]
    assert detected["call_index"] == 4 and detected["outcome"] == "aborted"
    assert user_count(messages) == 2
    assert monitor.events("feedback.sent")[0]["session_id"] == session["id"]


async def test_other_sessions_ignored_and_deletion_exits_0(opencode_server, start_monitor, http):
    client = opencode_server.client(http)
    followed = await client.create_session("followed")
    other = await client.create_session("other")
    monitor = start_monitor(*attach_args(opencode_server, followed["id"]))
    [resynced] = await monitor.wait_event("stream.resynced")
    assert (resynced["busy"], resynced["seeded"]) == (0, 0)  # idle: no current run to read

    await client.prompt_async(other["id"], script([READ], 8))
    messages = await client.wait_idle(other["id"], 60)
    assert len(tool_parts(messages)) == 8 and user_count(messages) == 1  # nobody stopped it
    assert monitor.process.poll() is None

    async with http.delete(
        f"{opencode_server.url}/session/{followed['id']}",
        params={"directory": opencode_server.directory},
    ) as response:
        assert response.status == 200
    assert await monitor.wait_exit(10) == 0
    assert [r["session_id"] for r in monitor.events("attach.session_deleted")] == [followed["id"]]
    assert monitor.events("monitor.stopped")
    # The deletion came on the stream after the other session's run: the monitor read that
    # whole run, and found nothing to act on.
    assert monitor.events("loop.detected") == []


async def test_unknown_session_exits_66(opencode_server, start_monitor):
    missing = "ses_0000000000000000000000000"
    monitor = start_monitor(*attach_args(opencode_server, missing))
    assert await monitor.wait_exit(15) == 66
    assert monitor.stderr_path.read_text().splitlines() == [
        f"opencode-loop-monitor: session {missing} not found on {opencode_server.url}"
    ]
    assert monitor.stdout_path.read_text() == ""


async def test_attach_with_the_plugin_and_no_daemon_counts_its_refusals_and_holds(
    plugin_server, start_monitor, http
):
    """Issue 30: the README's steps (the plugin installed, `attach` to a session, no daemon).
    The plugin's own rule refuses each repetition of the loop; those refusals are `attach`'s
    interventions, counted on its ladder, so after `--max-interventions` the session is held:
    the run is stopped and the model makes no call after the hold."""
    client = plugin_server.client(http)
    session = await client.create_session("appends, plugin alone")
    monitor = start_monitor(*attach_args(plugin_server, session["id"], "--max-interventions", "2"))
    await monitor.wait_event("stream.connected")
    assert monitor.events("monitor.acting")
    append = ("bash", {"command": "echo x >> out.txt", "description": "append"})
    await client.prompt_async(session["id"], script([append], 30, delay=0.2, after_feedback="loop"))
    outcomes = await monitor.wait_event("intervention.outcome", count=3, timeout=90)
    assert [(o["outcome"], o.get("via")) for o in outcomes[:3]] == [
        ("blocked", "plugin_rule"),
        ("blocked", "plugin_rule"),
        ("held", "plugin_rule"),
    ], monitor.output()
    assert [o["interventions"] for o in outcomes[:3]] == [1, 2, 3]
    # The held run gives no answer to wait for (waiting for one caught the run only between
    # the abort and the hold's message, and ran out under load): its feedback, then idle.
    [feedback] = await monitor.wait_event("feedback.sent", timeout=60)
    assert feedback["hold"] is True

    async def idle() -> bool:
        return session["id"] not in await client.status()

    await until(idle, 60, what="the held session idle")
    held = await client.messages(session["id"])
    parts = tool_parts(held)
    # The hold's call was the last: the model made none after it, nor after the feedback.
    assert parts[-1]["id"] == outcomes[2]["part_id"], [p["state"]["status"] for p in parts]
    assert (plugin_server.project / "out.txt").read_text().splitlines() == ["x"] * 3
    assert user_count(held) == 2 and held[-1]["info"]["role"] == "user"  # waits for a person


async def test_attach_beside_a_daemon_is_its_standby_and_the_loop_is_stopped_once(
    opencode_server, start_monitor, http
):
    """Issue 30: a person runs `attach` by hand beside the daemon. The daemon acts; `attach`
    logs the same loop as left to it, and the session gets one abort and one feedback."""
    daemon = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("slow loop, daemon and attach")
    await client.prompt_async(session["id"], script([READ], 20, delay=0.8))
    await wait_tool_parts(client, session["id"], 1)
    attach = start_monitor(*attach_args(opencode_server, session["id"]))
    [standby] = await attach.wait_event("monitor.standby")
    assert daemon.process is not None and standby["acting_pid"] == daemon.process.pid
    assert standby["session_id"] == session["id"]
    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    await daemon.wait_event("feedback.sent")
    [left] = await attach.wait_event("intervention.outcome")
    [stopped] = daemon.events("intervention.outcome")
    assert (stopped["outcome"], stopped["call_index"]) == ("aborted", 4)
    assert (left["outcome"], left["call_index"]) == ("standby", 4)
    assert len(tool_parts(messages)) == 4 and user_count(messages) == 2
    assert attach.events("feedback.sent") == []
    code, _ = await attach.stop()
    assert code == 0
