"""`opencode-loop-monitor watch` against the real `opencode serve`, checked on the server.

The model is scripted (monitor/kit/scripted_model.py): its first user message says which tool
calls to make. Every assertion reads the server's own record of the session (its messages
and parts) or the monitor's JSON log.
"""

from __future__ import annotations

import asyncio

import pytest

from monitor.kit.poll import until
from monitor.kit.sandbox import free_loopback_port, tool_parts
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from monitor.shell.stream import CONNECTION_LOST
from tests.harness import (
    MODEL_DELAY,
    STATUS_FLAGS,
    assistant_texts,
    seen_idle,
    seen_through,
    start_watching,
    user_texts,
    watch_args,
)

pytestmark = pytest.mark.real_server

# Distinctive argument values: test 7 checks that none reaches the monitor's logs.
SECRET_FILE = "notes-4f7c2a91.md"
SECRET_COMMAND = "echo canary-81d3b6e0"
READ = ("read", {"filePath": SECRET_FILE})
BASH = ("bash", {"command": SECRET_COMMAND, "description": "print a word"})


async def test_two_call_cycle_aborted_on_its_sixth_call(
    opencode_server, start_monitor, http, measure_overshoot
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("loop")
    await client.prompt_async(session["id"], script([READ, BASH], 30, delay=MODEL_DELAY))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    parts = tool_parts(messages)
    assert [p["tool"] for p in parts] == ["read", "bash"] * 3  # no call after the 6th
    [detected] = monitor.events("intervention.outcome")
    assert detected["part_id"] == parts[5]["id"]
    assert measure_overshoot(messages, [detected["part_id"]]) == 0
    assert (detected["cycle_length"], detected["repetitions"], detected["tools"]) == (
        2,
        3,
        ["read", "bash"],
    )
    assert detected["outcome"] == "aborted" and detected["session_id"] == session["id"]
    assert detected["directory"] == opencode_server.directory
    users = user_texts(messages)
    assert len(users) == 2 and "2 calls (read, bash) repeated 3 times" in users[1]
    assert messages[-1]["info"]["role"] == "assistant"
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER
    assert monitor.events("feedback.sent")[0]["session_id"] == session["id"]
    code, took = await monitor.stop()
    assert code == 0 and took < 5
    assert monitor.events("monitor.stopped")


def write_files(server, count: int) -> None:
    """The files a varied run reads, each with its own text."""
    for n in range(count):
        (server.project / f"file-{n}.md").write_text(f"file {n}\n")


async def test_varied_calls_run_to_the_end(opencode_server, start_monitor, http):
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await start_watching(start_monitor, opencode_server, "--metrics-addr", address)
    client = opencode_server.client(http)
    session = await client.create_session("varied")
    pattern = [("read", {"filePath": f"file-{n}.md"}) for n in range(10)]
    write_files(opencode_server, 10)  # found, each new: reads of missing files search in circles
    await client.prompt_async(session["id"], script(pattern, 10))
    messages = await client.wait_idle(session["id"], 60)
    assert len(tool_parts(messages)) == 10
    assert len(user_texts(messages)) == 1
    await seen_idle(http, address, session["id"])  # it read the whole run
    assert monitor.events("loop.detected") == []


async def test_two_sessions_only_the_looping_one_is_aborted(
    opencode_server, start_monitor, http, measure_overshoot
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    looping = await client.create_session("looping")
    varied = await client.create_session("varied")
    pattern = [("read", {"filePath": f"file-{n}.md"}) for n in range(12)]
    write_files(opencode_server, 12)
    await asyncio.gather(
        client.prompt_async(looping["id"], script([READ], 20, delay=MODEL_DELAY)),
        client.prompt_async(varied["id"], script(pattern, 12, delay=MODEL_DELAY)),
    )
    looped = await client.wait_idle(looping["id"], 60, user_messages=2)
    finished = await client.wait_idle(varied["id"], 60)
    assert len(tool_parts(looped)) == 4
    assert len(tool_parts(finished)) == 12 and len(user_texts(finished)) == 1
    [detected] = monitor.events("loop.detected")
    assert detected["session_id"] == looping["id"]
    assert measure_overshoot(looped, [detected["part_id"]]) == 0


async def test_loop_caught_after_the_server_restarts(
    opencode_server, start_monitor, http, measure_overshoot
):
    monitor = await start_watching(start_monitor, opencode_server)
    await opencode_server.stop()
    [down] = await monitor.wait_event("stream.disconnected")
    # Issue 45: said in people's words, not as aiohttp's ClientPayloadError.
    assert down["reason"] == CONNECTION_LOST
    await opencode_server.start()
    await monitor.wait_event("stream.connected", count=2, timeout=40)
    client = opencode_server.client(http)
    session = await client.create_session("after restart")
    await client.prompt_async(session["id"], script([READ], 20, delay=MODEL_DELAY))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    assert len(tool_parts(messages)) == 4
    [detected] = monitor.events("intervention.outcome")
    assert detected["outcome"] == "aborted" and detected["session_id"] == session["id"]
    assert measure_overshoot(messages, [detected["part_id"]]) == 0


async def test_dry_run_leaves_the_loop_running(opencode_server, start_monitor, http):
    monitor = await start_watching(start_monitor, opencode_server, "--dry-run")
    client = opencode_server.client(http)
    session = await client.create_session("dry")
    await client.prompt_async(session["id"], script([READ, BASH], 8))
    messages = await client.wait_idle(session["id"], 60)
    assert len(tool_parts(messages)) == 8 and len(user_texts(messages)) == 1
    [detected] = monitor.events("intervention.outcome")
    assert detected["outcome"] == "dry_run" and detected["call_index"] == 6


async def test_third_intervention_holds(opencode_server, start_monitor, http, measure_overshoot):
    monitor = await start_watching(
        start_monitor, opencode_server, "--max-interventions", "2", *STATUS_FLAGS
    )
    client = opencode_server.client(http)
    session = await client.create_session("stubborn")
    await client.prompt_async(
        session["id"], script([READ], 20, delay=MODEL_DELAY, after_feedback="loop")
    )
    await monitor.wait_event("feedback.sent", count=3, timeout=90)
    # A held session must stay quiet: nothing may start. A run the held feedback started
    # would have begun before one asked for after it ends (its calls, or it busy, show).
    await seen_through(monitor, opencode_server, http)
    assert session["id"] not in await client.status()
    messages = await client.messages(session["id"])
    outcomes = [(d["outcome"], d["escalated"]) for d in monitor.events("intervention.outcome")]
    assert outcomes == [("aborted", False), ("aborted", False), ("held", True)]
    # 4 calls, then the first call of each run the feedback started: the loop stays armed
    # across the server's pair of idle events (they end one run), no fresh budget of 4.
    assert len(tool_parts(messages)) == 6
    parts = [d["part_id"] for d in monitor.events("loop.detected")]
    assert measure_overshoot(messages, parts) == 0
    users = user_texts(messages)
    assert len(users) == 4 and "on hold" in users[3] and "on hold" not in users[2]
    assert messages[-1]["info"]["role"] == "user"  # the held feedback got no answer
    assert [r["hold"] for r in monitor.events("feedback.sent")] == [False, False, True]


async def test_logs_hold_no_argument_value(opencode_server, start_monitor, http):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("canary")
    await client.prompt_async(session["id"], script([BASH, READ], 30, delay=MODEL_DELAY))
    await client.wait_idle(session["id"], 60, user_messages=2)
    await monitor.stop()
    output = monitor.output()
    assert monitor.events("loop.detected") and monitor.events("feedback.sent")
    for value in (SECRET_FILE, SECRET_COMMAND, "canary-81d3b6e0", "print a word", "notes-4f7c"):
        assert value not in output


async def test_a_loop_under_way_before_the_monitor_starts_is_caught_on_time(
    opencode_server, start_monitor, http, measure_overshoot
):
    client = opencode_server.client(http)
    session = await client.create_session("early")
    await client.prompt_async(session["id"], script([READ], 20, delay=1.0))

    async def started():
        return len(tool_parts(await client.messages(session["id"]))) >= 2

    await until(started, 30, interval=0.1, what="the run to start")
    # All projects (/global/event): the server's own directory is asked at start.
    monitor = start_monitor(*watch_args(opencode_server))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    parts = tool_parts(messages)
    [detected] = monitor.events("loop.detected")
    # The calls made before the monitor started count: stopped on the 4th, not the 6th.
    assert detected["part_id"] == parts[3]["id"] and detected["call_index"] == 4
    assert len(parts) == 4
    assert measure_overshoot(messages, [detected["part_id"]]) == 0
    [seeded] = monitor.events("session.seeded")
    assert seeded["session_id"] == session["id"] and seeded["calls"] >= 2


async def test_a_url_with_an_extra_path_is_told_the_path_and_no_server_said_found(
    opencode_server, start_monitor
):
    """Issue 32: `--url http://127.0.0.1:4096/session` was told that it "points at another
    web server", after a `server.detected` line: under any path the real server answers its
    web app's page (200, text/html), health routes and stream alike."""
    url = opencode_server.url
    monitor = start_monitor("watch", "--url", f"{url}/session", "--log-format", "json")
    [diagnosis] = await monitor.wait_event("stream.diagnosis")
    assert diagnosis["problem"] == "extra_path"
    assert diagnosis["hint"] == (
        f"{url.removeprefix('http://')} answered 200 for the event stream under the path "
        f"/session that --url has: give --url the server's address alone, {url} (a path only "
        "where a proxy serves OpenCode under it)"
    )
    # Said before the first connect, it would be in the log by now.
    assert monitor.events("server.detected") == []
    code, _ = await monitor.stop()
    assert code == 0
