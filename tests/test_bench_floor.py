"""The latency floor (`bench.floor`) acts on the frame the monitor acts on, with its request.

Run as the benchmarks run it, in a process of its own against the stand-in; nothing is timed.
"""

import json

from bench import latency, permissions
from bench.harness import arrivals, watched
from monitor.kit.poll import until
from monitor.testing import FakeOpencode


async def test_the_floor_aborts_each_loop_once_at_the_completing_frame():
    server = FakeOpencode()
    async with watched(server, floor="abort"):
        session, before, at, after = latency.loop_frames(0)
        await server.push(before)
        await server.push(latency.loop_frames(1)[1])  # another session's 3 calls only
        await server.push(at + after)
        await until(lambda: server.of("abort"), 10, what="the abort")
    aborts = arrivals(server, "abort")
    assert list(aborts) == [session]
    assert len(aborts[session]) == 1
    completing = json.loads(at.decode().removeprefix("data: "))
    assert aborts[session][0].query == {"directory": completing["directory"]}
    assert server.of("message") == []


async def test_the_read_variant_reads_the_newest_messages_first():
    server = FakeOpencode()
    async with watched(server, floor="abort-read"):
        session, before, at, after = latency.loop_frames(0)
        await server.push(before + at + after)
        await until(lambda: server.of("abort"), 10, what="the abort")
    read, abort = (r for r in server.requests if r.session_id == session)
    assert (read.method, read.path) == ("GET", f"/session/{session}/message")
    assert read.query == {**abort.query, "limit": "20"}


async def test_the_floor_approves_calls_one_to_three_and_rejects_the_fourth():
    server = FakeOpencode()
    async with watched(server, floor="refuse"):
        await permissions.play(server, 1, 0)
        await until(lambda: len(server.of("reply")) == 4, 10, what="four replies")
    replies = arrivals(server, "reply")
    assert [replies[permissions.request_id(0, call)][0].body["reply"] for call in range(4)] == [
        "once",
        "once",
        "once",
        "reject",
    ]
    assert replies[permissions.request_id(0, 3)][0].query == {"directory": permissions.DIRECTORY}
