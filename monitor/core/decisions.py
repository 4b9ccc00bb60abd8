"""What the core tells the shell to do: stop a run (`Intervene`), answer a request (`Reply`).

Both are frozen values; the shell carries them out and reports back only through events
(`Tracker.feed`, `Tracker.expire`). `Outcome` names how an intervention ended, as the logs,
the metrics and the webhook carry it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from monitor.core.findings import Finding, Rule, TextPassage, fields

__all__ = ["Action", "Deadline", "Intervene", "Outcome", "Plan", "Reply"]


class Outcome(enum.StrEnum):
    """How one intervention ended (`intervention.outcome`)."""

    ABORTED = "aborted"
    NUDGED = "nudged"  # the feedback was posted while the run went on
    BLOCKED = "blocked"  # the plugin threw the feedback: the call never ran, the run goes on
    HELD = "held"
    REJECTED = "rejected"
    ANSWERED = "answered"  # a person answered the request within the grace period
    DRY_RUN = "dry_run"
    ABORT_FAILED = "abort_failed"
    CANCELLED = "cancelled"  # shutdown gave up on it
    # Another monitor of the same server intervened on this loop first: not acted on again.
    DEFERRED = "deferred"
    # Another monitor acts for this server (this one is its standby, monitor.shell.acting):
    # the loop is logged here and left to it.
    STANDBY = "standby"


class Action(enum.StrEnum):
    """How an intervention acts on the run: a rung of the ladder (docs/detection.md).

    `nudge` posts the feedback as a `noReply` message and lets the call and the run go on;
    `block` stops the call before it runs (the plugin throws, the permission request is
    refused) and lets the run go on (found after its call ran: the session's next call,
    `plan.withhold`), or, where no call can be blocked, stops the run as `stop` does;
    `stop` aborts the run, then posts the feedback. A hold is a `stop` whose
    feedback waits for a person (`Intervene.hold`).
    """

    NUDGE = "nudge"
    BLOCK = "block"
    STOP = "stop"


class Plan(enum.StrEnum):
    """What the shell does about a decision, made in the core (`plan.decide`): the shell
    carries it out by the channel it has and never works it out again.

    Where the loop's call asks first (the plugin, a permission request) it is refused with
    the rejection text; what follows depends on the plan.
    """

    NUDGE = "nudge"  # the call runs; the feedback is posted as a message, the run goes on
    # The call is refused and the run goes on; where it cannot be refused (it asked nobody),
    # the run is aborted, then the feedback posted.
    REFUSE = "refuse"
    STOP = "stop"  # refused where it asks; the run is aborted, then the feedback posted
    HOLD = "hold"  # as `stop`, and the feedback waits for a person
    # The same loop as an intervention of this run that stands for it (a burst in one step,
    # or a repetition while the run is being stopped): the call is refused where it asks,
    # and nothing else is done; it does not count on the ladder.
    DEFER = "defer"


@dataclass(frozen=True, slots=True)
class Intervene:
    """Stop this session's run and give the model `feedback`, for what `finding` says.

    `call_index` is how many calls the session's run had made when it was decided; `part_id`
    the part that completed the loop (the feedback goes after it).
    """

    session_id: str
    directory: str | None
    finding: Finding
    part_id: str
    call_index: int
    prior_interventions: int
    hold: bool
    escalated: bool
    feedback: str
    action: Action = Action.BLOCK
    plan: Plan = Plan.REFUSE
    # What the model reads as the refused call's result, where the call is refused.
    refusal: str = ""
    # The session's run it was decided in (`Tracker.run_over` says whether it has ended).
    run: int = 0
    # How the session's earlier interventions ended, as far as this monitor saw: a hold's
    # feedback counts them by name.
    prior_outcomes: tuple[Outcome, ...] = ()
    # The loop's call was refused already, by the plugin's own rule (no monitor answered its
    # question: `feedback.OWN_REFUSAL`): that refusal is this intervention's block, which the
    # ladder counts; a `stop` or a hold still stops the run.
    refused: bool = False
    # Which engine's routes act on the session: 1 the classic `/session/...`, 2 the new
    # engine's `/api/session/...` (`Tracker.route`, decided with the rest: the shell never
    # works it out again).
    route: int = 1
    # `fields()`, made at its first use: every decision logs them twice (`loop.detected`,
    # `intervention.outcome`).
    _fields: Mapping[str, object] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def rule(self) -> Rule:
        return self.finding.rule

    @property
    def position(self) -> int:
        """Where in its stream the loop was found: the call, or for a passage inside one
        part, the delta (what `loop.detected` logs as `call_index`, replay as `position`)."""
        if isinstance(self.finding, TextPassage):
            return self.finding.delta
        return self.call_index

    def fields(self) -> Mapping[str, object]:
        """What `loop.detected` says of a decision; `intervention.outcome` repeats it."""
        made = self._fields
        if made is None:
            made = self._make_fields()
            object.__setattr__(self, "_fields", made)  # frozen: set once, here
        return made

    def _make_fields(self) -> dict[str, object]:
        return dict(
            session_id=self.session_id,
            directory=self.directory,
            rule=str(self.rule),
            part_id=self.part_id,
            call_index=self.position,
            **fields(self.finding),
            interventions=self.prior_interventions + 1,
            escalated=self.escalated,
            action=str(self.action),
            plan=str(self.plan),
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer permission request `request_id`.

    `loop` is the loop this answer stops (always with `reject` and `message`, the text the
    model reads as the refused call's result); None for an approval. `wait` is a deadline:
    leave the request to others that long, then feed `Tracker.expire(request_id)`, which says
    whether to answer it after all.
    """

    request_id: str
    session_id: str
    directory: str | None
    reply: Literal["once", "reject"]
    message: str | None = None
    loop: Intervene | None = None
    wait: float = 0.0
    route: int = 1  # as `Intervene.route`


@dataclass(frozen=True, slots=True)
class Deadline:
    """A call's time bound: the call `part_id` of `session_id` started running; after `wait`
    seconds feed `Tracker.overdue(deadline)`, which says whether it is still running (a
    runaway, stopped like any loop) or has ended (nothing to do). Time enters the core only so:
    the shell keeps the clock."""

    session_id: str
    part_id: str
    wait: float
    # Not a time bound: the loop found at this call's start waited for its end (a refusal by
    # the plugin's own rule, `Tracker(own_refusal_wait=...)`); after `wait` it is carried out.
    loop: bool = False
