"""A hold's feedback counts the session's earlier interventions by what they were."""

from __future__ import annotations

import pytest

from monitor.core.decisions import Outcome
from monitor.core.feedback import HOLD_NOTE, feedback_text, is_hold_feedback, rejection_text
from monitor.core.findings import CallCycle

CYCLE = CallCycle(("read", "bash"), 3)


@pytest.mark.parametrize(
    ("interventions", "earlier", "counted"),
    [
        (1, (), "looped once (this run is stopped)"),
        # The trial's hold: two refusals before it, not "stopped 3 times".
        (
            3,
            (Outcome.BLOCKED, Outcome.REJECTED),
            "looped 3 times (before this one: 2 calls refused; this run is stopped)",
        ),
        (
            4,
            (Outcome.NUDGED, Outcome.BLOCKED, Outcome.ABORTED),
            "looped 4 times (before this one: 1 call refused, 1 run stopped, 1 warning; "
            "this run is stopped)",
        ),
        (
            3,
            (Outcome.HELD, Outcome.ABORTED),
            "looped 3 times (before this one: 1 run stopped, 1 hold; this run is stopped)",
        ),
        # Counted from the session's record by an earlier monitor, or not in yet.
        (
            3,
            (Outcome.ABORTED,),
            "looped 3 times (before this one: 1 run stopped, 1 other intervention; "
            "this run is stopped)",
        ),
        (
            3,
            (Outcome.DRY_RUN, Outcome.ANSWERED),
            "looped 3 times (before this one: 2 other interventions; this run is stopped)",
        ),
    ],
)
def test_a_hold_counts_earlier_interventions_by_name(interventions, earlier, counted):
    for text in (
        feedback_text(CYCLE, True, interventions, earlier),
        rejection_text(CYCLE, True, interventions, earlier),
    ):
        last = text.split("\n\n")[-1]
        assert last == f"This session has now {counted}, so it is {HOLD_NOTE}"
        assert is_hold_feedback(text)


def test_no_count_without_a_hold():
    text = feedback_text(CYCLE, False, 3, (Outcome.BLOCKED, Outcome.BLOCKED))
    assert "looped" not in text.split("\n\n")[-1] and not is_hold_feedback(text)
