"""The monitor against stand-ins of the new engine's servers, for what a real one cannot be
made to do on demand (a stream ended mid-run, a read that fails or hangs):
`FakeOpencode(generation=2)` speaks what the real 2.2.5 does (V2-REAL-NOTES.md: only the `/api`
routes and `/api/info`, its web page everywhere else, no replay of missed events, its own
request bodies); `generation=3` 1.18.33's new engine beside the 1.x routes, with the history
of a session's events, read with `--api 2`. The real servers are tested in
tests/test_real_engine.py and tests/test_real_v2*.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.core.feedback import MARK
from monitor.shell import api_v2
from monitor.testing import FakeOpencode, engine_call, engine_event, frames, play
from tests.frames_factory import engine_record
from tests.harness import loop_frames, start, stop, wait_for, watching

S = "ses_s1"
READ = {"path": "README.md"}


def reads(first: int, last: int, seq: int, release: str = "2.2.5") -> list[dict[str, Any]]:
    """Calls `first` to `last` (numbered from 1) of identical reads, from durable seq `seq`,
    as `release` streams them."""
    events = []
    for n in range(first, last + 1):
        events += engine_call(S, n, "read", READ, seq + 3 * (n - first), "/w", release=release)
    return events


def reads_1_18(first: int, last: int, seq: int) -> list[dict[str, Any]]:
    """The same as 1.18.33's new engine streams them (generation 3)."""
    return reads(first, last, seq, "1.18.33")


def events(logs: list[dict], name: str) -> list[dict]:
    return [log for log in logs if log["event"] == name]


async def test_a_2_0_server_is_read_on_its_stream_and_a_loop_interrupted() -> None:
    fake = FakeOpencode(generation=2, streams=[play(frames(*reads(1, 4, 1)))])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt"))
        await stop(*running)
    paths = [r.path for r in fake.requests]
    # `/global/health` answers 2.2.5's web page: no answer, never a 1.x server.
    assert paths[:4] == ["/api/info", "/global/health", "/api/health", "/api/event"]
    [detected] = events(logs, "server.detected")
    assert (detected["classic"], detected["engine"], detected["version"]) == (False, True, "2.2.5")
    assert detected["server"] == "opencode 2.2.5: 2.x API"
    assert detected["stream"].endswith("/api/event")
    [loop] = events(logs, "loop.detected")
    assert (loop["session_id"], loop["part_id"], loop["call_index"]) == (S, "msg_4:call_4", 4)
    # Stopped through 2.0's routes only: interrupt, then the feedback as a new turn.
    assert fake.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    # In 2.2.5's form the first time (the stand-in refuses any other with a 400, as it does).
    [prompt] = fake.of("prompt")
    assert prompt.body == {"text": prompt.body["text"], "resume": True}
    assert prompt.body["text"].startswith(MARK)


async def test_1_18_33s_new_engine_gets_its_own_prompt_body_the_first_time() -> None:
    fake = FakeOpencode(generation=3, streams=[play(frames(*reads_1_18(1, 4, 1)))])
    running = await start(fake, api="2")
    await wait_for(lambda: fake.of("prompt"))
    await stop(*running)
    [prompt] = fake.of("prompt")
    assert prompt.body == {"prompt": {"text": prompt.body["prompt"]["text"]}, "resume": True}


async def test_the_gap_an_overflow_left_is_filled_by_replay_and_counted_once() -> None:
    # The stream brings calls 1 and 2 and is ended (a slow reader's overflow); calls 3 and 4
    # happen while it is down, the next stream brings only what comes after.
    history = reads_1_18(1, 4, 1)
    other_call = engine_call(S, 5, "shell", {"command": "ls"}, 13, "/w", release="1.18.33")
    fake = FakeOpencode(
        generation=3,
        streams=[play(frames(*history[:6]), then="end"), play(frames(*other_call))],
        history={S: history},
        engine_busy={S: {}},
    )
    with capture_logs() as logs:
        running = await start(fake, api="2")
        await wait_for(lambda: fake.of("prompt"))
        await wait_for(lambda: len(events(logs, "stream.resynced")) == 2)
        await stop(*running)
    [asked] = fake.of("history")
    assert asked.path == f"/api/session/{S}/history" and asked.query["after"] == "6"
    # The 4th call, replayed, is the loop, caught once; the 5th comes live after it.
    [loop] = events(logs, "loop.detected")
    assert (loop["part_id"], loop["call_index"]) == ("msg_4:call_4", 4)
    assert len(fake.of("interrupt")) == 1
    assert events(logs, "stream.resynced")[1]["replayed"] == 6


async def test_a_history_that_fails_falls_back_on_the_messages_and_the_loop_is_stopped() -> None:
    # Issue 33: with the history answering 500 after a reconnect, the calls made while the
    # stream was down were lost, and the loop they completed was never interrupted.
    history = reads_1_18(1, 4, 1)
    fake = FakeOpencode(
        generation=3, history={S: history}, answers={"history": [500]}, engine_busy={S: {}}
    )
    fake.streams = [fake.live, play()]
    with capture_logs() as logs:
        running = await start(fake, api="2")
        await wait_for(lambda: events(logs, "stream.resynced"))
        await fake.push(frames(*history[:6]))
        await wait_for(lambda: running[1].status()["stream"]["frames"] >= 6)  # type: ignore[index]
        fake.messages[S] = engine_record(4)  # calls 3 and 4 come while the stream is down
        fake.close()
        await wait_for(lambda: fake.of("prompt"))
        await stop(*running)
    assert {r.query["after"] for r in fake.of("history")} == {"6"}  # retried, then given up
    assert len(events(logs, "session.replay_failed")) == 1
    [loop] = events(logs, "loop.detected")
    assert (loop["session_id"], loop["call_index"]) == (S, 4)
    assert fake.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]


async def test_on_2_2_5_a_loop_completed_while_the_stream_was_down_is_read_back_once() -> None:
    # 2.2.5 has no history route: the calls made while the stream was down are in the busy
    # session's record, read back at the reconnect, each counted once with those the
    # stream brought before.
    history = reads(1, 4, 1)
    fake = FakeOpencode(generation=2, busy={S: {}})
    fake.streams = [fake.live, play()]
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: events(logs, "stream.resynced"))
        await fake.push(frames(*history[:6]))
        await wait_for(lambda: running[1].status()["stream"]["frames"] >= 6)  # type: ignore[index]
        fake.messages[S] = engine_record(4)  # calls 3 and 4 come while the stream is down
        fake.close()
        await wait_for(lambda: fake.of("prompt"))
        await stop(*running)
    assert fake.of("history") == [] and events(logs, "session.replay_failed") == []
    [loop] = events(logs, "loop.detected")
    assert (loop["session_id"], loop["call_index"]) == (S, 4)
    assert fake.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    assert [e["calls"] for e in events(logs, "session.seeded")] == [0, 4]


@pytest.mark.parametrize("hung", ["active", "health"])
async def test_a_hung_api_read_keeps_no_classic_loop_waiting(monkeypatch, hung: str) -> None:
    # Issue 33: on a server of both engines (1.18.33), `GET /api/session/active` hung (or
    # dribbling: a read timeout never ends that) held the resync, and the new stream's
    # frames with it: a classic loop was not stopped within 14 s. A hung `/api/health`
    # added 10 s to every connect. Every `/api` read now has a bound of its own.
    monkeypatch.setattr(api_v2, "API_READ_S", 0.3)
    held = asyncio.Event()
    fake = FakeOpencode(generation=3, holds={hung: held}, busy={"ses_c1": {"type": "busy"}})
    fake.streams = [fake.live]
    try:
        with capture_logs() as logs:
            running = await start(fake)
            await wait_for(fake.live_connected.is_set)
            await fake.push(loop_frames("ses_c1", 4))
            await wait_for(lambda: fake.of("abort"))
            if hung == "active":  # the abort no longer waits for the resync to fail
                await wait_for(lambda: events(logs, "stream.resync_failed"))
            await stop(*running)
    finally:
        held.set()
    assert [r.path for r in fake.of("abort")] == ["/session/ses_c1/abort"]  # the classic route
    if hung == "active":
        [failed] = events(logs, "stream.resync_failed")
        assert failed["error"] == "GET /api/session/active: no answer within 0.3 s"
    else:
        assert events(logs, "stream.resync_failed") == []


async def test_a_classic_loop_is_stopped_while_the_api_read_of_its_directory_hangs(
    monkeypatch,
) -> None:
    # Issue 33: the resync's `GET /api/session/active` hung (its bound, API_READ_S, made
    # long here) holds only the new engine's sessions: a classic session unknown at the
    # connect waits only for the classic `/session/status` answer of its directory.
    import dataclasses

    from tests.harness import FAST

    monkeypatch.setattr(api_v2, "API_READ_S", 60)
    # No other bound ends the wait meanwhile: not the stream's silence, not a read's.
    patient = dataclasses.replace(
        FAST, read_timeout=60, retry=dataclasses.replace(FAST.retry, timeout=60)
    )
    held = asyncio.Event()
    fake = FakeOpencode(generation=3, holds={"active": held})
    fake.streams = [fake.live]
    with capture_logs() as logs:
        running = await start(fake, patient)
        try:
            await wait_for(fake.live_connected.is_set)
            await fake.push(loop_frames("ses_c1", 4))
            await wait_for(lambda: fake.of("abort"))
            resynced_then = len(events(logs, "stream.resynced"))
            held.set()
            await wait_for(lambda: events(logs, "stream.resynced"))
        finally:
            held.set()
            await stop(*running)
    assert [r.path for r in fake.of("abort")] == ["/session/ses_c1/abort"]
    # Stopped before the hung read answered: the resync had not ended, nor failed.
    assert resynced_then == 0 and events(logs, "stream.resync_failed") == []
    assert fake.of("active")[0].at < fake.of("abort")[0].at


async def test_replayed_events_the_stream_brings_again_are_not_counted_twice() -> None:
    history = reads_1_18(1, 3, 1)
    fake = FakeOpencode(
        generation=3,
        # The second stream starts with call 3 again, already replayed from the history.
        streams=[play(frames(*history[:6]), then="end"), play(frames(*history[6:]))],
        history={S: history},
    )
    with capture_logs() as logs:
        running = await start(fake, api="2")
        await wait_for(lambda: len(events(logs, "stream.resynced")) == 2)
        # A positive sign that the second stream's frames were read: its frame count.
        await wait_for(lambda: running[1].status()["stream"]["frames"] >= 4)  # type: ignore[index]
        await stop(*running)
    assert events(logs, "loop.detected") == []  # three calls, not four
    assert fake.of("interrupt") == []


def permission(kind: str, n: int, data: dict[str, Any]) -> dict[str, Any]:
    return engine_event(f"permission.{kind}", S, data, directory="/w")


def asking_call(
    n: int, seq: int, answered: bool = True, release: str = "2.2.5"
) -> list[dict[str, Any]]:
    """A read that asks permission once it is called (as `"*": "ask"` makes every call do):
    answered `once` by someone, then run; or left waiting for an answer. As `release` sends
    them (2.2.5 names the call at `source.id`, 1.18.33 at `source.callID`)."""
    started, called, success = engine_call(S, n, "read", READ, seq, "/w", release=release)
    key = "callID" if release == "1.18.33" else "id"
    request = {
        "id": f"per_{n}",
        "action": "read",
        "resources": ["README.md"],
        "source": {"type": "tool", "messageID": f"msg_{n}", key: f"call_{n}"},
    }
    asked = permission("asked", n, request)
    if not answered:
        return [started, called, asked]
    replied = permission("replied", n, {"requestID": f"per_{n}", "reply": "once"})
    return [started, called, asked, replied, success]


@pytest.mark.parametrize(
    ("generation", "release", "key"), [(2, "2.2.5", "decision"), (3, "1.18.33", "reply")]
)
async def test_a_permission_reply_takes_the_servers_own_body_the_first_time(
    generation: int, release: str, key: str
) -> None:
    # Calls 1-3 ask and are let run; the 4th, the loop's, is refused before it runs. Each
    # server refuses the other's body with a 400: one reply, taken.
    stream = [e for n in range(1, 4) for e in asking_call(n, 3 * n - 2, release=release)]
    stream += asking_call(4, 10, answered=False, release=release)
    fake = FakeOpencode(generation=generation, streams=[play(frames(*stream))])
    with capture_logs() as logs:
        running = await start(fake, api="2")
        await wait_for(lambda: events(logs, "intervention.outcome"))
        await stop(*running)
    [reply] = fake.of("reply")
    assert reply.path == f"/api/session/{S}/permission/per_4/reply"
    assert isinstance(reply.body, dict) and set(reply.body) == {key, "message"}
    assert reply.body[key] == "reject" and reply.body["message"].startswith(MARK)
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["outcome"], outcome["channel"]) == ("rejected", "permission")
    assert fake.of("interrupt") == []  # refused before it ran: the run goes on


async def test_a_server_upgraded_in_place_is_read_by_its_new_api() -> None:
    # A 1.x server (its stream stays open, quiet) restarts as 2.0 on the same port.
    old = FakeOpencode()
    old.streams = [old.live]
    new = FakeOpencode(generation=2, streams=[play(frames(*reads(1, 4, 1)))])
    with capture_logs() as logs:
        server, watch, task = await start(old)
        await wait_for(lambda: old.live_connected.is_set())
        port = server.port
        old.close()
        await server.close()
        server = TestServer(new.app(), host="127.0.0.1", port=port)
        await server.start_server()
        await wait_for(lambda: new.of("prompt"))
        await stop(server, watch, task)
    first, second = events(logs, "server.detected")
    assert (first["classic"], first["changed"]) == (True, False)
    assert first["stream"].endswith("/global/event")
    assert (second["classic"], second["engine"], second["changed"]) == (False, True, True)
    assert new.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    assert watch.status()["stream"]["server"] == "opencode 2.2.5: 2.x API"


async def test_a_1_x_stand_in_is_still_read_on_global_event() -> None:
    # Health routes unknown (404): a 1.x server, as before 2.x was known.
    fake = FakeOpencode()
    fake.streams = [fake.live]
    running = await start(fake)
    await wait_for(lambda: fake.live_connected.is_set())
    await stop(*running)
    paths = [r.path for r in fake.requests[:4]]
    assert paths == ["/api/info", "/global/health", "/api/health", "/global/event"]


async def test_a_pending_request_of_a_2_0_server_is_read_back() -> None:
    # Asked while the monitor was away: the stream does not replay it, the read-back does,
    # and the request is typed like one the stream brought (answered under `--permissions`).
    request = {
        "id": "per_9",
        "sessionID": S,
        "action": "read",
        "resources": ["README.md"],
        "source": {"type": "tool", "messageID": "msg_9", "id": "call_9"},
    }
    fake = FakeOpencode(generation=2, permissions=[request])
    fake.streams = [fake.live]
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: events(logs, "stream.resynced"))
        await stop(*running)
    assert [r.path for r in fake.requests if "permission" in r.path] == ["/api/permission/request"]
    assert events(logs, "stream.resynced")[0]["pending_permissions"] == 1
    assert events(logs, "frame.malformed") == []


async def test_a_run_that_ended_before_the_outage_is_not_replayed() -> None:
    # Two calls and the step that ends the run; then the stream ends. The session is neither
    # running nor busy: like a classic one, nothing is read back for it.
    ended = engine_event(
        "session.step.ended", S, {"assistantMessageID": "msg_9", "finish": "stop"}, 7, "/w"
    )
    fake = FakeOpencode(
        generation=3,
        streams=[play(frames(*reads_1_18(1, 2, 1), ended), then="end")],
        history={S: reads_1_18(1, 2, 1)},
    )
    with capture_logs() as logs:
        running = await start(fake, api="2")
        await wait_for(lambda: len(events(logs, "stream.resynced")) == 2)
        await stop(*running)
    assert fake.of("history") == []
    assert events(logs, "stream.resynced")[1]["replayed"] == 0


async def test_two_monitors_of_a_new_engine_server_give_one_intervention_per_loop(
    tmp_path: Path,
) -> None:
    # Issue 33: two monitors of one new-engine server, one loop: one interrupt, one feedback.
    # The second is the first's standby (the role is the same on either engine).
    fake = FakeOpencode(generation=2)
    fake.streams = [fake.live, fake.live]
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    with capture_logs() as logs:
        first, first_task = watching(server, roles=tmp_path)
        await wait_for(lambda: events(logs, "monitor.acting"))
        second, second_task = watching(server, roles=tmp_path)
        await wait_for(lambda: events(logs, "monitor.standby"))
        await wait_for(lambda: len(events(logs, "stream.resynced")) == 2)
        await fake.push(frames(*reads(1, 4, 1)))
        await wait_for(lambda: len(events(logs, "intervention.outcome")) == 2)
        await wait_for(lambda: events(logs, "feedback.sent"))
        for watch, task in ((second, second_task), (first, first_task)):
            watch.stop()
            assert await asyncio.wait_for(task, 5) == 0
    await server.close()
    outcomes = sorted(o["outcome"] for o in events(logs, "intervention.outcome"))
    assert outcomes == ["aborted", "standby"]
    assert fake.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    assert len(events(logs, "feedback.sent")) == 1


async def test_a_shell_call_that_never_ends_is_interrupted_past_its_bound() -> None:
    # Issue 33: the new engine sends nothing while a shell call runs (no progress with its
    # output, as 1.x re-sends `running`), so only the time bound started at `tool.called`
    # can catch a `while true` there.
    forever = {"command": "while true; do echo y; done"}
    started = engine_call(S, 1, "shell", forever, 1, "/w")[:2]
    # 2.2.5 replays nothing: each connect reads the busy session's record, where it runs.
    running_call = {"type": "tool", "id": "call_1", "name": "shell"}
    running_call["state"] = {"status": "running", "input": forever}
    record = [*engine_record(0), {"id": "msg_1", "type": "assistant", "content": [running_call]}]
    fake = FakeOpencode(
        generation=2, streams=[play(frames(*started))], busy={S: {}}, messages={S: record}
    )
    with capture_logs() as logs:
        running = await start(fake, call_seconds=1)
        await wait_for(lambda: fake.of("prompt"))
        await stop(*running)
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["rule"], outcome["part_id"], outcome["outcome"]) == (
        "runaway",
        "msg_1:call_1",
        "aborted",
    )
    assert fake.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    # Named as 2.x names it to the model: its shell, which every rule knows as bash.
    assert "one shell call was still running after 1 s" in fake.of("prompt")[0].body["text"]
