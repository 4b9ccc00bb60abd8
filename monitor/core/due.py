"""Interventions decided but not carried out because the server went away, until it is back.

An abort that never got its answer, a feedback not yet posted: the shell keeps them here and
takes them out again after the next connect, when a read-back of the session tells what is
still to do (`next_step`). Bounded in count and in age: a monitor facing a server that stays
away does not hoard work, and work older than `max_age` is given up (the model has moved on
or a person has stepped in) rather than done late. Pure: time is an input.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from monitor.core.decisions import Intervene
from monitor.core.export import feedback_delivered, intervened

# At most this much work waits for the server; the oldest is given up first.
DUE_MAX = 256
# Work that waited this long for the server is given up, not done.
DUE_AGE_S = 300.0


class Step(enum.StrEnum):
    ABORT = "abort"  # the abort's answer was lost: whether the run stopped is unknown
    FEEDBACK = "feedback"  # the run is stopped, the feedback not known to be posted


@dataclass(frozen=True, slots=True)
class Due:
    decision: Intervene
    step: Step
    since: float
    # The loop's call was refused by us (the plugin threw our text, or we rejected its
    # request): that refusal in the record is ours, never another monitor's.
    ours: bool = False


class DueWork:
    """The due work, by loop (session and part), oldest first."""

    def __init__(self, limit: int = DUE_MAX, max_age: float = DUE_AGE_S) -> None:
        self._limit = limit
        self._max_age = max_age
        self._work: OrderedDict[tuple[str, str], Due] = OrderedDict()
        # When each loop's work was first kept: work taken out and kept again (the server
        # went away once more) keeps its age. Loops never recur, so old entries just fall off.
        self._first: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._work)

    def add(self, decision: Intervene, step: Step, now: float, ours: bool = False) -> list[Due]:
        """Keep `step` of `decision` for later; the work given up to make room."""
        key = (decision.session_id, decision.part_id)
        since = self._first.setdefault(key, now)
        while len(self._first) > 2 * self._limit:
            self._first.popitem(last=False)
        self._work.pop(key, None)
        self._work[key] = Due(decision, step, since, ours)
        dropped = []
        while len(self._work) > self._limit:
            dropped.append(self._work.popitem(last=False)[1])
        return dropped

    def take(self, now: float) -> tuple[list[Due], list[Due]]:
        """All of it, out of the record: (still to do, too old to do)."""
        work = list(self._work.values())
        self._work.clear()
        fresh = [due for due in work if now - due.since < self._max_age]
        return fresh, [due for due in work if now - due.since >= self._max_age]


def next_step(due: Due, busy: bool, messages: list[Any]) -> tuple[Step | None, str | None]:
    """What is left of `due` given the read-back (is the session busy, its messages), and
    what the read-back showed: (None, why) when nothing is left.

    An abort whose answer was lost stopped the run if the session is no longer busy (a
    restarted server has no run going either); its feedback is then due. Feedback already
    stored, ours or another monitor's, is not posted again.
    """
    decision = due.decision
    if due.step == Step.ABORT and busy:
        return Step.ABORT, None
    if feedback_delivered(messages, decision.feedback, decision.part_id):
        return None, "feedback found in the session"
    other = intervened(messages, decision.part_id, aborted=False, refused=not due.ours)
    if other is not None:
        return None, other
    return Step.FEEDBACK, None
