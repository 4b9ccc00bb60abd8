"""The permission gate against the real `opencode serve`, whose config asks before every call.

Side effects are counted on the server's disk: a `bash` call appends a line to a file, so the
file's length is how many of those calls ran. Everything else is read from the server's own
record of the session or the monitor's JSON log.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from monitor.core.feedback import MARK
from monitor.kit.poll import until
from monitor.kit.sandbox import OpencodeServer, tool_parts
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from tests.harness import (
    STATUS_FLAGS,
    assistant_texts,
    opencode_run,
    seen_through,
    start_watching,
    user_texts,
)

pytestmark = pytest.mark.real_server

ASK = {"*": "ask"}
# OpenCode's defaults ask `doom_loop` and allow the rest; "allow" alone would allow it too.
DOOM_ASKS = {"*": "allow", "doom_loop": "ask"}
LOG_FILE = "loop.txt"
APPEND = ("bash", {"command": f"echo again >> {LOG_FILE}", "description": "append a line"})
READ = ("read", {"filePath": "README.md"})
REFUSED = "The user rejected permission to use this specific tool call"


@pytest.fixture
async def asking_server(opencode_bin, scripted_model):
    async with OpencodeServer(opencode_bin, scripted_model.url, permission=ASK) as server:
        yield server


@pytest.fixture
async def doom_server(opencode_bin, scripted_model):
    async with OpencodeServer(opencode_bin, scripted_model.url, permission=DOOM_ASKS) as server:
        yield server


def lines_written(server: OpencodeServer) -> int:
    path = server.project / LOG_FILE
    return len(path.read_text().splitlines()) if path.exists() else 0


def aborted(messages) -> bool:
    return any(
        (m["info"].get("error") or {}).get("name") == "MessageAbortedError" for m in messages
    )


async def pending(http: aiohttp.ClientSession, server: OpencodeServer) -> list[dict]:
    params = {"directory": server.directory}
    async with http.get(server.url + "/permission", params=params) as response:
        return await response.json()


async def test_approve_refuses_the_fourth_append_and_its_repetition_before_they_run(
    asking_server, start_monitor, http
):
    """The 4th append is refused; the model repeats it at once and the loop, still armed,
    refuses the 5th too: no fresh budget of three after a refusal, and never `always`."""
    monitor = await start_watching(start_monitor, asking_server, "--permissions", "approve")
    client = asking_server.client(http)
    session = await client.create_session("append loop")
    await client.prompt_async(session["id"], script([APPEND], 5))
    messages = await client.wait_idle(session["id"], 60)

    assert lines_written(asking_server) == 3  # calls 1-3 ran, calls 4 and 5 never did
    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * 3 + ["error"] * 2
    error = parts[3]["state"]["error"]
    assert error.startswith(REFUSED) and MARK + "this call was refused" in error
    assert "1 call (bash) repeated 4 times" in error
    assert not aborted(messages)
    assert len(user_texts(messages)) == 1  # no feedback message: the run went on by itself
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER
    outcomes = await monitor.wait_event("intervention.outcome", 2)
    assert [(d["rule"], d["outcome"], d["part_id"], d["call_index"]) for d in outcomes] == [
        ("cycle", "rejected", parts[3]["id"], 4),
        ("cycle", "rejected", parts[4]["id"], 5),
    ]
    assert all(d["reply_ms"] < 1000 for d in outcomes)
    assert len(monitor.events("permission.approved")) == 3
    assert monitor.events("feedback.sent") == []


async def test_two_call_cycle_runs_five_calls_and_refuses_the_sixth(
    asking_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, asking_server, "--permissions", "approve")
    client = asking_server.client(http)
    session = await client.create_session("two-call cycle")
    await client.prompt_async(session["id"], script([READ, APPEND], 6))
    messages = await client.wait_idle(session["id"], 60)
    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * 5 + ["error"]
    assert lines_written(asking_server) == 2  # the appends of calls 2 and 4; 6 never ran
    [detected] = await monitor.wait_event("intervention.outcome")
    assert (detected["outcome"], detected["cycle_length"], detected["tools"]) == (
        "rejected",
        2,
        ["read", "bash"],
    )
    assert detected["part_id"] == parts[5]["id"]
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER and not aborted(messages)


async def test_gate_refuses_the_loop_before_a_slow_person_approves_it(
    asking_server, start_monitor, http
):
    """Under `gate` a person approves each request after half a second; the monitor answers
    the loop's request first."""
    monitor = await start_watching(start_monitor, asking_server, "--permissions", "gate")
    client = asking_server.client(http)
    session = await client.create_session("gate with a person")
    await client.prompt_async(session["id"], script([APPEND], 4))
    person_answers: list[int] = []

    async def person() -> None:
        while True:
            for request in await pending(http, asking_server):
                await asyncio.sleep(0.5)
                url = f"{asking_server.url}/permission/{request['id']}/reply"
                params = {"directory": asking_server.directory}
                async with http.post(url, params=params, json={"reply": "once"}) as response:
                    person_answers.append(response.status)
            await asyncio.sleep(0.05)

    approving = asyncio.create_task(person())
    try:
        messages = await client.wait_idle(session["id"], 60)
    finally:
        approving.cancel()
    assert lines_written(asking_server) == 3
    assert person_answers.count(200) == 3  # the 4th request was gone when the person came
    [detected] = await monitor.wait_event("intervention.outcome")
    assert detected["outcome"] == "rejected"
    assert tool_parts(messages)[3]["state"]["status"] == "error"
    assert monitor.events("permission.approved") == []


async def test_approve_runs_every_call_of_a_session_that_never_loops(
    asking_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, asking_server, "--permissions", "approve")
    client = asking_server.client(http)
    session = await client.create_session("varied")
    pattern = [("read", {"filePath": f"file-{n}.md"}) for n in range(5)] + [APPEND]
    await client.prompt_async(session["id"], script(pattern, 6))
    messages = await client.wait_idle(session["id"], 60)
    assert len(tool_parts(messages)) == 6 and lines_written(asking_server) == 1
    assert len(monitor.events("permission.approved")) == 6
    assert monitor.events("loop.detected") == []


async def test_under_gate_alone_requests_stay_pending(asking_server, start_monitor, http):
    monitor = await start_watching(
        start_monitor, asking_server, "--permissions", "gate", *STATUS_FLAGS
    )
    client = asking_server.client(http)
    session = await client.create_session("nobody answers")
    await client.prompt_async(session["id"], script([APPEND], 3))
    await until(lambda: pending(http, asking_server), 30, 0.1, "a permission request")
    # The monitor has read the request: an answer it decided on then went out at once.
    await seen_through(monitor, asking_server, http)
    [request] = await pending(http, asking_server)
    assert request["sessionID"] == session["id"] and request["permission"] == "bash"
    assert session["id"] in await client.status()  # still waiting for someone
    assert lines_written(asking_server) == 0
    assert monitor.events("permission.approved") == [] and monitor.events("loop.detected") == []


async def test_a_tool_that_asks_nothing_is_still_aborted(
    opencode_bin, scripted_model, start_monitor, http, measure_overshoot
):
    permission = {"*": "ask", "read": "allow"}
    async with OpencodeServer(opencode_bin, scripted_model.url, permission=permission) as server:
        monitor = await start_watching(start_monitor, server, "--permissions", "approve")
        client = server.client(http)
        session = await client.create_session("reads ask nothing")
        await client.prompt_async(session["id"], script([READ], 20, delay=0.2))
        messages = await client.wait_idle(session["id"], 60, user_messages=2)
    parts = tool_parts(messages)
    assert len(parts) == 4
    [detected] = await monitor.wait_event("intervention.outcome")
    assert (detected["rule"], detected["outcome"], detected["part_id"]) == (
        "cycle",
        "aborted",
        parts[3]["id"],
    )
    # No permission request to refuse: the abort is the stop, and nothing ran past it (how
    # fast it comes is the benchmark's to say, bench.run "abort", not a timed test's).
    assert "request_id" not in detected and detected["abort_ms"] >= 0
    assert measure_overshoot(messages, [detected["part_id"]]) == 0
    assert monitor.events("permission.approved") == []


async def doom_loop_run(server, start_monitor, http, *flags):
    """A model step of four identical parallel reads; the server asks `doom_loop` at the
    third. Returns the monitor, the messages and seconds from the request to idle."""
    monitor = await start_watching(start_monitor, server, *flags)
    client = server.client(http)
    session = await client.create_session("doom loop")
    await client.prompt_async(session["id"], script([READ], 4, parallel=4))
    asked = await until(lambda: pending(http, server), 30, what="the doom_loop request")
    asked_at = time.monotonic()
    assert asked[0]["permission"] == "doom_loop"
    messages = await client.wait_idle(session["id"], 40, user_messages=2)
    return monitor, messages, time.monotonic() - asked_at


async def test_doom_loop_left_unanswered_is_refused_after_the_grace_period(
    doom_server, start_monitor, http
):
    monitor, messages, took = await doom_loop_run(
        doom_server, start_monitor, http, "--permission-grace", "2"
    )
    # Refused no sooner than the grace (the refusal itself is the outcome below); no upper
    # bound by the clock: `took` also holds the model's answer to the feedback, seconds on a
    # loaded machine (issue 56: 10.1 s at a load of 11 failed a bound of 10).
    assert took >= 2
    [detected] = await monitor.wait_event("intervention.outcome")
    assert (detected["rule"], detected["outcome"], detected["tools"]) == (
        "doom_loop",
        "rejected",
        ["read"],
    )
    users = user_texts(messages)
    assert len(users) == 2 and users[1].startswith(MARK)
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER
    assert messages[-1]["info"]["role"] == "assistant"


async def test_doom_loop_is_refused_at_once_under_approve(doom_server, start_monitor, http):
    monitor, messages, took = await doom_loop_run(
        doom_server, start_monitor, http, "--permissions", "approve"
    )
    # The grace period (30 s by default) does not apply; `took` also holds the model's answer.
    assert took < 30
    [detected] = await monitor.wait_event("intervention.outcome")
    assert (detected["rule"], detected["outcome"]) == ("doom_loop", "rejected")
    assert detected["reply_ms"] < 1000
    assert user_texts(messages)[1].startswith(MARK)
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER


async def test_opencode_run_without_auto_refuses_the_first_call_and_ends(
    asking_server, opencode_bin, start_monitor, http
):
    """`opencode run` rejects every request at once, with no message: the run ends at the
    first call, before any loop can form; the monitor has nothing to stop."""
    monitor = await start_watching(
        start_monitor, asking_server, "--permissions", "gate", *STATUS_FLAGS
    )
    code, output = await opencode_run(asking_server, opencode_bin, script([APPEND], 4))
    assert "auto-rejecting" in output and code == 0
    assert lines_written(asking_server) == 0
    await seen_through(monitor, asking_server, http)  # the monitor has read the whole run
    assert monitor.events("loop.detected") == []


async def test_opencode_run_with_auto_races_the_monitor_and_every_loop_is_stopped(
    asking_server, opencode_bin, start_monitor
):
    """`opencode run --auto` approves every request at once, the loop's too: whoever answers
    first wins. Our refusal usually does (the call never runs); if `run` is first, the
    monitor hears 404 and aborts as without the gate. Either way the loop has an outcome."""
    monitor = await start_watching(start_monitor, asking_server, "--permissions", "gate")
    code, output = await opencode_run(asking_server, opencode_bin, script([APPEND], 4), "--auto")
    assert code == 0
    [detected] = await monitor.wait_event("intervention.outcome")
    assert detected["rule"] == "cycle" and detected["call_index"] == 4
    if detected["outcome"] == "rejected":
        assert lines_written(asking_server) == 3
        assert MARK + "this call was refused" in output
        assert DEFAULT_ANSWER in output  # the model answered within the same run
    else:
        assert (detected["outcome"], detected["fallback"]) == ("aborted", "answered first")
