"""Interventions waiting for the server to answer again (`monitor.core.intervention`'s
`DUE_ABORT` and `DUE_FEEDBACK`), until the next connect.

Bounded in count and in age: a monitor facing a server that stays away does not hoard work,
and work older than `max_age` is given up (the model has moved on or a person has stepped in)
rather than done late. Pure: time is an input.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["DUE_AGE_S", "DUE_MAX", "Due", "DueWork"]

# At most this much work waits for the server; the oldest is given up first.
DUE_MAX = 256
# Work that waited this long for the server is given up, not done.
DUE_AGE_S = 300.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Due(Generic[T]):
    work: T
    since: float


class DueWork(Generic[T]):
    """The due work, by loop (session and part), oldest first."""

    def __init__(self, limit: int = DUE_MAX, max_age: float = DUE_AGE_S) -> None:
        self._limit = limit
        self._max_age = max_age
        self._work: OrderedDict[tuple[str, str], Due[T]] = OrderedDict()
        # When each loop's work was first kept: work taken out and kept again (the server
        # went away once more) keeps its age. Loops never recur, so old entries just fall off.
        self._first: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._work)

    def add(self, loop: tuple[str, str], work: T, now: float) -> list[T]:
        """Keep `work` for the loop (session, part) for later; the work given up for room."""
        since = self._first.setdefault(loop, now)
        while len(self._first) > 2 * self._limit:
            self._first.popitem(last=False)
        self._work.pop(loop, None)
        self._work[loop] = Due(work, since)
        dropped = []
        while len(self._work) > self._limit:
            dropped.append(self._work.popitem(last=False)[1].work)
        return dropped

    def take(self, now: float) -> tuple[list[Due[T]], list[Due[T]]]:
        """All of it, out of the record: (still to do, too old to do)."""
        work = list(self._work.values())
        self._work.clear()
        fresh = [due for due in work if now - due.since < self._max_age]
        return fresh, [due for due in work if now - due.since >= self._max_age]
