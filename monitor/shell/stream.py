"""Following the server's event stream for as long as the monitor runs.

aiohttp reads the response; `SSEChunkDecoder` (monitor/core/frames.py) splits its bytes into
events. Around them sits our reconnect loop: an outage is logged as a change of state, once when
the stream goes down and once when it is back (with the time down and the attempts), and
the next connection resyncs. The session's read timeout, keyed to the
server's 10 s heartbeat, is what notices a stream that never sends headers or goes silent
without a FIN.

Bytes are no proof of life: a proxy or a broken server can keep a connection busy with `:`
comments. So the read limit is also kept on frames: a connection that brings no frame (the
server's heartbeat is one: 1.x's event, or 2.x's `: heartbeat` comment every 15 s, which the
decoder hands on as that event) for the read limit is dropped as `no frame`. And the resync that
runs at each connect does not stop the reading: frames that come meanwhile are read off the
socket and handed on at once; the watch holds those of the sessions the resync rebuilds
(`monitor.core.resync.Waiting`) and feeds the others, so a stop goes ahead of bulk reads.

The stream is decoded in whatever chunks have arrived rather than line by line: at tens of
thousands of frames a second, a coroutine round trip per line cost more than decoding the
JSON (docs/performance.md has the profile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

import aiohttp
import structlog

from monitor.config import public_url
from monitor.core.frames import SSEChunkDecoder
from monitor.errors import ConfigError
from monitor.shell.backoff import Backoff
from monitor.shell.diagnosis import (
    Diagnosis,
    diagnose_error,
    diagnose_status,
    refused_credentials,
)

__all__ = [
    "CONNECTION_LOST",
    "EventStream",
    "READ_BUFSIZE",
    "READ_TIMEOUT_S",
    "RECONNECT",
    "stream_timeout",
    "stream_url",
]

log = structlog.get_logger("monitor.shell.stream")

# The `stream.diagnosis` problem of a 401 (or 407) after the stream has worked.
CREDENTIALS_REFUSED = "credentials_refused"
HEARTBEAT_S = 10.0
READ_TIMEOUT_S = 2.5 * HEARTBEAT_S
CONNECT_TIMEOUT_S = 10.0
# A server that is up answers a stream request at once; one still starting may take the
# connection and hold it. Without this limit the reconnect after a server's restart waited
# out the whole read limit before it tried again.
HEADERS_TIMEOUT_S = 10.0
# Between reconnects: at most 2 s, so a server that comes back after any outage is noticed
# within 2 s (plus the connect). A refused connect to a local port costs next to nothing, so
# the backoff only keeps a flapping server from being hammered, it need not grow further.
RECONNECT = Backoff(initial=0.5, factor=2.0, cap=2.0)
# How far aiohttp may read ahead of us (it buffers up to twice this); a tool part carries the
# whole output of the call, which can be a large file.
READ_BUFSIZE = 8 * 1024 * 1024
# What the decoder takes at a time. aiohttp hands over all it has buffered when asked for
# "any": megabytes behind a burst, split and decoded in one go before the first frame is read,
# out of cache by then. Pieces this size stay in cache from the read to the tracker.
READ_CHUNK = 64 * 1024


def stream_timeout(read: float = READ_TIMEOUT_S) -> aiohttp.ClientTimeout:
    """No total limit (a stream lasts for ever); a connect limit; a read limit per chunk."""
    return aiohttp.ClientTimeout(
        total=None, connect=CONNECT_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S, sock_read=read
    )


def stream_url(base_url: str, directory: str | None, api: bool = False) -> str:
    """The stream to read: a 1.x server's (`/global/event`, or `/event` of one directory), or
    with `api` the one of a server that has only the 2.x routes (`/api/event`)."""
    base = base_url.rstrip("/")
    if api:
        where = f"?{urlencode({'location[directory]': directory})}" if directory else ""
        return f"{base}/api/event{where}"
    if directory is None:
        return f"{base}/global/event"
    return f"{base}/event?{urlencode({'directory': directory})}"


class _NotAStream(Exception):
    """The server answered, but not with an event stream; the message is safe to log."""

    def __init__(self, message: str, diagnosis: Diagnosis) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


class _NoHeaders(Exception):
    """The stream's request was taken and no answer (not even its headers) came in time:
    the server is still starting, say. Not the API's `_Unanswered`: a stream is asked again
    and again, so this one only names the reconnect's reason."""


class _NoFrame(Exception):
    """Bytes came, frames did not: the stream is stalled whatever the socket says."""


# The reason of a connection the server dropped mid-stream (aiohttp names it by a payload
# or disconnect error): a server stopped, killed or restarting, as people put it.
CONNECTION_LOST = "connection lost: the server closed it mid-stream (stopped or restarted?)"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (_NotAStream, _NoHeaders, _NoFrame)):
        return str(exc)
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return "read timeout"
    # Only the exception type and aiohttp's own text: never frame content.
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    lost = (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
    if isinstance(exc, lost):
        return CONNECTION_LOST
    if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError):
        return str(exc)  # the operating system's text, never frame content
    return type(exc).__name__


class EventStream:
    """Reads frames from `url` until cancelled, reconnecting with backoff."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        on_frame: Callable[[str], bool],
        on_connect: Callable[[], Awaitable[None]],
        on_disconnect: Callable[[str], None] = lambda reason: None,
        backoff: Backoff = RECONNECT,
        read_timeout: float = READ_TIMEOUT_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._http = http
        self.url = url
        # Asked before every connect for the stream to read: the server may have changed
        # generation while we were away (an upgrade in place), and with it its stream.
        self._locate = locate
        self._on_frame = on_frame
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._backoff = backoff
        self._timeout = stream_timeout(read_timeout)
        self._read_limit = read_timeout
        self._answer_limit = min(HEADERS_TIMEOUT_S, read_timeout)
        self._response: aiohttp.ClientResponse | None = None
        self._dropped: str | None = None  # why `reconnect` dropped the connection
        self._sleep = sleep
        self._clock = clock
        self.connected = False
        self.frames = 0
        # Until the first connection, a failure is "could not connect", never "disconnected".
        self.ever_connected = False
        # Kinds of failure already explained since the last good connection: one hint each.
        self._explained: set[str] = set()
        # The outage under way, if any: since when, and how many connects have failed in it.
        self._down_since: float | None = None
        self._attempts = 0

    async def run(self) -> None:
        """Read for ever; returns only by cancellation, raises only ConfigError (a 401 or
        407 before the stream has ever worked)."""
        failures = 0
        while True:
            frames_before = self.frames
            self._dropped = None
            try:
                await self._read_once()
                reason = self._dropped or "stream ended"
            except ConfigError as exc:
                # At start, refused credentials are the operator's to fix now (exit 78). Once
                # the stream has worked, the server came back with other credentials: a guard
                # that exits then stays down (systemd does not restart 78), so it says why and
                # keeps trying, as through any outage, until the server takes ours again.
                if not self.ever_connected:
                    raise
                reason = "credentials refused"
                self._explain_problem(CREDENTIALS_REFUSED, str(exc))
            except Exception as exc:  # any failure of one connection means: reconnect
                reason = self._dropped or _reason(exc)
                self._explain(exc)
            finally:
                self.connected = False
            # A connection that delivered frames was healthy: start the backoff over.
            failures = 0 if self.frames > frames_before else failures + 1
            delay = self._backoff.delay(max(failures - 1, 0))
            retry_in_s = round(delay, 2)
            self._went_down(reason, retry_in_s)
            self._on_disconnect(reason)
            await self._sleep(delay)

    def _went_down(self, reason: str, retry_in_s: float) -> None:
        """One warning per outage: a server down for minutes is retried a hundred times."""
        if self._down_since is not None:
            self._attempts += 1
            log.debug("stream.retry_failed", reason=reason, attempts=self._attempts)
            return
        self._down_since = self._clock()
        # A lost connection is no attempt of the outage; a first connect that failed is one.
        self._attempts = 0 if self.ever_connected else 1
        if self.ever_connected:
            log.warning("stream.disconnected", reason=reason, retry_in_s=retry_in_s)
        else:
            log.warning("stream.connect_failed", reason=reason, retry_in_s=retry_in_s)

    def _came_back(self) -> None:
        """The outage, if any, is over: say how long it lasted and what it took."""
        if self._down_since is not None:
            log.info(
                "stream.reconnected",
                down_s=round(self._clock() - self._down_since, 2),
                # The connects tried since it went down, the one that worked included.
                attempts=self._attempts + 1,
            )
        self._down_since = None
        self._attempts = 0

    def _explain(self, exc: Exception) -> None:
        if isinstance(exc, _NotAStream):
            diagnosis: Diagnosis | None = exc.diagnosis
        else:
            diagnosis = diagnose_error(exc, self.url)
        if diagnosis is not None:
            self._explain_problem(diagnosis.problem, diagnosis.hint)

    def _explain_problem(self, problem: str, hint: str) -> None:
        """Once per kind of failure until a connection works again."""
        if problem not in self._explained:
            self._explained.add(problem)
            log.error("stream.diagnosis", problem=problem, hint=hint)

    async def _read_once(self) -> None:
        if self._locate is not None:
            self.url = await self._locate()
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        request = self._http.get(
            self.url, headers=headers, timeout=self._timeout, allow_redirects=False
        )
        try:
            async with asyncio.timeout(self._answer_limit):
                response = await request
        except TimeoutError:
            raise _NoHeaders(f"no answer for {self._answer_limit:g} s") from None
        async with response:
            status, content_type = response.status, response.content_type
            if status in (401, 407):
                sent = aiohttp.hdrs.AUTHORIZATION in self._http.headers
                raise ConfigError(refused_credentials(status, sent))
            if status != 200:
                raise _NotAStream(
                    f"server answered {status}", diagnose_status(status, content_type, self.url)
                )
            if content_type != "text/event-stream":
                raise _NotAStream(
                    f"not an event stream ({content_type})",
                    diagnose_status(status, content_type, self.url),
                )
            self.connected = self.ever_connected = True
            self._explained.clear()
            log.info("stream.connected", url=public_url(self.url))
            self._came_back()
            decoder = SSEChunkDecoder()
            self._response = response
            try:
                await self._read_while(self._on_connect(), response.content, decoder)
                await self._read_frames(response.content, decoder)
            finally:
                self._response = None

    def reconnect(self, reason: str) -> None:
        """Drop the current connection: the next one resyncs (see `monitor.shell.watch`)."""
        if self._response is not None:
            self._dropped = reason
            self._response.close()

    async def _read_while(
        self, work: Awaitable[None], content: aiohttp.StreamReader, decoder: SSEChunkDecoder
    ) -> None:
        """Run `work`, reading frames and handing them on meanwhile."""
        task = asyncio.ensure_future(work)
        read: asyncio.Future[bytes] | None = None
        try:
            while not task.done():
                if read is None:
                    read = asyncio.ensure_future(content.read(READ_CHUNK))
                await asyncio.wait((task, read), return_when=asyncio.FIRST_COMPLETED)
                if read.done():
                    chunk = read.result()
                    read = None
                    if not chunk:  # the stream ended: what came still counts
                        await task
                        break
                    await self._hand_on(decoder.feed(chunk))
            task.result()  # its failure is this connection's
        finally:
            # A read not yet answered leaves its bytes in the buffer for the next one.
            for pending in (read, task):
                if pending is not None and not pending.done():
                    pending.cancel()
                    # Until it has unwound, the reader still counts as waiting.
                    await asyncio.gather(pending, return_exceptions=True)

    async def _hand_on(self, batch: list[str]) -> None:
        """Each frame of one chunk to `on_frame`, in order."""
        on_frame = self._on_frame
        for data in batch:
            self.frames += 1
            if on_frame(data):
                # The frame handed work to the executor: its first request goes out now,
                # not after the rest of the chunk is read.
                await asyncio.sleep(0)

    async def _read_frames(self, content: aiohttp.StreamReader, decoder: SSEChunkDecoder) -> None:
        loop = asyncio.get_running_loop()
        limit = self._read_limit
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                async for chunk in content.iter_chunked(READ_CHUNK):
                    batch = decoder.feed(chunk)
                    if batch:
                        deadline.reschedule(loop.time() + limit)
                    await self._hand_on(batch)
        except TimeoutError:
            if deadline.expired():
                raise _NoFrame(f"no frame for {limit:g} s") from None
            raise
