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
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor import __version__
from monitor.core.decisions import Outcome
from monitor.core.events import KNOWN_EVENT_TYPES, MALFORMED, OTHER
from monitor.core.findings import RULES, clean_tool_name
from monitor.shell.stream import READ_TIMEOUT_S

__all__ = ["INTERVENTION_OUTCOMES", "MAX_DIRECTORIES", "Metrics", "readiness", "wall_time"]

PREFIX = "opencode_loop_monitor_"

# A `_created` series beside every counter doubles what a scrape reads and says only when
# this process started (process_start_time_seconds says that once). Process-wide in
# prometheus_client; this process serves no other metrics.
disable_created_metrics()  # type: ignore[no-untyped-call]

OUTCOMES = tuple(Outcome)
# What interventions_total counts: a dry run stops nothing, so its detections are counted
# apart, under a name that says so, and never look like sessions that were stopped.
INTERVENTION_OUTCOMES = tuple(outcome for outcome in Outcome if outcome != Outcome.DRY_RUN)


REFUSALS = ("connections", "rate")
# Directories with a label of their own in the spend counters; a directory as long as a path
# may be (cut like everywhere else a directory leaves the process).
MAX_DIRECTORIES = 256
DIRECTORY_MAX = 256


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

    `connected`, `sessions` (the busy ones), `known`, `held` and `last_frame_at` are read
    at scrape time; `last_frame_at` and
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
        held: Callable[[], int] = lambda: 0,
        known: Callable[[], int] = lambda: 0,
        log_dropped: Callable[[], int] = lambda: 0,
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
        # Each type's child, found once: `labels` takes a lock and builds a key on every call,
        # a microsecond on every frame. Bounded by the labels `frame` gives.
        self._frame_counters: dict[str, Counter] = {}
        self._malformed = Counter(
            PREFIX + "malformed_frames",
            "Frames that were not usable JSON or lacked the fields their type needs.",
            registry=registry,
        )
        self._reconnects = Counter(
            PREFIX + "stream_reconnects",
            "Times the event stream was opened again after it was lost (successful"
            " reconnects, not failed attempts).",
            registry=registry,
        )
        self._loops = Counter(
            PREFIX + "loops_detected",
            "Loops detected, by rule and by the length of what repeated (the calls of a "
            "cycle, the sentences of a text passage; 1 for the other rules).",
            ["cycle_length", "rule"],
            registry=registry,
        )
        self._interventions = Counter(
            PREFIX + "interventions",
            "Interventions carried out, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self._http_refused = Counter(
            PREFIX + "http_refused",
            "Requests to this HTTP server turned away: 'connections' over the cap, 'rate' over "
            "the /status rate limit.",
            ["reason"],
            registry=registry,
        )
        for reason in REFUSALS:
            self._http_refused.labels(reason)
        for outcome in INTERVENTION_OUTCOMES:
            # Present from the start at 0, so rate() and absence alerts work before the first.
            self._interventions.labels(outcome)
        # Spend per project (the session's directory), never per session: a label per
        # session would grow without bound. At most MAX_DIRECTORIES directories get their
        # own label; the rest count under "other".
        self._tokens = Counter(
            PREFIX + "tokens",
            "Tokens the models used (input, output, reasoning, cache read and write), from "
            "message.updated, by project directory.",
            ["directory"],
            registry=registry,
        )
        self._cost = Counter(
            PREFIX + "cost_usd",
            "What the models cost in USD as the server reports it, by project directory.",
            ["directory"],
            registry=registry,
        )
        self._directories: set[str] = set()
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
        # Named as `status` counts them (busy, held, and all it knows), so that the two never
        # seem to disagree: `sessions_tracked 0` beside "2 sessions" did.
        Gauge(
            PREFIX + "sessions_busy",
            "Sessions with a run under way, whose tool calls the monitor follows now (`busy`"
            " in `status`).",
            registry=registry,
        ).set_function(lambda: float(sessions()))
        Gauge(
            PREFIX + "sessions_known",
            "Sessions the monitor knows now, busy, idle or held (the sessions `status` lists).",
            registry=registry,
        ).set_function(lambda: float(known()))
        Gauge(
            PREFIX + "sessions_held",
            "Sessions on hold now, waiting for a person: from a hold until the next user"
            " message that is not the monitor's feedback, or the session's deletion (read back"
            " from the sessions' messages after a restart).",
            registry=registry,
        ).set_function(lambda: float(held()))
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
        ReadCounter(
            PREFIX + "log_lines_dropped",
            "Log lines dropped because the reader of stdout did not keep up (the log writer's"
            " queue was full) or could not be written to (`log.dropped` in the log says how"
            " many).",
            log_dropped,
            registry,
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=registry)

    def frame(self, event_type: str) -> None:
        """Count one frame; `event_type` as the tracker returns it (unknowns become other)."""
        counter = self._frame_counters.get(event_type)
        if counter is None:
            if event_type not in KNOWN_EVENT_TYPES and event_type != MALFORMED:
                event_type = OTHER
            counter = self._frame_counters.setdefault(event_type, self._frames.labels(event_type))
        counter.inc()

    def malformed(self) -> None:
        self._malformed.inc()

    def reconnect(self) -> None:
        self._reconnects.inc()

    def loop(self, cycle_length: int, rule: str = "cycle") -> None:
        # Bounded by the max_period setting (1 to 10) and by the rule names.
        self._loops.labels(str(cycle_length), rule if rule in RULES else OTHER).inc()

    def spent(self, directory: str | None, tokens: int, cost: float) -> None:
        """Count what one `message.updated` added (`Fed.spent`)."""
        label = "unknown" if directory is None else clean_tool_name(directory, DIRECTORY_MAX)
        if label not in self._directories:
            if len(self._directories) >= MAX_DIRECTORIES:
                label = OTHER
            else:
                self._directories.add(label)
        if tokens:
            self._tokens.labels(label).inc(tokens)
        if cost:
            self._cost.labels(label).inc(cost)

    def intervention(self, outcome: str) -> None:
        if outcome == Outcome.DRY_RUN:
            self._dry_run.inc()
            return
        self._interventions.labels(outcome if outcome in OUTCOMES else OTHER).inc()

    def http_refused(self, reason: str) -> None:
        self._http_refused.labels(reason).inc()

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


class ReadCounter(Collector):
    """A counter whose value is read at scrape time from `read`: one kept elsewhere (the log
    writer's, counted on its own thread), so nothing is added per event here."""

    def __init__(
        self, name: str, documentation: str, read: Callable[[], int], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._read = read
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._documentation, value=float(self._read()))
