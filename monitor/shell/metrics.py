"""Metrics and health: Prometheus `/metrics`, `/healthz` and `/readyz` over HTTP.

Off unless `--metrics-addr` is set. The shell calls one cheap method per thing that happened
(a frame, a malformed frame, a reconnect, a loop, an intervention); the values that are a
state rather than a count (connected, sessions tracked, seconds since the last frame) are read
from small callables when Prometheus scrapes, so they cost nothing per frame.

Every label takes its values from a bounded set: a hostile or buggy server picks the event
types it sends, so unknown types count as "other", and no session id ever becomes a label.
Each `Metrics` owns its registry, never the process-wide default one, so tests and several
monitors in one process do not clash.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.aiohttp import make_aiohttp_handler

from monitor import __version__
from monitor.core.events import KNOWN_EVENT_TYPES, MALFORMED, OTHER
from monitor.core.tracker import RULES
from monitor.shell.stream import READ_TIMEOUT_S

PREFIX = "opencode_loop_monitor_"

OUTCOMES = (
    "aborted",
    "blocked",
    "held",
    "rejected",
    "answered",
    "dry_run",
    "abort_failed",
    "cancelled",
)
# What interventions_total counts: a dry run stops nothing, so its detections are counted
# apart, under a name that says so, and never look like sessions that were stopped.
INTERVENTION_OUTCOMES = (
    "aborted",
    "blocked",
    "held",
    "rejected",
    "answered",
    "abort_failed",
    "cancelled",
)


def readiness(connected: bool, last_frame_at: float | None, now: float, limit: float) -> str | None:
    """Why the monitor is not ready, or None when it is.

    Ready means the stream is connected and a frame came within `limit` seconds: the server
    sends a heartbeat every 10 s, so a quiet stream past the read limit is a dead one that the
    read timeout has not noticed yet.
    """
    if not connected:
        return "event stream not connected"
    if last_frame_at is None:
        return "no frame received yet"
    if now - last_frame_at > limit:
        return f"no frame for {now - last_frame_at:.0f} s"
    return None


def wall_time(at: float, now: float, wall_now: float) -> float:
    """The Unix time of `at`, a reading of the same clock that now reads `now`."""
    return wall_now - (now - at)


class Metrics:
    """The monitor's metrics, in a registry of their own.

    `connected`, `sessions` and `last_frame_at` are read at scrape time; `last_frame_at` and
    `clock` share one timebase (monotonic seconds). Before the first frame, the seconds since
    the last frame count from the creation of this object, so an alert on a large value fires
    for a monitor that never received anything, and not for one that has just started.
    """

    def __init__(
        self,
        connected: Callable[[], bool],
        sessions: Callable[[], int],
        last_frame_at: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
        read_limit: float = READ_TIMEOUT_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = CollectorRegistry()
        self._wall_clock = wall_clock
        self._connected = connected
        self._last_frame_at = last_frame_at
        self._clock = clock
        self._read_limit = read_limit
        self._started_at = clock()
        registry = self.registry
        self._frames = Counter(
            PREFIX + "frames",
            "Frames read from the event stream, by event type (unknown types as 'other').",
            ["event_type"],
            registry=registry,
        )
        self._malformed = Counter(
            PREFIX + "malformed_frames",
            "Frames that were not usable JSON or lacked the fields their type needs.",
            registry=registry,
        )
        self._reconnects = Counter(
            PREFIX + "stream_reconnects",
            "Times the event stream was lost or could not be opened; each is retried.",
            registry=registry,
        )
        self._loops = Counter(
            PREFIX + "loops_detected",
            "Tool-call loops detected, by cycle length in tool calls and by rule.",
            ["cycle_length", "rule"],
            registry=registry,
        )
        self._interventions = Counter(
            PREFIX + "interventions",
            "Interventions carried out, by outcome.",
            ["outcome"],
            registry=registry,
        )
        for outcome in INTERVENTION_OUTCOMES:
            # Present from the start at 0, so rate() and absence alerts work before the first.
            self._interventions.labels(outcome)
        self._dry_run = Counter(
            PREFIX + "dry_run_loops_left_running",
            "Loops detected in dry run: logged and left running, as nothing is stopped.",
            registry=registry,
        )
        # The directory label is bounded by the projects of the servers whose plugins ask
        # (decide.MAX_DIRECTORIES, the rest as "other"), and only the owner can ask.
        self._plugin_requests = Counter(
            PREFIX + "plugin_requests",
            "Calls the OpenCode plugin asked about, by server directory and verdict.",
            ["directory", "verdict"],
            registry=registry,
        )
        self._plugin_fell_open = Counter(
            PREFIX + "plugin_fell_open",
            "Calls the plugin let run unasked (monitor absent, slow or refusing), as it reports.",
            ["directory"],
            registry=registry,
        )
        self._plugin_refused = Counter(
            PREFIX + "plugin_refused_requests",
            "Requests to the plugin endpoint refused as malformed or unauthorised, by status.",
            ["status"],
            registry=registry,
        )
        Gauge(
            PREFIX + "stream_connected",
            "1 while the event stream is connected, else 0.",
            registry=registry,
        ).set_function(lambda: 1.0 if connected() else 0.0)
        Gauge(
            PREFIX + "sessions_tracked",
            "Sessions whose tool calls the monitor currently remembers.",
            registry=registry,
        ).set_function(lambda: float(sessions()))
        Gauge(
            PREFIX + "seconds_since_last_frame",
            "Seconds since the last frame arrived (since start, before the first frame).",
            registry=registry,
        ).set_function(self._seconds_since_last_frame)
        Gauge(
            PREFIX + "last_frame_timestamp_seconds",
            "Unix time of the last frame read from the event stream (0 before the first).",
            registry=registry,
        ).set_function(self._last_frame_timestamp)
        Gauge(
            PREFIX + "build_info",
            "Always 1; the labels say which monitor runs on which Python.",
            ["version", "python_version"],
            registry=registry,
        ).labels(__version__, platform.python_version()).set(1)
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=registry)

    def frame(self, event_type: str) -> None:
        """Count one frame; `event_type` as the tracker returns it (unknowns become other)."""
        if event_type not in KNOWN_EVENT_TYPES and event_type != MALFORMED:
            event_type = OTHER
        self._frames.labels(event_type).inc()

    def malformed(self) -> None:
        self._malformed.inc()

    def reconnect(self) -> None:
        self._reconnects.inc()

    def loop(self, cycle_length: int, rule: str = "cycle") -> None:
        # Bounded by the max_period setting (1 to 10) and by the rule names.
        self._loops.labels(str(cycle_length), rule if rule in RULES else OTHER).inc()

    def intervention(self, outcome: str) -> None:
        if outcome == "dry_run":
            self._dry_run.inc()
            return
        self._interventions.labels(outcome if outcome in OUTCOMES else OTHER).inc()

    def plugin_asked(self, directory: str, verdict: str, fell_open: int) -> None:
        self._plugin_requests.labels(directory, verdict).inc()
        if fell_open:
            self._plugin_fell_open.labels(directory).inc(fell_open)

    def plugin_refused(self, status: int) -> None:
        self._plugin_refused.labels(str(status)).inc()  # statuses of plugin_protocol: bounded

    def not_ready(self) -> str | None:
        """Why `/readyz` answers 503, or None when it answers 200."""
        return readiness(self._connected(), self._last_frame_at(), self._clock(), self._read_limit)

    def _last_frame_timestamp(self) -> float:
        last = self._last_frame_at()
        return 0.0 if last is None else wall_time(last, self._clock(), self._wall_clock())

    def _seconds_since_last_frame(self) -> float:
        last = self._last_frame_at()
        since = self._started_at if last is None else last
        return max(self._clock() - since, 0.0)


def metrics_app(metrics: Metrics, status: Callable[[], object] | None = None) -> web.Application:
    """`/metrics`, `/healthz` and `/readyz` (ready as `metrics.not_ready` says).

    With `status`, also `/status`: its answer as JSON, what `opencode-loop-monitor status`
    reads (session ids and directories, never arguments or outputs).
    """

    async def healthz(request: web.Request) -> web.Response:
        # Answering at all is the check: this runs on the event loop the monitor runs on.
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reason = metrics.not_ready()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    app = web.Application()
    # prometheus-client's own handler: OpenMetrics when the scraper asks for it (Accept),
    # gzip when it accepts it (Accept-Encoding), the text format otherwise.
    app.router.add_get("/metrics", make_aiohttp_handler(metrics.registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if status is not None:
        describe = status

        async def serve_status(request: web.Request) -> web.Response:
            return web.json_response(describe())

        app.router.add_get("/status", serve_status)
    return app


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running metrics server; `port` is the bound one (useful when asked for port 0)."""

    runner: web.AppRunner
    port: int

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_metrics_server(
    metrics: Metrics, host: str, port: int, status: Callable[[], object] | None = None
) -> MetricsServer:
    """Listen on `host:port` (port 0 picks a free one); raises OSError if it cannot bind."""
    # No access log: a scrape every few seconds would drown the monitor's own lines.
    runner = web.AppRunner(metrics_app(metrics, status), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    return MetricsServer(runner, bound)
