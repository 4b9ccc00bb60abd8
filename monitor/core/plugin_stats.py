"""What plugins asked, per server directory (`PluginStats`, for `status` and the metrics),
and whether the server runs tool calls while no plugin asks (`Unasked`). Pure: the time is
given with every input."""

from __future__ import annotations

from collections.abc import Callable

from monitor.core.findings import clean_tool_name
from monitor.core.plugin_protocol import FellOpen, PluginCall, PluginVerdict

__all__ = ["PluginStats", "UNASKED_AFTER_S", "UNASKED_CHECK_S", "Unasked"]

# Directories counted apart in status and metrics; more than this many projects share "other".
MAX_DIRECTORIES = 64
# How a directory is labelled in status and metrics (cut like everywhere else it leaves us).
DIRECTORY_MAX = 256


class PluginStats:
    """What plugins asked, per server directory: for `status` and the metrics."""

    def __init__(self) -> None:
        self.by_directory: dict[str, dict[str, float]] = {}
        self.refused = 0
        self._fell_open = FellOpen(MAX_DIRECTORIES)
        # The plugin version each directory's plugin last sent (None: none, an earlier one).
        self.versions: dict[str, str | None] = {}

    def label(self, directory: str | None) -> str:
        # Cleaned: a label Prometheus cannot encode (a lone surrogate) would break /metrics.
        # Not a path: no project's directory is called so.
        label = "unknown" if directory is None else clean_tool_name(directory, DIRECTORY_MAX)
        if label in self.by_directory or len(self.by_directory) < MAX_DIRECTORIES:
            return label
        return "other"

    def asked(
        self, call: PluginCall, verdict: PluginVerdict, now_unix: float, answered: bool = True
    ) -> tuple[str, int]:
        """Count one request made at `now_unix` (`answered`: the plugin still waits for the
        answer); the directory label it was counted under, and the calls newly fallen open
        it reported."""
        label = self.label(call.directory)
        fell_open = self._fell_open.count(label, call.fell_open, answered)
        entry = self.by_directory.setdefault(
            label, {"requests": 0, "blocked": 0, "fell_open": 0, "last_request_unix": 0.0}
        )
        entry["requests"] += 1
        entry["blocked"] += verdict.verdict == "block"
        entry["fell_open"] += fell_open
        entry["last_request_unix"] = now_unix
        self.versions[label] = call.plugin_version
        return label, fell_open

    def view(self) -> list[dict[str, object]]:
        return [
            {"directory": name, **entry, "plugin_version": self.versions.get(name)}
            for name, entry in self.by_directory.items()
        ]


# How long the server may run tool calls with no plugin asking before `watch` says so. The
# plugin asks before each call, or lets it run after at most 200 ms: seconds are no race.
UNASKED_AFTER_S = 5.0
# How often, at most, the calls are counted while waiting for a plugin's first request.
UNASKED_CHECK_S = 1.0


class Unasked:
    """Whether the server runs tool calls while no plugin asks this monitor: the plugin not
    installed where the server looks, or asking another endpoint. `check` says it once.

    Only calls that come after the first check count: the calls read back from the server's
    record at connect ran before this monitor could be asked.

    | state    | input                                   | next     | says |
    |----------|-----------------------------------------|----------|------|
    | any      | a plugin asked                          | done     | no   |
    | start    | first check: the calls so far           | waiting  | no   |
    | waiting  | more calls than at the first check      | counting | no   |
    | counting | `after` s since those calls were seen   | done     | yes  |
    """

    def __init__(self, after: float = UNASKED_AFTER_S, every: float = UNASKED_CHECK_S) -> None:
        self._after = after
        self._every = every
        self._checked_at = float("-inf")
        self._baseline: int | None = None
        self._calls_since: float | None = None
        self.done = False
        # The calls it said ran with no plugin asking; None until it says so.
        self.said: int | None = None

    @property
    def next_check(self) -> float:
        """When `check` next has anything to do (infinity once it is done): `Monitor` runs
        it no sooner, so a frame before then costs one comparison, and `check` (which
        counts every call) runs at most once per `every`."""
        return float("inf") if self.done else self._checked_at + self._every

    def check(self, calls: Callable[[], int], asked: bool, now: float) -> int | None:
        """The calls seen since the first check, once, when it is time to say no plugin
        asks; else None. `calls` counts every call known (it walks every session)."""
        if self.done:
            return None
        if asked:
            self.done = True
            return None
        if now - self._checked_at < self._every:
            return None
        self._checked_at = now
        if self._baseline is None:
            self._baseline = calls()
            return None
        seen = calls() - self._baseline
        if seen <= 0:
            return None
        if self._calls_since is None:
            self._calls_since = now
        if now - self._calls_since < self._after:
            return None
        self.done = True
        self.said = seen
        return seen
