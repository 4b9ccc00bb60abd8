"""Per-session loop guard: a bounded history of call digests for each session.

Memory stays bounded whatever the server does: each history keeps at most `max_history`
entries, and at most `max_sessions` sessions are held, the least recently active dropped
first. A history entry is a 64-bit digest in an `array`, not the signature, because edit and
write arguments can be many kilobytes.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from monitor.core.rules.cycle import Cycle, detect_cycle
from monitor.core.signature import canonical_signature, signature_digest

K = TypeVar("K")
V = TypeVar("V")


class RecentMap(Generic[K, V]):
    """A dict that holds at most `capacity` keys and forgets the least recently used one.

    A plain dict keeps insertion order, so re-inserting a key on use is enough; it costs less
    memory per entry than OrderedDict, which matters at tens of thousands of sessions.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._items: dict[K, V] = {}

    def touch(self, key: K, make: type[V]) -> V:
        """Return the value of `key`, made with `make()` if absent, and mark it most recent."""
        items = self._items
        value = items.pop(key, None)
        if value is None:
            value = make()
            if len(items) >= self._capacity:
                del items[next(iter(items))]
        items[key] = value
        return value

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def items(self) -> list[tuple[K, V]]:
        """A copy, oldest first: the caller may touch or drop keys while it reads."""
        return list(self._items.items())


class _History:
    __slots__ = ("digests", "tools")

    def __init__(self) -> None:
        self.digests = array("q")
        # Interned so thousands of histories share one string per tool name.
        self.tools: list[str] = []


class LoopGuard:
    """Records calls per session and says when one completes a cycle."""

    def __init__(
        self,
        max_history: int = 32,
        max_sessions: int = 10_000,
        max_period: int = 4,
        repeats: int = 3,
        min_calls: int = 4,
    ) -> None:
        if max_history < max(max_period * repeats, min_calls):
            raise ValueError(
                f"max_history ({max_history}) must hold max_period * repeats "
                f"({max_period * repeats}) calls"
            )
        self.max_history = max_history
        self.max_period = max_period
        self.repeats = repeats
        self.min_calls = min_calls
        self._sessions: RecentMap[str, _History] = RecentMap(max_sessions)

    def record(self, session_id: str, tool: str, args: Any) -> Cycle | None:
        """Add a call to the session's history; return the cycle it completes, if any."""
        return self.record_digest(
            session_id, tool, signature_digest(canonical_signature(tool, args))
        )

    def record_digest(self, session_id: str, tool: str, digest: int) -> Cycle | None:
        """`record` for a call whose signature digest is already known.

        The whole history is what the rule sees: `max_history` bounds the repetitions it can
        count (a waiting loop's budget must fit in it).
        """
        history = self._sessions.touch(session_id, _History)
        history.digests.append(digest)
        history.tools.append(sys.intern(tool))
        if len(history.digests) > self.max_history:
            del history.digests[0]
            del history.tools[0]
        return detect_cycle(
            history.digests, self.max_period, self.repeats, self.min_calls, self.max_history
        )

    def block(self, session_id: str, count: int) -> tuple[int, ...]:
        """Digests of the session's last `count` calls, oldest first."""
        history = self._sessions.get(session_id)
        return tuple(history.digests[-count:]) if history is not None and count else ()

    def tools(self, session_id: str, count: int) -> tuple[str, ...]:
        """Tool names of the session's last `count` calls, oldest first."""
        history = self._sessions.get(session_id)
        return tuple(history.tools[-count:]) if history is not None and count else ()

    def history_length(self, session_id: str) -> int:
        history = self._sessions.get(session_id)
        return 0 if history is None else len(history.digests)

    def clear(self, session_id: str) -> None:
        self._sessions.pop(session_id)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __iter__(self) -> Iterator[str]:
        """Ids of the sessions that have a history."""
        return iter(self._sessions)
