"""Cycle detection over a history of call signatures.

Rules `cycle` and `wait` (`CycleRule`): a loop is a block of 1 to `max_period` calls repeated
back to back until the newest call.
For a period L the last max(L * repeats, min_calls) entries must each equal the entry L
places before them. `min_calls` exists for period 1: three identical calls in a row are
still allowed (OpenCode's own doom_loop check asks the user on the third one within a step),
the fourth is a loop.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from monitor.core.findings import CallCycle, EndlessWait, Finding
from monitor.core.rules.waiting import answers_in_progress, waits_by_command
from monitor.core.session import Call, SessionRecord

__all__ = ["Cycle", "CycleRule", "detect_cycle", "window_size"]

MIN_WINDOW = 16


@dataclass(frozen=True, slots=True)
class Cycle:
    """A detected loop: a block of `length` calls repeated `repetitions` full times."""

    length: int
    repetitions: int


def window_size(max_period: int, repeats: int) -> int:
    """How many recent signatures detection may look at; also the history it needs."""
    return max(max_period * repeats, MIN_WINDOW)


def detect_cycle(
    history: Sequence[Hashable],
    max_period: int = 4,
    repeats: int = 3,
    min_calls: int = 4,
    window: int | None = None,
) -> Cycle | None:
    """Return the shortest cycle ending `history`, or None.

    Looks at no more than `window` newest entries (by default `window_size(max_period,
    repeats)`), so its cost per call does not grow with the history; the repetitions it
    reports are counted within that window.
    """
    size = len(history)
    window = min(size, window_size(max_period, repeats) if window is None else window)
    if not size:
        return None
    last = history[size - 1]
    for length in range(1, max_period + 1):
        needed = max(length * repeats, min_calls)
        if needed > window:
            # Longer periods need at least as many calls: none of them can match either.
            break
        if history[size - 1 - length] != last:
            continue  # the newest call differs from the one a period back: no cycle of it
        run = _periodic_tail(history, size, length, window)
        if run >= needed:
            return Cycle(length=length, repetitions=run // length)
    return None


def _periodic_tail(history: Sequence[Hashable], size: int, length: int, window: int) -> int:
    """Length of the longest suffix (within `window`) that is periodic with `length`."""
    run = length
    while run < window and history[size - 1 - run] == history[size - 1 - run + length]:
        run += 1
    return min(run, window)


# Distinct waiting calls remembered per run; a run rarely waits on more than a few things.
_MAX_WAITING = 16


class CycleRule:
    """Rules `cycle` and `wait`: does this call complete a cycle of the run's history?

    A cycle that holds a call that waits (monitor/core/rules/waiting.py) is a loop only after
    `wait_calls` calls (0: no allowance); the history, at least `wait_calls` long, counts them.
    Its state is the digests of the run's calls that wait.
    """

    def __init__(
        self, max_period: int, repeats: int, history: int, wait_calls: int, min_calls: int = 4
    ) -> None:
        self.max_period = max_period
        self.repeats = repeats
        self.history = history
        self.wait_calls = wait_calls
        self.min_calls = min_calls
        self.reads_recorded = True
        self.reads_finished = wait_calls > 0  # an outcome "in progress" marks a wait
        self.reads_running = False

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> Finding | None:
        wait_calls = self.wait_calls
        if wait_calls and finished and call.status == "completed":
            if answers_in_progress(call.output):
                _remember_waiting(session, call.recorded_as)
        if not recorded:
            return None
        if wait_calls and waits_by_command(call.tool, call.args):
            _remember_waiting(session, call.recorded_as)
        digests = session.digests
        if digests is None:
            return None
        cycle = detect_cycle(digests, self.max_period, self.repeats, self.min_calls, self.history)
        if cycle is None:
            return None
        tools = session.last_tools(cycle.length)
        waiting: dict[int, None] | None = session.peek("wait")
        if waiting is not None and any(d in waiting for d in session.block(cycle.length)):
            # A wait gets its allowance.
            if cycle.length * cycle.repetitions < wait_calls:
                return None
            return EndlessWait(tools, cycle.repetitions)
        return CallCycle(tools, cycle.repetitions)


def _remember_waiting(session: SessionRecord, digest: int) -> None:
    waiting: dict[int, None] = session.state("wait", dict)
    if digest not in waiting and len(waiting) >= _MAX_WAITING:
        del waiting[next(iter(waiting))]
    waiting[digest] = None
