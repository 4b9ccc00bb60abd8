"""A decision's life before its hand-over: where it waits, and the one table of how events
from every source move it on, until it is handed over or dropped.

`plan.decide` decides at once, but not every decision can be carried out at once: the loop's
call is about to be asked about by the plugin (which then refuses it in band), or by a
permission request (refused in band too); a refusal decided after its call ran waits for the
session's next call (`plan.withhold`); a monitor no plugin asks waits a moment for a call's
end, to tell the plugin's own refusal from a call that runs (`Tracker(own_refusal_wait=...)`).
Whatever the source of the event that ends the wait (the plugin's question, a permission
request, the stream, the time, the run's end), the tracker turns it into a `WaitEvent` and
does what the returned `Then` says: hand the decision to the plugin's answer, to the
request's refusal, or to the intervention's life (monitor/core/intervention.py), move it onto
the call the stream carried, or drop it.

In the manner of monitor/core/calls.py: every rule is a row of `TABLE` with the reason beside
it, and `advance` is the only thing that changes a wait's state. A wait is held where its key
is: on its call (`Call.waiting`), or, waiting for a call not seen yet, on its session
(`SessionRecord.waiting`). A wait once handed over or dropped stays so: later events of its
call are nothing to it.
"""

from __future__ import annotations

import enum

from monitor.core.decisions import Intervene

__all__ = ["TABLE", "Awaiting", "Then", "WaitEvent", "WaitState", "advance", "handed", "waiting"]


class WaitState(enum.StrEnum):
    """Where a decision waits."""

    # The loop's call ran on the stream first, in a session whose plugin asks before every
    # call: the plugin's question about it is on its way, and blocks it.
    AWAIT_QUESTION = "await_question"
    # The loop's call will ask permission (its like asked before): its request is refused.
    AWAIT_REQUEST = "await_request"
    # A refusal decided after its call ran, in a session whose plugin asks: the session's
    # next call is refused with it, in band, and the run goes on (`plan.withhold`).
    AWAIT_NEXT_CALL = "await_next_call"
    # A loop found at its call's start by a monitor no plugin asks: the call's end (the
    # plugin's own refusal, or a call that ran) or the wait's deadline hands it over.
    AWAIT_END = "await_end"
    # Handed over: answered, refused, or given to the intervention's life.
    HANDED_OVER = "handed_over"
    # Its call's run ended before anything asked: nothing of it is stopped any more.
    DROPPED = "dropped"


class WaitEvent(enum.StrEnum):
    """What can end or move a wait, from any source."""

    ASK = "ask"  # the plugin asks about the call (for a session's wait: about its next call)
    REQUEST = "request"  # the call's permission request comes
    RUN = "run"  # the stream carries the session's next call before the plugin asks about it
    END = "end"  # the call's final update, its run under way
    LATE_END = "late_end"  # the call's final update after its run ended
    DEADLINE = "deadline"  # the wait for the call's end is over (`Deadline.loop`)
    RUN_END = "run_end"  # the session's run ended (`Tracker.end_run`)


class Then(enum.StrEnum):
    """What the tracker does with the decision the event moved."""

    ANSWER = "answer"  # the plugin's answer carries it (a block, or the nudge's allow)
    REJECT = "reject"  # the permission request is refused with it
    CARRY_OUT = "carry_out"  # handed to the intervention's life, as any decision made now
    MOVE = "move"  # it waits on the call the stream carried, for that call's question
    DROP = "drop"  # nothing is done with it
    NOTHING = "nothing"  # the event is not this wait's: it stays where it was


S, E = WaitState, WaitEvent

# (state, event) -> (new state, what the tracker does). Missing pairs are NOTHING.
TABLE: dict[tuple[WaitState, WaitEvent], tuple[WaitState, Then]] = {
    # The plugin asks about the call: its answer blocks it. A permission request for it may
    # come first (the plugin and the gate both at work): the request is refused instead. The
    # call ending without either means the plugin fell open: the run is stopped after all,
    # unless its run is over already.
    (S.AWAIT_QUESTION, E.ASK): (S.HANDED_OVER, Then.ANSWER),
    (S.AWAIT_QUESTION, E.REQUEST): (S.HANDED_OVER, Then.REJECT),
    (S.AWAIT_QUESTION, E.END): (S.HANDED_OVER, Then.CARRY_OUT),
    (S.AWAIT_QUESTION, E.LATE_END): (S.DROPPED, Then.DROP),
    # Its request refuses it; should the plugin ask first, its answer does. A call that
    # finished without asking (an `always` reply let it through) is stopped by the abort.
    (S.AWAIT_REQUEST, E.REQUEST): (S.HANDED_OVER, Then.REJECT),
    (S.AWAIT_REQUEST, E.ASK): (S.HANDED_OVER, Then.ANSWER),
    (S.AWAIT_REQUEST, E.END): (S.HANDED_OVER, Then.CARRY_OUT),
    (S.AWAIT_REQUEST, E.LATE_END): (S.DROPPED, Then.DROP),
    # The session's next call: asked about by the plugin, it is refused now (never recorded:
    # the run's history started over with this decision); carried by the stream first (they
    # race), the wait moves onto that call, for its question. The run ending first releases
    # it: the shell finds its run over and tells the model for its next turn.
    (S.AWAIT_NEXT_CALL, E.ASK): (S.HANDED_OVER, Then.ANSWER),
    (S.AWAIT_NEXT_CALL, E.RUN): (S.AWAIT_QUESTION, Then.MOVE),
    (S.AWAIT_NEXT_CALL, E.RUN_END): (S.HANDED_OVER, Then.CARRY_OUT),
    # The call's end or the deadline, whichever comes first, hands it over, also when the
    # run ended meanwhile (someone stopped it: the shell finds it over), so no decision
    # goes unlogged. Whether the end was the plugin's own refusal is the tracker's to read.
    (S.AWAIT_END, E.END): (S.HANDED_OVER, Then.CARRY_OUT),
    (S.AWAIT_END, E.LATE_END): (S.HANDED_OVER, Then.CARRY_OUT),
    (S.AWAIT_END, E.DEADLINE): (S.HANDED_OVER, Then.CARRY_OUT),
}

# The states a wait begins in (a handed-over or dropped one is never made).
_BEGINS = (S.AWAIT_QUESTION, S.AWAIT_REQUEST, S.AWAIT_NEXT_CALL, S.AWAIT_END)
_HANDS = (Then.ANSWER, Then.REJECT, Then.CARRY_OUT)


class Awaiting:
    """A decision waiting for its hand-over, and where it is in that wait."""

    __slots__ = ("state", "decision")

    def __init__(self, state: WaitState, decision: Intervene) -> None:
        assert state in _BEGINS, state
        # Only `advance` changes it after this.
        self.state = state
        self.decision = decision


def advance(wait: Awaiting, event: WaitEvent) -> Then:
    """Move `wait` by `event`; what the tracker does about it. The one writer of `state`."""
    row = TABLE.get((wait.state, event))
    if row is None:
        return Then.NOTHING
    wait.state, then = row
    return then


def handed(wait: Awaiting | None, event: WaitEvent) -> Intervene | None:
    """`advance`, for a holder that may hold no wait: the decision, if the event hands it
    over (answered, refused or carried out); None if there is none or it waits on."""
    if wait is None or advance(wait, event) not in _HANDS:
        return None
    return wait.decision


def waiting(wait: Awaiting | None, state: WaitState) -> bool:
    """Whether a holder holds a wait in `state`."""
    return wait is not None and wait.state is state
