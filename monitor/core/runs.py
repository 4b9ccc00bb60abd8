"""A session's run: its states and the one table of how events move it.

A run begins when the server says the session is busy (or, for a stream joined mid-run or
a part read back, with the first call recorded) and ends when the server says it is idle,
when a resync finds it over, or when a read-back replaces it. The server ends every run
with two events (`session.status` idle, then `session.idle`), and an aborted run's late
updates may come between them and a third: only the first end of a run under way ends it,
so what counts runs (the armed countdown, the run budget) counts each once.
"""

from __future__ import annotations

import enum

__all__ = ["RUN_TABLE", "RunEvent", "RunState", "run_advance"]


class RunState(enum.StrEnum):
    IDLE = "idle"  # no run under way
    BUSY = "busy"  # a run under way


class RunEvent(enum.StrEnum):
    BEGIN = "begin"  # the server says busy, or a call of a run is recorded
    END = "end"  # the server says idle, or a resync finds the run over


# (state, event) -> (new state, whether a run ended now).
RUN_TABLE: dict[tuple[RunState, RunEvent], tuple[RunState, bool]] = {
    (RunState.IDLE, RunEvent.BEGIN): (RunState.BUSY, False),
    # Busy is re-sent at every step of a run: the same run.
    (RunState.BUSY, RunEvent.BEGIN): (RunState.BUSY, False),
    # The first end of a run under way ends it: it counts.
    (RunState.BUSY, RunEvent.END): (RunState.IDLE, True),
    # The server's second idle event of one run end, or an idle after late updates: no run
    # was under way, nothing ends.
    (RunState.IDLE, RunEvent.END): (RunState.IDLE, False),
}


def run_advance(state: RunState, event: RunEvent) -> tuple[RunState, bool]:
    """The run's next state, and whether a run ended now (every pair is in the table)."""
    return RUN_TABLE[state, event]
