"""Following the server's event stream for as long as the monitor runs.

aiohttp-sse-client parses the stream; around it sits our own reconnect loop, because the
library reconnects only after a clean end (and then without telling us, so we could not
resync), while an error in mid-read reaches the caller. The session's read timeout, keyed to
the server's 10 s heartbeat, is what notices a stream that never sends headers or goes silent
without a FIN.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

import aiohttp
import structlog
from aiohttp_sse_client.client import READY_STATE_CONNECTING, EventSource

from monitor.backoff import Backoff
from monitor.errors import ConfigError

log = structlog.get_logger("monitor.stream")

HEARTBEAT_S = 10.0
READ_TIMEOUT_S = 2.5 * HEARTBEAT_S
CONNECT_TIMEOUT_S = 10.0
# Lines longer than twice this make aiohttp give up on the stream; a tool part carries the
# whole output of the call, which can be a large file.
READ_BUFSIZE = 8 * 1024 * 1024


def stream_timeout(read: float = READ_TIMEOUT_S) -> aiohttp.ClientTimeout:
    """No total limit (a stream lasts for ever); a connect limit; a read limit per chunk."""
    return aiohttp.ClientTimeout(
        total=None, connect=CONNECT_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S, sock_read=read
    )


def stream_url(base_url: str, directory: str | None) -> str:
    base = base_url.rstrip("/")
    if directory is None:
        return f"{base}/global/event"
    return f"{base}/event?{urlencode({'directory': directory})}"


class _StreamEnded(Exception):
    """The server ended the response cleanly."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _StreamEnded):
        return "stream ended"
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return "read timeout"
    # Only the exception type and aiohttp's own text: never frame content.
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError):
        return str(exc)  # aiohttp-sse-client's own: "fetch URL failed: 500", no frame content
    return type(exc).__name__


class EventStream:
    """Reads frames from `url` until cancelled, reconnecting with backoff."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        on_frame: Callable[[str], None],
        on_connect: Callable[[], Awaitable[None]],
        on_disconnect: Callable[[str], None] = lambda reason: None,
        backoff: Backoff = Backoff(),
        read_timeout: float = READ_TIMEOUT_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._http = http
        self.url = url
        self._on_frame = on_frame
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._backoff = backoff
        self._timeout = stream_timeout(read_timeout)
        self._sleep = sleep
        self.connected = False
        self.reconnects = 0
        self.frames = 0

    async def run(self) -> None:
        """Read for ever; returns only by cancellation, raises only ConfigError (401)."""
        failures = 0
        while True:
            frames_before = self.frames
            try:
                await self._read_once()
                reason = "stream ended"
            except ConfigError:
                raise
            except Exception as exc:  # any failure of one connection means: reconnect
                reason = _reason(exc)
            finally:
                self.connected = False
            # A connection that delivered frames was healthy: start the backoff over.
            failures = 0 if self.frames > frames_before else failures + 1
            delay = self._backoff.delay(max(failures - 1, 0))
            log.warning("stream.disconnected", reason=reason, retry_in_s=round(delay, 2))
            self._on_disconnect(reason)
            await self._sleep(delay)
            self.reconnects += 1

    async def _read_once(self) -> None:
        holder: list[EventSource] = []

        def on_error() -> None:
            # The library is about to reconnect by itself after a clean end; stop it so our
            # loop reconnects and resyncs instead.
            if holder and holder[0].ready_state == READY_STATE_CONNECTING:
                raise _StreamEnded

        source = EventSource(
            self.url,
            session=self._http,
            max_connect_retry=0,
            on_error=on_error,
            timeout=self._timeout,
        )
        holder.append(source)
        try:
            async with source:
                self.connected = True
                log.info("stream.connected", url=self.url)
                await self._on_connect()
                async for event in source:
                    self.frames += 1
                    self._on_frame(event.data)
        except _StreamEnded:
            pass
        except ConnectionRefusedError as exc:
            # aiohttp-sse-client signals 401/407 this way (aiohttp's own connection errors
            # are ClientError subclasses).
            if isinstance(exc, aiohttp.ClientError):
                raise
            raise ConfigError("the server refused our credentials (401)") from None
