"""`watch` against the new session engine of the real `opencode serve` 1.18.33.

A session made with `POST /api/session` and prompted with `POST /api/session/{id}/prompt` runs
on the engine OpenCode 2.0 ships (its events `session.next.*`, see V2-NOTES.md): the monitor,
reading `/global/event` as for 1.x, must stop its loops through `/api` (interrupt, then the
feedback as a new turn). Every assertion reads the server's own record of the session
(`GET /api/session/{id}/message`) or the monitor's JSON log.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from monitor.kit.poll import until
from monitor.kit.sandbox import OpencodeServer, free_loopback_port, tool_parts
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from tests.harness import (
    MODEL_DELAY,
    CuttableProxy,
    Engine,
    assistant_texts,
    start_watching,
    status,
    user_texts,
    watch_args,
)

pytestmark = pytest.mark.real_server

READ = ("read", {"path": "README.md"})
BASH = ("bash", {"command": "echo engine", "description": "print a word"})


@pytest.fixture
def engine(opencode_server: OpencodeServer, http: aiohttp.ClientSession) -> Engine:
    return Engine(opencode_server, http)


async def test_one_tool_loop_on_the_new_engine_is_interrupted_once_and_told(
    opencode_server, start_monitor, engine
):
    monitor = await start_watching(start_monitor, opencode_server)
    session = await engine.create_session()
    await engine.prompt(session, script([READ], 12, delay=MODEL_DELAY))
    messages = await engine.wait_answered(session, 90, user_messages=2)

    parts = tool_parts(messages)
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["outcome"], outcome["call_index"]) == (
        session,
        "aborted",
        4,
    )
    assert outcome["part_id"] == parts[3]["id"]
    # Interrupted: the script's 12 reads did not all run.
    assert 4 <= len(parts) <= 5 and {p["tool"] for p in parts} == {"read"}
    users = user_texts(messages)
    assert len(users) == 2 and "1 call (read) repeated 4 times" in users[1]
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER
    [detected] = monitor.events("server.detected")
    assert (detected["classic"], detected["engine"], detected["version"]) == (True, True, "1.18.33")
    assert len(monitor.events("feedback.sent")) == 1


async def test_two_call_cycle_on_the_new_engine_is_interrupted_once(
    opencode_server, start_monitor, engine
):
    monitor = await start_watching(start_monitor, opencode_server)
    session = await engine.create_session()
    await engine.prompt(session, script([READ, BASH], 30, delay=MODEL_DELAY))
    messages = await engine.wait_answered(session, 90, user_messages=2)

    parts = tool_parts(messages)
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["outcome"], outcome["call_index"]) == ("aborted", 6)
    assert (outcome["cycle_length"], outcome["repetitions"], outcome["tools"]) == (
        2,
        3,
        ["read", "bash"],
    )
    assert outcome["part_id"] == parts[5]["id"]
    assert 6 <= len(parts) <= 7
    users = user_texts(messages)
    assert len(users) == 2 and "2 calls (read, bash) repeated 3 times" in users[1]


async def test_a_new_engine_session_that_never_loops_runs_to_the_end(
    opencode_server, start_monitor, engine
):
    monitor = await start_watching(start_monitor, opencode_server)
    session = await engine.create_session()
    pattern = [("read", {"path": f"file-{n}.md"}) for n in range(8)]
    await engine.prompt(session, script(pattern, 8))
    messages = await engine.wait_answered(session, 90)
    assert len(tool_parts(messages)) == 8
    assert len(user_texts(messages)) == 1
    # A positive sign that the monitor read that run: a loop started after it is caught
    # (the stream is in order), and it is the only one.
    looping = await engine.create_session()
    await engine.prompt(looping, script([READ], 12, delay=MODEL_DELAY))
    await monitor.wait_event("intervention.outcome")
    assert [o["session_id"] for o in monitor.events("loop.detected")] == [looping]


async def test_a_classic_and_a_new_engine_session_looping_at_once_are_each_stopped_once(
    opencode_server, start_monitor, engine, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    classic = opencode_server.client(http)
    old = (await classic.create_session("classic"))["id"]
    new = await engine.create_session()
    await asyncio.gather(
        classic.prompt_async(old, script([("read", {"filePath": "README.md"})], 12, delay=0.2)),
        engine.prompt(new, script([READ], 12, delay=MODEL_DELAY)),
    )
    old_messages, new_messages = await asyncio.gather(
        classic.wait_idle(old, 90, user_messages=2),
        engine.wait_answered(new, 90, user_messages=2),
    )
    outcomes = {o["session_id"]: o for o in monitor.events("intervention.outcome")}
    assert len(monitor.events("intervention.outcome")) == 2 and set(outcomes) == {old, new}
    assert all(o["outcome"] == "aborted" and o["call_index"] == 4 for o in outcomes.values())
    assert len(user_texts(old_messages)) == 2 and len(user_texts(new_messages)) == 2
    assert outcomes[new]["part_id"] == tool_parts(new_messages)[3]["id"]
    assert outcomes[old]["part_id"] == tool_parts(old_messages)[3]["id"]


async def test_two_monitors_of_the_new_engine_give_each_of_six_loops_one_feedback(
    opencode_server, start_monitor, engine
):
    """Issue 33: with two monitors of one server, one new-engine loop in six got two
    feedback messages. The second is the first's standby: six loops at once, each interrupted
    once and told once, by the acting monitor alone."""
    acting = await start_watching(start_monitor, opencode_server)
    standby = await start_watching(start_monitor, opencode_server)
    assert acting.events("monitor.acting") and standby.events("monitor.standby")
    sessions = [await engine.create_session() for _ in range(6)]
    await asyncio.gather(
        *(engine.prompt(s, script([READ], 12, delay=MODEL_DELAY)) for s in sessions)
    )
    records = await asyncio.gather(
        *(engine.wait_answered(s, 120, user_messages=2) for s in sessions)
    )
    await standby.wait_event("intervention.outcome", count=6, timeout=60)
    for session, messages in zip(sessions, records, strict=True):
        users = user_texts(messages)
        assert len(users) == 2 and "1 call (read) repeated 4 times" in users[1], session
    outcomes = acting.events("intervention.outcome")
    assert sorted((o["session_id"], o["outcome"], o["call_index"]) for o in outcomes) == sorted(
        (s, "aborted", 4) for s in sessions
    )
    assert len(acting.events("feedback.sent")) == 6
    left = standby.events("intervention.outcome")
    assert sorted((o["session_id"], o["outcome"]) for o in left) == sorted(
        (s, "standby") for s in sessions
    )
    assert standby.events("feedback.sent") == standby.events("feedback.deferred") == []


async def test_a_shell_call_that_never_ends_on_the_new_engine_is_stopped_past_its_bound(
    opencode_server, start_monitor, engine
):
    # Issue 33: 1.18.33 sends nothing while a new-engine bash call runs (no re-sent update
    # with its output, which catches a classic one as it streams), so a `while true` there
    # went on unflagged; the call's time bound, started at its `tool.called`, stops it.
    monitor = await start_watching(start_monitor, opencode_server, "--call-seconds", "3")
    session = await engine.create_session()
    await engine.prompt(session, script([FOREVER], 1, delay=MODEL_DELAY))
    messages = await engine.wait_answered(session, 90, user_messages=2)
    stopped_past_3_s(monitor, messages)
    assert len(monitor.events("feedback.sent")) == 1


# A bash call that never ends and prints nothing.
FOREVER = ("bash", {"command": "while true; do sleep 0.2; done", "description": "wait"})


def stopped_past_3_s(monitor: Any, messages: list[dict[str, Any]]) -> None:
    """The session's one call was interrupted as a runaway and the model told why."""
    [part] = tool_parts(messages)
    assert (part["tool"], part["state"]["status"]) == ("bash", "error")  # interrupted
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["rule"], outcome["part_id"], outcome["outcome"]) == (
        "runaway",
        part["id"],
        "aborted",
    )
    assert "one bash call was still running after 3 s" in user_texts(messages)[1]


async def test_a_new_engine_call_running_when_the_watch_starts_is_stopped_past_its_bound(
    opencode_server, start_monitor, engine
):
    # Begun before the monitor (a restart): read back from the session's record still
    # running, it gets its bound from the read-back (1.18.33 names a running call's state
    # `running` there too); never seen on the stream, it would run on.
    session = await engine.create_session()
    await engine.prompt(session, script([FOREVER], 1, delay=MODEL_DELAY))

    async def running() -> bool:
        parts = tool_parts(await engine.messages(session))
        return bool(parts) and parts[0]["state"]["status"] == "running"

    await until(running, 60, interval=0.05, what="the call to run")
    monitor = await start_watching(start_monitor, opencode_server, "--call-seconds", "3")
    stopped_past_3_s(monitor, await engine.wait_answered(session, 90, user_messages=2))


def failing(command: str) -> tuple[str, dict[str, str]]:
    return ("bash", {"command": command, "description": "look"})


async def test_six_different_failures_on_the_new_engine_are_left_alone_six_alike_stopped(
    opencode_server, start_monitor, engine
):
    # Issue 33: a new-engine bash call that fails is a success whose content blocks say
    # what it printed; read as no text, six different failures (ordinary debugging) were
    # "the same failure" at call 4, where a classic session's are left alone.
    debugging = [
        failing(f"ls {name}") for name in ("alpha", "beta", "gamma", "delta", "eps", "zeta")
    ]
    monitor = await start_watching(start_monitor, opencode_server)
    session = await engine.create_session()
    await engine.prompt(session, script(debugging, 6, delay=MODEL_DELAY))
    messages = await engine.wait_answered(session, 90)
    parts = tool_parts(messages)
    assert [p["state"]["metadata"]["exit"] for p in parts] == [2] * 6
    assert len(user_texts(messages)) == 1
    # The same error six times, each command another: stopped at the 4th. Its run comes
    # after the first on the stream, so it is also the sign the first was read.
    same = [failing(f"ls {flag} nosuch") for flag in ("", "-a", "-l", "-1", "-d", "-F")]
    looping = await engine.create_session()
    await engine.prompt(looping, script(same, 6, delay=MODEL_DELAY))
    messages = await engine.wait_answered(looping, 90, user_messages=2)
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["rule"], outcome["call_index"]) == (
        looping,
        "failure",
        4,
    )
    assert outcome["part_id"] == tool_parts(messages)[3]["id"]


async def test_a_loop_whose_stream_is_cut_is_stopped_once_after_the_reconnect(
    opencode_server, start_monitor, engine
):
    proxy = CuttableProxy(opencode_server.port or 0)
    await proxy.start()
    try:
        monitor = start_monitor(
            "watch", "--url", f"http://127.0.0.1:{proxy.port}", "--log-format", "json"
        )
        await monitor.wait_event("stream.connected")
        session = await engine.create_session()
        await engine.prompt(session, script([READ], 12, delay=0.5))

        async def calls() -> int:
            return len(tool_parts(await engine.messages(session)))

        await until(lambda: _at_least(calls, 2), 60, interval=0.05, what="two calls")
        proxy.cut()  # the 3rd and 4th calls happen while the monitor is away
        await until(lambda: _at_least(calls, 4), 60, interval=0.05, what="four calls")
        proxy.mend()
        messages = await engine.wait_answered(session, 90, user_messages=2)
    finally:
        await proxy.close()
    # Stopped once, at its 4th call, read back from the history after the reconnect. A 5th
    # call the model made before the monitor was back is the loop again, but the record
    # shows it handled already: deferred, not acted on twice.
    outcome, *later = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["outcome"], outcome["call_index"]) == (
        session,
        "aborted",
        4,
    )
    assert [o["outcome"] for o in later] in ([], ["deferred"])
    assert outcome["part_id"] == tool_parts(messages)[3]["id"]
    assert len(user_texts(messages)) == 2
    resynced = monitor.events("stream.resynced")
    assert len(resynced) >= 2 and resynced[-1]["replayed"] > 0
    assert len(monitor.events("feedback.sent")) == 1


async def _at_least(count: Any, wanted: int) -> bool:
    return bool(await count() >= wanted)


async def test_a_held_new_engine_session_waits_without_a_turn_until_a_person_writes(
    opencode_server, start_monitor, engine
):
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = start_monitor(
        *watch_args(opencode_server, "--on-loop", "hold", "--metrics-addr", address)
    )
    await monitor.wait_event("stream.connected")
    session = await engine.create_session()
    await engine.prompt(session, script([READ], 12, delay=MODEL_DELAY))
    [sent] = await monitor.wait_event("feedback.sent", timeout=60)
    assert sent["hold"] is True

    async def held() -> dict[str, Any] | None:
        code, out = await status(address, "--json")
        [entry] = [s for s in json.loads(out)["sessions"] if s["session_id"] == session]
        return entry if code == 0 and entry["state"] == "held" else None

    await until(held, 30, 0.2, "the session held")
    # The feedback was added with `resume: false`: no turn started, and 1.18.33 keeps such a
    # message out of the record until the next turn takes it in.
    messages = await engine.messages(session)
    assert len(user_texts(messages)) == 1 and messages[-1]["info"]["role"] == "assistant"
    assert 4 <= len(tool_parts(messages)) <= 5

    await engine.prompt(session, "ok, read the other file")

    async def unheld() -> bool:
        code, out = await status(address, "--json")
        return code == 0 and json.loads(out)["totals"]["held"] == 0

    await until(unheld, 30, 0.2, "the hold to end")
    # The person's turn took both in: the model reads the feedback, then the person.
    messages = await engine.wait_answered(session, 60, user_messages=3)
    feedback, person = user_texts(messages)[1:]
    assert "on hold" in feedback and person == "ok, read the other file"


async def test_attached_to_a_new_engine_session_mid_run_it_stops_the_loop_at_the_fourth_call(
    opencode_server, start_monitor, engine, http
):
    """`attach` to a session made and prompted through `/api`, its loop under way: 1.18.33
    finds it on `GET /session/{id}` as a classic one, but keeps its messages only on
    `/api/session/{id}/message`; read there, the calls made so far seed the run, and the loop
    is stopped at its 4th call, as `watch` would, through `/api`."""
    session = await engine.create_session()
    await engine.prompt(session, script([READ], 20, delay=1.0))

    async def started() -> bool:
        return len(tool_parts(await engine.messages(session))) >= 1

    await until(started, 60, interval=0.05, what="the first call")
    monitor = start_monitor("attach", session, "--url", opencode_server.url, "--log-format", "json")
    [found] = await monitor.wait_event("attach.found")
    assert (found["session_id"], found["engine"]) == (session, 2)
    assert found["directory"] == opencode_server.directory
    [seeded] = await monitor.wait_event("session.seeded")
    assert seeded["session_id"] == session and seeded["calls"] >= 1

    messages = await engine.wait_answered(session, 90, user_messages=2)
    parts = tool_parts(messages)
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["outcome"], outcome["call_index"]) == (
        session,
        "aborted",
        4,
    )
    # The 4th call of the run, counted from its first: the calls before the attach were read.
    assert outcome["part_id"] == parts[3]["id"]
    assert 4 <= len(parts) <= 5 and len(monitor.events("feedback.sent")) == 1
    users = user_texts(messages)
    assert len(users) == 2 and "1 call (read) repeated 4 times" in users[1]
    assert assistant_texts(messages)[-1] == DEFAULT_ANSWER
    assert monitor.events("attach.other_monitor") == []

    # 1.18.33 deletes a new-engine session by its 1.x route only (no DELETE on `/api`).
    async with http.delete(
        f"{opencode_server.url}/session/{session}",
        params={"directory": opencode_server.directory},
    ) as response:
        assert response.status == 200
    assert await monitor.wait_exit(10) == 0
    assert [r["session_id"] for r in monitor.events("attach.session_deleted")] == [session]


async def test_a_watch_started_during_a_new_engine_loop_reads_it_back_and_stops_it_at_its_4th(
    opencode_server, start_monitor, engine, http
):
    """A daemon (re)started while a new-engine session loops has not seen the session on
    the stream: `/api/session/active` names it busy, and its calls so far are read back by
    `/api/session/{id}/message` (the classic route answers [] for it), so the loop is stopped
    at its 4th call, not 4 calls after the start."""
    session = await engine.create_session()
    await engine.prompt(session, script([READ], 20, delay=1.0))

    async def started() -> bool:
        return len(tool_parts(await engine.messages(session))) >= 1

    await until(started, 60, interval=0.05, what="the first call")
    monitor = await start_watching(start_monitor, opencode_server)
    [seeded] = await monitor.wait_event("session.seeded")
    assert seeded["session_id"] == session and seeded["calls"] >= 1

    messages = await engine.wait_answered(session, 90, user_messages=2)
    parts = tool_parts(messages)
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["outcome"], outcome["call_index"]) == (
        session,
        "aborted",
        4,
    )
    assert outcome["part_id"] == parts[3]["id"]  # the run's 4th call: the first ones read
    assert 4 <= len(parts) <= 5 and len(monitor.events("feedback.sent")) == 1


@pytest.fixture
async def asking_server(opencode_bin, scripted_model):
    async with OpencodeServer(opencode_bin, scripted_model.url, permission={"*": "ask"}) as server:
        yield server


async def test_the_gate_refuses_the_loops_call_of_a_new_engine_session_before_it_runs(
    asking_server, start_monitor, http
):
    """Every call asks (`"*": "ask"`); the monitor approves the others (`approve`) and refuses
    the request of the 4th append through `/api`: calls 1-3 ran, the 4th never did."""
    engine = Engine(asking_server, http)
    monitor = await start_watching(start_monitor, asking_server, "--permissions", "approve")
    session = await engine.create_session()
    append = ("bash", {"command": "echo again >> loop.txt", "description": "append a line"})
    await engine.prompt(session, script([append], 4))
    [outcome] = await monitor.wait_event("intervention.outcome", timeout=60)
    assert (outcome["session_id"], outcome["outcome"], outcome["call_index"]) == (
        session,
        "rejected",
        4,
    )
    messages = await engine.wait_answered(session, 60)
    path = asking_server.project / "loop.txt"
    assert len(path.read_text().splitlines()) == 3
    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts][:3] == ["completed"] * 3
    assert parts[3]["id"] == outcome["part_id"] and parts[3]["state"]["status"] == "error"
    assert len(user_texts(messages)) == 1  # refused before it ran: no stop, no new message
