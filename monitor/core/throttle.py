"""One log line per kind per interval, for what a client or a fault can repeat at will."""

from __future__ import annotations

__all__ = ["Throttle"]


class Throttle:
    """`due` counts one of a kind at `now` and, when a line is due, says how many came since
    the last line (this one included); None while the interval runs. Kinds must come from a
    bounded set."""

    def __init__(self, every: float) -> None:
        self._every = every
        # Per kind: when it was last logged, and how many came since.
        self._seen: dict[str, tuple[float, int]] = {}

    def due(self, kind: str, now: float) -> int | None:
        logged_at, count = self._seen.get(kind, (float("-inf"), 0))
        count += 1
        if now - logged_at < self._every:
            self._seen[kind] = (logged_at, count)
            return None
        self._seen[kind] = (now, 0)
        return count
