"""The live interventions: each session's, in the order they began, and the work parked while
the server is away (`DueWork`), each by its number.

`Monitor` owns one `Lives`. An intervention is live from its beginning until its table says
it is done, or it waits for the next connect (parked: the shell has nothing to carry out
for it); it is numbered once, and the shell tags what it carries out, and what came of it,
with that number. Pure: time is an input.
"""

from __future__ import annotations

import itertools

from monitor.core import intervention as life
from monitor.core.due import DueWork

__all__ = ["Lives"]


class Lives:
    """Every live intervention by number, each session's numbers in the order begun, and
    the parked ones."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self._live: dict[int, life.Intervention] = {}
        # Each session's interventions queued or under way, oldest first.
        self._order: dict[str, list[int]] = {}
        self._due: DueWork[tuple[int, life.Intervention]] = DueWork()

    def __len__(self) -> int:
        return len(self._live)

    def begin(self, found: life.Intervention) -> int:
        """A new intervention, behind the session's live ones: its number."""
        number = next(self._numbers)
        self._enter(number, found)
        return number

    def get(self, number: int) -> life.Intervention | None:
        return self._live.get(number)

    def acting_on(self, session_id: str) -> bool:
        """True while an intervention for this session is queued or under way."""
        return session_id in self._order

    def end(self, number: int) -> None:
        """The intervention is done (or parked): it leaves its session's order."""
        found = self._live.pop(number, None)
        if found is None:
            return
        session_id = found.decision.session_id
        order = self._order[session_id]
        order.remove(number)
        if not order:
            del self._order[session_id]

    def park(self, number: int, command: life.Park, now: float) -> list[life.Intervention]:
        """The intervention waits for the next connect; the parked ones given up for room."""
        found = self._live[number]
        self.end(number)
        dropped = self._due.add((command.session_id, command.part_id), (number, found), now)
        return [work for _, work in dropped]

    def resume(self, now: float) -> tuple[list[int], list[life.Intervention]]:
        """The parked work, live again in the order it was parked (each behind its
        session's live ones), and the work too old to do."""
        fresh, stale = self._due.take(now)
        for due in fresh:
            self._enter(*due.work)
        return [due.work[0] for due in fresh], [due.work[1] for due in stale]

    def parked(self, now: float) -> list[life.Intervention]:
        """Every parked intervention, out of the record (shutdown)."""
        fresh, stale = self._due.take(now)
        return [due.work[1] for due in fresh + stale]

    def _enter(self, number: int, found: life.Intervention) -> None:
        self._live[number] = found
        self._order.setdefault(found.decision.session_id, []).append(number)
