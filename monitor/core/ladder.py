"""The intervention ladder: how the nth intervention in a session acts (docs/detection.md).

The first takes `first_action`; later ones block (or stop, when the first stops); after
`max_interventions` under `on_loop = resume`, or always under `hold`, the session is held:
its run is stopped and the feedback waits for a person. Only a new loop climbs: the same
loop again within one intervention (`Plan.DEFER`) is not counted (monitor/core/tracker.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from monitor.core.decisions import Action, Plan

__all__ = ["FirstAction", "OnLoop", "rung"]

OnLoop = Literal["resume", "hold"]
FirstAction = Literal["nudge", "block", "stop"]


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung: the action it logs, whether it holds, whether the ladder ran out to it,
    and what the shell is to do."""

    action: Action
    hold: bool
    escalated: bool
    plan: Plan


def rung(on_loop: OnLoop, max_interventions: int, first: FirstAction, prior: int) -> Rung:
    """The rung of an intervention after `prior` others in the session."""
    escalated = on_loop == "resume" and prior >= max_interventions
    hold = escalated or on_loop == "hold"
    if hold:
        return Rung(Action.STOP, True, escalated, Plan.HOLD)
    if prior == 0:
        action = Action(first)
    else:
        action = Action.STOP if first == "stop" else Action.BLOCK
    return Rung(action, False, escalated, _PLANS[action])


_PLANS = {Action.NUDGE: Plan.NUDGE, Action.BLOCK: Plan.REFUSE, Action.STOP: Plan.STOP}
