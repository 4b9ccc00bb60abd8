"""What counts as a loop and what to do about it: the tracker's settings (`Detection`), the
seed's rule set (`SEED`), and the rules a setting turns on (`rules_of`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from monitor.core.budget import Budget
from monitor.core.ladder import FirstAction, OnLoop
from monitor.core.limits import check_history, check_tree, derived_history
from monitor.core.permissions import PermissionMode
from monitor.core.profile import Profile
from monitor.core.rules import CallRule, TextRule
from monitor.core.rules.circles import CirclesRule
from monitor.core.rules.cycle import CycleRule
from monitor.core.rules.failure import FailureRule
from monitor.core.rules.no_progress import NoProgressRule
from monitor.core.rules.revisit import RevisitRule
from monitor.core.rules.runaway import RunawayRule
from monitor.core.rules.text_steps import StepsRule

__all__ = ["SEED", "Detection", "MatchMode", "log_fields", "rules_of"]

MatchMode = Literal["input", "input+output"]


@dataclass(frozen=True, slots=True)
class Detection:
    """What counts as a loop and what to do about it; the tracker's settings.

    `failure_repeats` (0: off) identical failures in a row are a loop (rule `failure`); a cycle
    holding a waiting call is one only after `wait_calls` calls (rule `wait`; 0: no allowance);
    `profile` says which arguments and tools are noise (monitor/core/profile.py). `history`
    is what the rules see (0: derived from what they need, monitor/core/limits.py); one that
    does not fit them raises DetectionError, a ValueError.
    The defaults are measured, see docs/detection.md; `SEED` is the original rule set.
    """

    max_period: int = 10
    repeats: int = 3
    history: int = 0
    match: MatchMode = "input"
    ignore_tools: frozenset[str] = frozenset()
    ignore_args: Mapping[str, frozenset[str]] | None = None
    on_loop: OnLoop = "resume"
    max_interventions: int = 2
    # The first rung of the intervention ladder (`Action`); later interventions block (or
    # stop, when the first does), and hold after `max_interventions` under `resume`.
    first_action: FirstAction = "block"
    # Runs a stopped loop stays armed for: the one stopped and the next (0: off, for replay,
    # whose recorded runs never saw the stops it reports).
    armed_runs: int = 2
    max_sessions: int = 10_000
    # Text loops (monitor/core/rules/text.py); 0 turns a check off.
    text_repeats: int = 5  # back-to-back repetitions of a passage inside one part
    text_steps: int = 8  # successive steps of a run with the same whole text
    failure_repeats: int = 4
    wait_calls: int = 20
    profile: Profile = "opencode"
    # Progress rules (monitor/core/rules/no_progress.py, revisit.py); 0 turns one off.
    no_progress_runs: int = 5  # runs of one check with the same result, each after changes
    revisits: int = 12  # of the last 16 calls, revisits that make a loop
    circles: int = 10  # of the last 12 calls, fruitless searches that make a loop
    # A call that runs away (monitor/core/rules/runaway.py): re-sent `running` updates in a
    # row whose streamed output ends in the same line over and over; 0 turns it off.
    runaway_updates: int = 20
    # Its time bound: a call still running this long after it started (0: derived from the
    # server's own limit, for bash only; below 0: none; `call_bound`).
    call_seconds: float = 0.0
    # Budgets (monitor/core/budget.py): per run, and per session with its subagents.
    run_budget: Budget = Budget()
    tree_budget: Budget = Budget()
    # Subagent trees (rule `tree`, monitor/core/budget.py): a new session more than this many
    # levels below its root, or a parent's child past this many in one run; 0 turns one off.
    tree_depth: int = 3
    tree_fanout: int = 20

    # How the server's permission requests are answered (monitor.core.permissions); "off"
    # leaves them all to others, and every loop to the abort.
    permissions: PermissionMode = "off"
    permission_grace: float = 30.0

    def __post_init__(self) -> None:
        if not self.history:
            derived = derived_history(self.max_period, self.repeats, self.wait_calls)
            object.__setattr__(self, "history", derived)  # frozen: set once, here
        check_history(self.history, self.max_period, self.repeats, self.wait_calls)
        check_tree(self.tree_depth, self.tree_fanout)


# Exactly the seed's behaviour: exact arguments, periods 1-4 repeated 3 times, a single call
# on its 4th, nothing else. `dataclasses.replace` it to keep other settings.
SEED = Detection(
    max_period=4,
    failure_repeats=0,
    wait_calls=0,
    profile="none",
    text_repeats=0,
    text_steps=0,
    no_progress_runs=0,
    revisits=0,
    circles=0,
    runaway_updates=0,
    call_seconds=-1.0,
    tree_depth=0,
    tree_fanout=0,
)


def rules_of(detection: Detection) -> tuple[list[CallRule], list[TextRule]]:
    """The rules a `Detection` turns on, in the order the tracker asks them."""
    call_rules: list[CallRule] = [
        CycleRule(detection.max_period, detection.repeats, detection.history, detection.wait_calls)
    ]
    if detection.failure_repeats:
        call_rules.append(FailureRule(detection.failure_repeats))
    if detection.no_progress_runs:
        call_rules.append(NoProgressRule(detection.no_progress_runs))
    if detection.revisits:
        call_rules.append(RevisitRule(detection.revisits))
    if detection.circles:
        call_rules.append(CirclesRule(detection.circles))
    if detection.runaway_updates:
        call_rules.append(RunawayRule(detection.runaway_updates))
    text_rules: list[TextRule] = []
    if detection.text_steps:
        steps = StepsRule(detection.text_steps)
        call_rules.append(steps)  # a new outcome between two texts starts its count again
        text_rules.append(steps)
    return call_rules, text_rules


def log_fields(detection: Detection) -> dict[str, object]:
    """The detection settings as JSON-friendly log fields (names and numbers only)."""
    fields: dict[str, object] = {}
    for field in dataclasses.fields(detection):
        value = getattr(detection, field.name)
        if isinstance(value, frozenset):
            value = sorted(value)
        elif field.name == "ignore_args":
            value = {tool: sorted(keys) for tool, keys in (value or {}).items()}
        elif isinstance(value, Budget):
            value = str(value)  # `off`, or as the setting is written: `steps=200,cost=5`
        fields[field.name] = value
    return fields
