"""`attach` against a stand-in of OpenCode 2.2.5 (`FakeOpencode(generation=2)`).

2.x has only the `/api` routes: the session is looked up at `GET /api/session/{id}` (its
directory under `location`), its record read at `/api/session/{id}/message` (and its inbox),
its loop stopped through `/api`, and the watch ends with status 0 when the session is deleted.
The real 2.2.5 is attached to in tests/test_real_v2_life.py, a new-engine session of the real
1.18.33 in tests/test_real_engine.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.core.feedback import MARK
from monitor.core.server import engine_of_session
from monitor.exits import EX_NOINPUT, EX_UNAVAILABLE
from monitor.kit.sandbox import free_loopback_port
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.attach import attach
from monitor.testing import FakeOpencode, engine_call, engine_event, frames, play
from tests.frames_factory import engine_record
from tests.harness import FAST, wait_for

S = "ses_s1"
WHERE = "/w"
READ = {"path": "README.md"}
SESSION = {"id": S, "projectID": "prj", "title": "looping", "location": {"directory": WHERE}}


def reads(first: int, last: int) -> list[dict[str, Any]]:
    """Calls `first` to `last` as the stream brings them, each call's seq where it would be."""
    events = []
    for n in range(first, last + 1):
        events += engine_call(S, n, "read", READ, 1 + 3 * (n - 1), WHERE)
    return events


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [log for log in logs if log["event"] == name]


async def attaching(
    fake: FakeOpencode, session_id: str = S
) -> tuple[TestServer, asyncio.Task[int]]:
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    settings = load_settings({"url": str(server.make_url("")).rstrip("/")}, {}, isatty=False)
    return server, asyncio.create_task(attach(settings, session_id, timing=FAST))


async def test_attached_to_a_2_0_session_mid_run_it_stops_the_loop_and_ends_with_it() -> None:
    fake = FakeOpencode(
        generation=2, sessions=[SESSION], messages={S: engine_record(2)}, busy={S: {}}
    )
    fake.streams = [fake.live]
    with capture_logs() as logs:
        server, task = await attaching(fake)
        try:
            await wait_for(lambda: events(logs, "stream.resynced"))
            await fake.push(frames(*reads(3, 4)))
            await wait_for(lambda: fake.of("prompt"))
            await fake.push(frames(engine_event("session.deleted", S, seq=13, directory=WHERE)))
            code = await asyncio.wait_for(task, 5)
        finally:
            await server.close()
    assert code == 0
    # Looked up by 2.0's routes: which server, the session, its record (another monitor's
    # feedback?); then the watch: which server, the stream, the session still there, busy
    # sessions, its current run read back.
    paths = [r.path for r in fake.requests]
    assert paths[:15] == [
        "/api/info",
        "/global/health",
        "/api/health",
        f"/api/session/{S}",
        f"/api/session/{S}/message",
        f"/api/session/{S}/inbox",  # a feedback not taken by a run waits there
        "/api/info",
        "/global/health",
        "/api/health",
        "/api/event",
        f"/api/session/{S}",
        "/api/session/active",
        f"/api/session/{S}/message",
        f"/api/session/{S}/inbox",
        "/api/permission/request",
    ]
    [found] = events(logs, "attach.found")
    assert (found["directory"], found["engine"]) == (WHERE, 2)
    assert fake.requests[9].query == {"location[directory]": WHERE}
    [seeded] = events(logs, "session.seeded")
    assert (seeded["calls"], seeded["loop"]) == (2, False)
    # Two calls read back, two live: the 4th identical read is the loop, stopped once by
    # 2.0's routes, the feedback as a new turn.
    [loop] = events(logs, "loop.detected")
    assert (loop["session_id"], loop["part_id"], loop["call_index"]) == (S, "msg_4:call_4", 4)
    assert fake.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    [prompt] = fake.of("prompt")
    assert isinstance(prompt.body, dict) and prompt.body["text"].startswith(MARK)
    assert [e["session_id"] for e in events(logs, "attach.session_deleted")] == [S]


async def test_a_2_0_session_deleted_while_the_stream_was_down_ends_the_attach() -> None:
    fake = FakeOpencode(generation=2, sessions=[SESSION])
    fake.streams = [fake.live, play()]
    with capture_logs() as logs:
        server, task = await attaching(fake)
        try:
            await wait_for(lambda: events(logs, "stream.resynced"))
            fake.sessions.clear()  # deleted, and the stream down: nobody sees it go
            fake.close()
            code = await asyncio.wait_for(task, 5)
        finally:
            await server.close()
    assert code == 0
    # Asked at the look-up, then at each connect: found, found, then gone (404).
    looked_up = [r for r in fake.requests if r.path == f"/api/session/{S}"]
    assert len(looked_up) == 3 and fake.connections == 2
    assert [e["session_id"] for e in events(logs, "attach.session_deleted")] == [S]
    assert fake.actions() == []


async def test_a_session_a_2_0_server_does_not_have_exits_66(capsys: Any) -> None:
    fake = FakeOpencode(generation=2, sessions=[SESSION])
    missing = "ses_0000000000000000000000000"
    server, task = await attaching(fake, missing)
    try:
        code = await asyncio.wait_for(task, 5)
    finally:
        await server.close()
    assert code == EX_NOINPUT
    assert [r.path for r in fake.requests] == [
        "/api/info",
        "/global/health",
        "/api/health",
        f"/api/session/{missing}",
    ]
    assert capsys.readouterr().err.startswith(f"opencode-loop-monitor: session {missing} not found")


async def test_an_id_of_another_shape_is_not_found_and_never_sent(capsys: Any) -> None:
    # Issue 30: no 404 came, so it is a MalformedId, not SessionGone; said as "not found".
    fake = FakeOpencode(generation=2, sessions=[SESSION])
    server, task = await attaching(fake, "ses_../../global/dispose")
    url = str(server.make_url("")).rstrip("/")
    try:
        code = await asyncio.wait_for(task, 5)
    finally:
        await server.close()
    assert code == EX_NOINPUT and fake.requests == []
    assert capsys.readouterr().err == (
        f"opencode-loop-monitor: session ses_../../global/dispose not found on {url}\n"
    )


async def test_a_port_nothing_listens_on_is_said_in_plain_words(capsys: Any) -> None:
    # Issue 32: `attach` printed `cannot look up session ...: ClientConnectorError` where
    # `watch` says what a wrong port means; now the same sentence.
    port = free_loopback_port()
    settings = load_settings({"url": f"http://127.0.0.1:{port}"}, {}, isatty=False)
    code = await asyncio.wait_for(attach(settings, S, timing=FAST), 10)
    assert code == EX_UNAVAILABLE
    assert capsys.readouterr().err == (
        f"opencode-loop-monitor: cannot look up session {S}: nothing accepts connections on "
        f"127.0.0.1:{port}: start `opencode serve --port {port}` there, or give --url the "
        "address `opencode serve` printed when it started (with OpenCode 2, run `opencode "
        "service start` and give no --url: its service is found)\n"
    )


async def test_on_1_18_33_a_sessions_engine_is_told_by_its_messages_on_the_api_route() -> None:
    # 1.18.33 answers a session of either engine on both look-up routes: the shell reads
    # whether it has messages where the core says they tell, and the core names the engine.
    other = "ses_s2"
    fake = FakeOpencode(generation=3, messages={S: engine_record(2)})
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            api = EngineAPI(http, str(server.make_url("")).rstrip("/"), FAST.retry, FAST.sleep)
            kind = await api.detect()
            told = [await api.has_messages(s, WHERE, kind.telling_routes()) for s in (S, other)]
    finally:
        await server.close()
    assert (kind.routes(), told) == ((1, 2), [{2: True}, {2: False}])
    assert [engine_of_session(kind, seen) for seen in told] == [2, 1]
    assert [r.path for r in fake.requests] == [
        "/api/info",
        "/global/health",
        "/api/health",
        f"/api/session/{S}/message",
        f"/api/session/{other}/message",
    ]
    assert fake.requests[3].query == {"location[directory]": WHERE, "order": "desc", "limit": "1"}


async def test_a_look_up_whose_api_read_is_slow_goes_on_as_not_told() -> None:
    # Issue 56: at a load of 8 a real 1.18.33 answered `/api/session/{id}/message` after
    # more than API_READ_S, and attach exited 69. Slow is not down: the route did not tell
    # the engine, the session's frames will.
    held = asyncio.Event()
    fake = FakeOpencode(generation=3, holds={"message": held}, messages={S: engine_record(2)})
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            api = EngineAPI(http, str(server.make_url("")).rstrip("/"), FAST.retry, FAST.sleep)
            api.api_read_s = 0.2
            kind = await api.detect()
            told = await api.has_messages(S, WHERE, kind.telling_routes())
    finally:
        held.set()
        await server.close()
    assert told == {2: None} and engine_of_session(kind, told) == 1
    assert [r.path for r in fake.requests][-1] == f"/api/session/{S}/message"
