"""The metrics server: `/metrics`, `/healthz`, `/readyz` and `/status` over HTTP on
`--metrics-addr`, with the limits of monitor.shell.listener."""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from monitor.config import ListenAddress
from monitor.errors import ConfigError
from monitor.shell.listener import Limits, Listening, listen_tcp
from monitor.shell.metrics import Metrics

__all__ = [
    "MAX_CONNECTIONS",
    "STATUS_RATE",
    "Cached",
    "MetricsServer",
    "RateLimit",
    "serve_metrics",
    "start_metrics_server",
]

log = structlog.get_logger("monitor.shell.watch")

# The limits of monitor.shell.listener: at most MAX_CONNECTIONS open, a connection idle (or
# sending its head) for IDLE_S closed, none alive longer than LIFETIME_S. Requests are GETs:
# a line, headers and body have small bounds.
MAX_CONNECTIONS = 64
IDLE_S = 5.0
LIFETIME_S = 15.0
MAX_LINE = 4096
MAX_BODY = 1024
# /status: built at most once per STATUS_CACHE_S (every request in between gets the same
# bytes), and at most STATUS_RATE requests a second are answered (a burst of as many), the
# rest get 429: a client in a loop costs a few writes, never a rebuild per request.
STATUS_CACHE_S = 1.0
STATUS_RATE = 20.0


class RateLimit:
    """A token bucket: `rate` a second, bursts of as many."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._clock = clock
        self._tokens = rate
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class Cached:
    """`build()` serialised as JSON, rebuilt only when the last build is `ttl` seconds old."""

    def __init__(
        self, build: Callable[[], object], ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._build = build
        self._ttl = ttl
        self._clock = clock
        self._body = b""
        self._at = float("-inf")

    def body(self) -> bytes:
        now = self._clock()
        if now - self._at >= self._ttl:
            self._body = json.dumps(self._build(), separators=(",", ":")).encode()
            self._at = now
        return self._body


def metrics_app(metrics: Metrics, status: Callable[[], object] | None = None) -> web.Application:
    """`/metrics`, `/healthz` and `/readyz` (ready as `metrics.not_ready` says).

    With `status`, also `/status`: its answer as JSON, what `opencode-loop-monitor status`
    reads (session ids and directories, never arguments or outputs), cached and rate limited.
    """

    async def healthz(request: web.Request) -> web.Response:
        # Answering at all is the check: this runs on the event loop the monitor runs on.
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reason = metrics.not_ready()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    app = web.Application(client_max_size=MAX_BODY)
    # prometheus-client's own handler: OpenMetrics when the scraper asks for it (Accept),
    # gzip when it accepts it (Accept-Encoding), the text format otherwise.
    app.router.add_get("/metrics", make_aiohttp_handler(metrics.registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if status is not None:
        cached = Cached(status, STATUS_CACHE_S)
        limit = RateLimit(STATUS_RATE)

        async def serve_status(request: web.Request) -> web.Response:
            if not limit.take():
                metrics.http_refused("rate")
                return web.Response(
                    status=429, text="too many requests\n", headers={"Retry-After": "1"}
                )
            return web.Response(body=cached.body(), content_type="application/json")

        app.router.add_get("/status", serve_status)
    return app


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running metrics server; `port` is the bound one (useful when asked for port 0)."""

    runner: web.AppRunner
    listening: Listening
    port: int

    async def close(self) -> None:
        self.listening.close()
        await self.runner.cleanup()


async def start_metrics_server(
    metrics: Metrics, host: str, port: int, status: Callable[[], object] | None = None
) -> MetricsServer:
    """Listen on `host:port` (port 0 picks a free one); raises OSError if it cannot bind."""
    runner = web.AppRunner(metrics_app(metrics, status), access_log=None)
    await runner.setup()
    limits = Limits(
        MAX_CONNECTIONS, IDLE_S, MAX_LINE, lambda: metrics.http_refused("connections"), LIFETIME_S
    )
    try:
        listening = await listen_tcp(runner, limits, host, port)
    except BaseException:
        await runner.cleanup()
        raise
    return MetricsServer(runner, listening, listening.server.sockets[0].getsockname()[1])


async def serve_metrics(
    metrics: Metrics, address: ListenAddress, status: Callable[[], object]
) -> MetricsServer:
    """`start_metrics_server` for a watch: a port it cannot listen on is a setting to fix."""
    try:
        server = await start_metrics_server(metrics, address.host, address.port, status=status)
    except OSError as exc:
        taken = (
            "; another monitor is probably running there already (`opencode-loop-monitor "
            f"status --metrics-addr {address}` shows it): give this one another address"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise ConfigError(
            f"metrics_addr {address}: cannot listen ({exc.strerror}){taken}"
        ) from None
    log.info("metrics.listening", host=address.host, port=server.port)
    return server
