"""What each kind of finding allows the plan, said by the finding (issue 30: no lists of
kinds where it is used)."""

from __future__ import annotations

import typing

import pytest

from monitor.core import findings
from monitor.core.findings import CallCycle, FailureRun, Finding, TextPassage, named

# kind: (names its calls, a nudge reaches it, its next call can be refused)
ALLOWS = {
    "CallCycle": (True, True, True),
    "EndlessWait": (True, True, True),
    "FailureRun": (True, True, True),
    "DoomLoop": (True, True, True),
    "LoopAgain": (True, True, True),
    "TextPassage": (False, False, True),
    "RunawayCall": (False, False, True),
    "TreeShape": (False, False, False),
    "TextSteps": (False, True, True),
    "NoProgress": (False, True, True),
    "Revisit": (False, True, True),
    "SearchCircles": (False, True, True),
    "BudgetSpent": (False, True, True),
}


def test_every_kind_of_finding_is_listed() -> None:
    assert {kind.__name__ for kind in typing.get_args(Finding)} == set(ALLOWS)


@pytest.mark.parametrize(("kind", "allows"), ALLOWS.items())
def test_what_a_kind_of_finding_allows(kind: str, allows: tuple[bool, bool, bool]) -> None:
    cls = getattr(findings, kind)
    assert (cls.names_calls, cls.reads_nudge, cls.refusable) == allows
    assert "__dict__" not in dir(cls)  # slotted all the way down: no dict per finding


def test_a_finding_named_as_its_server_names_its_tools() -> None:
    names = {"bash": "shell", "task": "subagent"}
    assert named(CallCycle(("read", "bash"), 3), names) == CallCycle(("read", "shell"), 3)
    assert (
        named(FailureRun("bash", 4), names).describe() == "the same error 4 times in a row (shell)"
    )
    assert named(FailureRun("edit", 4), names) == FailureRun("edit", 4)
    passage = TextPassage("text", 1, 12, 40)  # no tool: the same finding
    assert named(passage, names) is passage
