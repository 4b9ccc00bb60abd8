"""Which connection the cap closes (monitor.shell.listener), on loopback sockets this test
opens itself. A connection made without yielding to the loop waits in the kernel; the loop
accepts up to BATCH of the waiting ones in one turn (asyncio's `backlog`), makes each one's
handler in the next, gives it its transport in the one after and reads it in the next again:
the turns in which a flood meets the plugin's fresh connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from monitor.shell.listener import (
    NEW_S,
    QUEUE,
    Limits,
    Listener,
    Listening,
    _Handler,
    _Reset,
    listen_tcp,
)

CAP = 4
BATCH = 8  # the kernel queues one more: a connection made past that waits a second
REQUEST = b"GET /%s HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass
class Served:
    listening: Listening
    port: int
    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    refused: int = 0
    sockets: list[socket.socket] = field(default_factory=list)

    def connect(self, request: bytes = b"") -> socket.socket:
        """A connection, its request sent, without yielding to the loop."""
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(request)
        sock.setblocking(False)
        self.sockets.append(sock)
        return sock

    async def until(self, ready: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not ready():
                await asyncio.sleep(0.001)


@asynccontextmanager
async def served() -> AsyncIterator[Served]:
    async def slow(request: web.Request) -> web.Response:
        box.started.set()
        await box.release.wait()
        return web.Response(text="slow")

    async def quick(request: web.Request) -> web.Response:
        return web.Response(text="quick")

    def refused() -> None:
        box.refused += 1

    app = web.Application()
    app.router.add_get("/slow", slow)
    app.router.add_get("/quick", quick)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    listener = Listener(runner.server, Limits(CAP, 5.0, 8190, refused))
    server = await asyncio.get_running_loop().create_server(listener, "127.0.0.1", 0, backlog=BATCH)
    listening = Listening(server, listener)
    box = Served(listening, listening.server.sockets[0].getsockname()[1])
    try:
        yield box
    finally:
        for sock in box.sockets:
            sock.close()
        box.release.set()
        listening.close()
        await runner.cleanup()


async def answer(sock: socket.socket) -> bytes:
    """The first bytes the server sends back; b"" when it closed the connection unanswered."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        try:
            return await loop.sock_recv(sock, 1024)
        except ConnectionResetError:
            return b""


async def test_a_connection_made_this_turn_is_not_closed_to_make_room() -> None:
    async with served() as box:
        idle = [box.connect() for _ in range(CAP)]
        await box.until(lambda: len(box.listening.listener.open) == CAP)
        # The plugin's connection among a burst of the flood's, all made in one turn: each
        # closes an idle one, and the last finds none left that the loop has had a chance
        # to read, the plugin's the oldest of them.
        plugin = box.connect(REQUEST % b"quick")
        burst = [box.connect() for _ in range(CAP)]
        reply = await answer(plugin)
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply
        assert box.refused == CAP + 1
        # Closed instead: every idle one, and the burst's last is reset.
        assert [await answer(sock) for sock in [*idle, burst[-1]]] == [b""] * (CAP + 1)
        assert len(box.listening.listener.open) == CAP


async def test_a_request_sent_and_not_yet_read_is_not_closed_to_make_room() -> None:
    async with served() as box:
        idle = [box.connect() for _ in range(CAP)]
        await box.until(lambda: len(box.listening.listener.open) == CAP)
        # A batch with the plugin's first: it and three of the flood's close the idle ones,
        # the rest are reset; one more, accepted the turn after, meets the plugin's with its
        # transport and its request not yet read.
        plugin = box.connect(REQUEST % b"quick")
        batch = [box.connect() for _ in range(BATCH - 1)]
        box.connect()
        reply = await answer(plugin)
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply
        assert box.refused == BATCH + 1
        assert await answer(batch[0]) == b""  # closed for the late one
        assert [await answer(sock) for sock in idle] == [b""] * CAP


async def test_a_request_being_answered_is_not_closed_to_make_room() -> None:
    async with served() as box:
        plugin = box.connect(REQUEST % b"slow")
        await box.started.wait()
        idle = [box.connect() for _ in range(CAP - 1)]
        await box.until(lambda: len(box.listening.listener.open) == CAP)
        box.connect()
        await box.until(lambda: box.refused == 1)
        box.release.set()
        reply = await answer(plugin)
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply
        assert await answer(idle[0]) == b""


async def test_an_answered_connection_can_be_closed_to_make_room_again() -> None:
    # Not trusted (the metrics port trusts none): kept alive after its answer, it is only
    # protected while its request lasts.
    async with served() as box:
        asked = box.connect(REQUEST % b"quick")
        assert (await answer(asked)).startswith(b"HTTP/1.1 200 OK")
        [box.connect() for _ in range(CAP - 1)]
        await box.until(lambda: len(box.listening.listener.open) == CAP)
        box.connect()
        await box.until(lambda: box.refused == 1)
        assert await answer(asked) == b""


async def test_a_connection_never_given_its_transport_makes_room_after_a_while() -> None:
    # asyncio makes the handler, then its transport; when that fails, the handler is never
    # told of a connection and would hold its place under the cap for ever.
    async with served() as box:
        listener = box.listening.listener
        stranded = [listener() for _ in range(CAP)]
        assert isinstance(listener(), _Reset)  # all made this turn: kept
        first = stranded[0]
        assert isinstance(first, _Handler)
        first._made -= NEW_S
        newcomer = listener()
        assert isinstance(newcomer, _Handler) and first not in listener.open
        assert box.refused == 2


async def test_the_kernel_queues_connections_the_loop_has_not_accepted_yet() -> None:
    runner = web.AppRunner(web.Application(), handle_signals=False)
    await runner.setup()
    listening = await listen_tcp(runner, Limits(CAP, 5.0, 8190, lambda: None), "127.0.0.1", 0)
    port = listening.server.sockets[0].getsockname()[1]
    waiting: list[socket.socket] = []
    try:
        # Made without yielding to the loop, so none is accepted: past the queue a connection
        # waits for its handshake's retry, a second, and the timeout ends it.
        for _ in range(QUEUE // 2):
            waiting.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
        assert len(waiting) == QUEUE // 2
    finally:
        for sock in waiting:
            sock.close()
        listening.close()
        await runner.cleanup()
