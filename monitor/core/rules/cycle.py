"""Cycle detection over a history of call signatures.

A loop is a block of 1 to `max_period` calls repeated back to back until the newest call.
For a period L the last max(L * repeats, min_calls) entries must each equal the entry L
places before them. `min_calls` exists for period 1: three identical calls in a row are
still allowed (OpenCode's own doom_loop check asks the user on the third one within a step),
the fourth is a loop.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

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
    for length in range(1, max_period + 1):
        needed = max(length * repeats, min_calls)
        if needed > window:
            # Longer periods need at least as many calls: none of them can match either.
            break
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
