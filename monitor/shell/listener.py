"""Connection limits for the daemon's own HTTP servers (metrics and the plugin endpoint).

Both share the event loop and the file limit with detection: whoever can reach them must not
be able to take either. At most `max_connections` are open at once. A connection over the cap
closes the oldest one that is neither `trusted` (it had a request answered that the server
marked so: a plugin's, with the right token) nor busy (made this turn, a request head read
and not yet answered, or bytes sent that the loop has not read yet), so a flood of
connections that never finish a request pushes out its own, not the plugin's, even the
plugin's new connection that has sent its request while the flood's were being accepted;
with none to close, the new one is reset at once, so a flood costs one descriptor each only
for an instant. aiohttp's keep-alive timer runs from a connection's start and from the end of
each answer, and a request head arriving in pieces does not restart it, so `idle_s` bounds
both an idle connection and a head sent slowly; with `lifetime_s`, no connection lives
longer, however slowly it trickles a request in. The loop accepts BACKLOG connections a turn;
the kernel queues QUEUE more, which hold no descriptor of ours.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["BACKLOG", "Limits", "Listening", "listen_tcp", "listen_unix", "trust"]

# How many connections asyncio accepts a turn (its `backlog`). Each accepted one is a
# descriptor before the cap can close one, and each one closed for it is a descriptor until
# the next turn: a flood holds the cap plus about two batches. With 64 a slowloris against 256
# descriptors ran out of them, and asyncio stops accepting for a second each time (plugin
# calls: 13 of 300 failed, 28 took over 1.5 s); with 32, none failed (docs/performance.md).
BACKLOG = 32
# The kernel's queue of connections not yet accepted (listen(2), after asyncio set it to
# BACKLOG): they hold no descriptor of ours. A queue as short as the batch fills in a flood's
# burst and drops the plugin's handshake, retried after 1 s (10-14 of 300 calls over 0.5 s);
# with 256, none. Linux caps it at net.core.somaxconn (4,096 since 5.4, 128 before).
QUEUE = 256
# A connection waits this long at most for asyncio to give it its transport (the next turn):
# one that never gets it (its transport failed to be made) is not kept from the cap for ever.
NEW_S = 1.0
_INT = bytes(4)  # FIONREAD's answer, a C int


@dataclass(frozen=True, slots=True)
class Limits:
    """What a server lets one client hold; `refused` is called for each connection reset."""

    max_connections: int
    idle_s: float
    max_line: int
    refused: Callable[[], None]
    lifetime_s: float | None = None


class _Handler(RequestHandler):
    """aiohttp's connection handler, counted by its listener and closed at its deadline."""

    def __init__(self, listener: Listener) -> None:
        limits = listener.limits
        super().__init__(
            listener.server,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=limits.idle_s,
            max_line_size=limits.max_line,
            max_field_size=limits.max_line,
            # A request answered before its body was read (refused, or its body too slow) is
            # closed at once, not read on for aiohttp's 10 s.
            lingering_time=0,
            # No access log (a request every few seconds would drown the monitor's own lines);
            # aiohttp takes None here though its hint says Logger.
            access_log=None,  # type: ignore[arg-type]
        )
        self._listener = listener
        self._deadline: asyncio.TimerHandle | None = None
        self._answered = 0
        self._made = self._loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        lifetime = self._listener.limits.lifetime_s
        if lifetime is not None:
            self._deadline = asyncio.get_running_loop().call_later(lifetime, self.force_close)

    def trust(self) -> None:
        self._listener.untrusted.pop(self, None)

    def log_access(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        # aiohttp calls it after each answer, with its access log or without.
        self._answered += 1
        super().log_access(request, response, time)

    def busy(self) -> bool:
        """Whether closing it now could drop a request: made this turn (not yet given its
        transport, so not yet read, and a close now would not reach its socket), a head read
        and not yet answered (aiohttp counts the heads it parsed), or bytes waiting that the
        loop has not read."""
        if self.transport is None:
            return self._loop.time() - self._made < NEW_S
        if self._request_count > self._answered:
            return True
        try:
            unread = fcntl.ioctl(self.transport.get_extra_info("socket"), termios.FIONREAD, _INT)
        except OSError:  # closed under us: nothing to drop
            return False
        return int.from_bytes(unread, sys.byteorder) > 0

    def connection_lost(self, exc: BaseException | None) -> None:
        self._listener.closed(self)
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)


class _Reset(asyncio.Protocol):
    """A connection over the cap: reset at once, so it holds no descriptor."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


class Listener:
    """The listening socket's protocol factory: aiohttp's handler, up to the cap."""

    def __init__(self, server: web.Server, limits: Limits) -> None:
        self.server = server
        self.limits = limits
        # The connections counted against the cap; the untrusted ones, oldest first.
        self.open: set[_Handler] = set()
        self.untrusted: dict[_Handler, None] = {}

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self.open) >= self.limits.max_connections:
            self.limits.refused()
            oldest = next((handler for handler in self.untrusted if not handler.busy()), None)
            if oldest is None:
                return _Reset()
            self.closed(oldest)  # its slot is the new one's now, not after its close completes
            oldest.force_close()
        handler = _Handler(self)
        self.open.add(handler)
        self.untrusted[handler] = None
        return handler

    def closed(self, handler: _Handler) -> None:
        self.open.discard(handler)
        self.untrusted.pop(handler, None)


def trust(request: web.BaseRequest) -> None:
    """Keep `request`'s connection when the cap is reached: it made a request worth answering."""
    handler = request.protocol
    if isinstance(handler, _Handler):
        handler.trust()


@dataclass(frozen=True, slots=True)
class Listening:
    """A listening socket and its connections."""

    server: asyncio.Server
    listener: Listener

    def close(self) -> None:
        """Stop accepting and close every connection now: a client that keeps sending
        requests (a flood) would otherwise hold aiohttp's graceful shutdown for a minute,
        past the 5 s a SIGTERM has. Then the runner's cleanup finds nothing to wait for."""
        self.server.close()
        for handler in list(self.listener.open):
            handler.force_close()


async def listen_tcp(runner: web.AppRunner, limits: Limits, host: str, port: int) -> Listening:
    """Serve `runner`'s application on `host:port` under `limits`; raises OSError."""
    assert runner.server is not None
    listener = Listener(runner.server, limits)
    server = await asyncio.get_running_loop().create_server(
        listener, host, port, backlog=BACKLOG, reuse_address=True
    )
    _queue(server)
    return Listening(server, listener)


async def listen_unix(runner: web.AppRunner, limits: Limits, path: Path) -> Listening:
    """Serve `runner`'s application on a Unix socket only its owner can open; raises OSError."""
    assert runner.server is not None
    listener = Listener(runner.server, limits)
    # Created 0600 from the start: a chmod after bind leaves a moment open to others.
    old = os.umask(0o177)
    try:
        server = await asyncio.get_running_loop().create_unix_server(
            listener, str(path), backlog=BACKLOG
        )
    finally:
        os.umask(old)
    _queue(server)
    return Listening(server, listener)


def _queue(server: asyncio.Server) -> None:
    for listening in server.sockets:
        with listening.dup() as sock:  # a second descriptor of the same socket
            sock.listen(QUEUE)
