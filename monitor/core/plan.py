"""The plan: how a finding becomes a decision (`decide`), whichever rule found it.

From the finding and what the session's record says (the intervention that stands for this
run, the ladder's rung, whether the plugin asks, whether its own rule refused the call) to
one `Intervene` with its plan, its feedback and its refusal text. What the shell does with
it is the intervention's life (monitor/core/intervention.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from monitor.core.calls import CallEvent, advance
from monitor.core.decisions import Action, Intervene, Outcome, Plan
from monitor.core.detection import Detection
from monitor.core.feedback import (
    OWN_REFUSALS,
    feedback_text,
    nudge_text,
    refusal_after_text,
    rejection_text,
)
from monitor.core.findings import (
    FailureRun,
    Finding,
    named,
)
from monitor.core.handover import Awaiting, WaitState, waiting
from monitor.core.ladder import rung
from monitor.core.profile import NO_NAMES
from monitor.core.rules.failure import failed_as
from monitor.core.session import Acted, SessionRecord

__all__ = ["decide", "own_refusal", "refused", "withhold"]


def decide(
    session: SessionRecord,
    session_id: str,
    finding: Finding,
    part_id: str,
    detection: Detection,
    directory: str | None,
    rearm: bool = True,
    route: int = 1,
    calls: frozenset[int] | None = None,
    names: Mapping[str, str] = NO_NAMES,
) -> Intervene:
    """The one way a finding becomes a decision, whichever rule found it.

    One loop, one intervention: a finding of the same calls as the intervention that
    stands in this run, while it is being stopped or within the same model step (a burst
    of identical calls in one step is one loop), is that intervention again (`DEFER`):
    its call is refused where it asks, and the ladder does not climb. A new loop, or the
    same one in a later step after a refusal or a nudge, climbs. `calls` are the loop's
    calls where the finding names them itself (a `doom_loop` request, by its arguments);
    else they are the run's last calls, as many as the finding's shape says. `names`: the
    server's names of the tools the rules know by 1.x's names (`profile.ENGINE_NAMES` on a
    2.x server).
    """
    # The rules know a call by its 1.x name; the decision, its texts and its log name it as
    # its server does (2.x's `shell`): nothing decides by a finding's tool names.
    finding = named(finding, names)
    # Only loops of repeated calls name their calls (by digest): text, progress and
    # budget findings name none to refuse again, and are never the same loop.
    repeats = finding.names_calls
    found_on = session.call(part_id)
    refused = found_on is not None and own_refusal(found_on.error)
    loop: frozenset[int] | None = None
    if repeats:
        if calls is not None:
            loop = calls
        elif rearm:
            loop = frozenset(session.block(finding.shape()[0]))
            failed = found_on if isinstance(finding, FailureRun) else None
            how = None if failed is None else failed_as(failed)
            if how is not None:
                loop |= {how}  # and how it failed: that failure is the loop too
        else:
            loop = session.armed
    # Later updates of the parts already recorded must not fire again, so the history
    # and the rules' state start over; the calls in flight stay to keep recognising those
    # parts, and their outcomes (the abort ends them in error) are not taken. Under
    # input+output no call is recorded before its outcome: none is cut.
    session.restart()
    if detection.match == "input":
        for call in (session.in_flight or {}).values():
            advance(call, CallEvent.CUT)
    acted = session.acted
    if loop and acted is not None and acted.same(loop, session.step):
        # That intervention again, with texts written for this finding rather than copied
        # from it: a call of its loop, or a part of it (a `doom_loop` request naming one of
        # its calls), is refused for what it did itself (issue 47).
        stands = acted.decision
        feedback, refusal = _texts(
            finding,
            stands.plan,
            stands.hold,
            stands.prior_interventions,
            stands.prior_outcomes,
        )
        return dataclasses.replace(
            stands,
            finding=finding,
            part_id=part_id,
            call_index=session.calls,
            plan=Plan.DEFER,
            feedback=feedback,
            refusal=refusal,
            refused=refused,
        )
    if repeats:
        runs = detection.armed_runs
        if rearm:
            session.arm(tuple(loop or ()), finding, runs)
        else:
            session.armed_runs = runs  # armed again for this run and the next
    session.intervened_part = part_id
    prior = session.interventions
    session.interventions += 1
    step = rung(detection.on_loop, detection.max_interventions, detection.first_action, prior)
    if (step.plan == Plan.NUDGE and not finding.reads_nudge) or (
        step.plan == Plan.REFUSE and not finding.refusable
    ):
        # What the ladder chose cannot reach this loop (a call that does not end, a part
        # repeating itself until its token limit, a root waiting on its subagents): only the
        # abort stops it, whatever the first action.
        step = dataclasses.replace(step, action=Action.STOP, plan=Plan.STOP)
    feedback, refusal = _texts(finding, step.plan, step.hold, prior, session.outcomes)
    decision = Intervene(
        session_id=session_id,
        directory=session.directory or directory,
        finding=finding,
        part_id=part_id,
        call_index=session.calls,
        prior_interventions=prior,
        hold=step.hold,
        escalated=step.escalated,
        feedback=feedback,
        action=step.action,
        plan=step.plan,
        refusal=refusal,
        run=session.runs,
        prior_outcomes=session.outcomes,
        refused=refused,
        route=route,
    )
    if loop:
        session.acted = Acted(decision, loop, session.step)
    if step.plan in _ABORTS or (step.plan is Plan.REFUSE and not session.plugin):
        # The run is aborted (a block aborts where no plugin refuses the call in band): what
        # its calls' ends bring from now until it ends is the abort's doing, not the model's.
        session.stopping = decision
    return decision


def _texts(
    finding: Finding, plan: Plan, hold: bool, prior: int, earlier: tuple[Outcome, ...]
) -> tuple[str, str]:
    """The feedback and the refusal text of a decision for `finding`, after `prior`
    interventions that ended as `earlier` says: each says what this finding is."""
    if plan == Plan.NUDGE:
        feedback = nudge_text(finding, prior + 1)
    else:
        feedback = feedback_text(finding, hold, prior + 1, earlier)
    return feedback, rejection_text(finding, hold, prior + 1, earlier)


# The plans whose decision aborts the run whatever the channel.
_ABORTS = (Plan.STOP, Plan.HOLD)


def refused(session: SessionRecord, decision: Intervene) -> Intervene:
    """`decision`, its call refused by the plugin's own rule: this intervention's block."""
    refused = dataclasses.replace(decision, refused=True)
    if session.acted is not None and session.acted.decision is decision:
        session.acted.decision = refused  # its outcome is reported for this one
    return refused


def withhold(session: SessionRecord, decision: Intervene) -> Intervene | None:
    """A refusal decided after its call ran (the failure it repeats came back, the check
    that shows no progress, the step that spent the budget), in a session whose plugin
    asks before every call: nothing is left to refuse, but the session's next call is, in
    band, with this feedback, and the run goes on (`Tracker.judge`,
    `ToolUpdates._awaits_refusal`). Kept for that call, waiting in the session's record
    (`SessionRecord.waiting`, monitor/core/handover.py; None to carry out now); the run
    ending first releases it (`Tracker.end_run`). A stop or a hold still stops the run; one
    refusal waits for the next call at a time."""
    if (
        decision.plan is not Plan.REFUSE
        or not session.plugin
        or waiting(session.waiting, WaitState.AWAIT_NEXT_CALL)
    ):
        return decision
    refusal = refusal_after_text(
        decision.finding, decision.prior_interventions + 1, decision.prior_outcomes
    )
    pending = dataclasses.replace(decision, refusal=refusal)
    session.waiting = Awaiting(WaitState.AWAIT_NEXT_CALL, pending)
    if session.acted is not None and session.acted.decision is decision:
        session.acted.decision = pending  # its outcome is reported for this one
    return None


def own_refusal(error: object) -> bool:
    """Whether a call's error is the plugin's own refusal (no monitor answered it)."""
    return isinstance(error, str) and error.startswith(OWN_REFUSALS)
