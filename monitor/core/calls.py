"""A tool call's life: its states and the one table of how events move it between them.

In the manner of h11's `_state.py`: every rule of a call's life is a row of `TABLE`, with
the reason beside it, and `advance` is the only thing that changes a call's state. Whatever
the source of an event (a part update on the stream, a part read back from the server's
record, the plugin's question, the permission gate, an intervention, the end of the run),
the tracker turns it into a `CallEvent` and does what the returned `Step` says. An event the
table does not allow is the named step `UNEXPECTED` (or `LATE`, for an event that comes
after the call's run ended), never a silent new call.

What a call carries that is data, not life (its identity, arguments, outcome, the request
that names it, the loop that waits for that request), stays on `Call`
(monitor/core/session.py).
"""

from __future__ import annotations

import enum
from typing import Protocol

__all__ = ["TABLE", "CallEvent", "CallState", "Step", "advance"]


class CallState(enum.StrEnum):
    """Where a call is in its life."""

    # Not seen yet: every call starts here, and its first event says where it goes.
    NEW = "new"
    # The plugin asked about it (before it runs) and the stream has not carried it yet.
    ASKED = "asked"
    # Recorded in the run's history (under match input+output: followed, recorded at its
    # outcome); its final update has not come.
    RUNNING = "running"
    # Its outcome is taken: read back finished, or its final update came.
    FINISHED = "finished"
    # The loop it belongs to was acted on, so the history it was recorded in started over:
    # its final update (often the abort's or the refusal's error) feeds no rule.
    CANCELLED = "cancelled"
    # Cancelled, and the abort (not a refusal) is what stops it: its permission request,
    # should one still come, must never be approved.
    STOPPED = "stopped"
    # Its run ended before its final update: what still comes for it is late (OpenCode sends
    # an aborted run's last tool updates after `session.idle`), never a new call.
    LATE = "late"


class CallEvent(enum.StrEnum):
    """What can happen to a call, from any source."""

    ASK = "ask"  # the plugin asks whether it may run
    RUN = "run"  # the stream carries its `running` update (bash re-sends it while it streams)
    FINISH = "finish"  # the stream carries its `completed` or `error` update
    READ_RUN = "read_run"  # read back from the record still running (`Tracker.seed`)
    READ_FINISH = "read_finish"  # read back from the record finished
    CUT = "cut"  # a loop was acted on: the run's history starts over
    ABORT = "abort"  # the gate leaves its loop to the abort
    # its run ended (idle, a resync found it over, a read-back replaces it or shows it
    # unfinished in a run that is over)
    END = "end"


class Step(enum.StrEnum):
    """What the tracker does with the event that moved the call."""

    RECORD = "record"  # add it to the run's history and ask the rules
    TAKE = "take"  # take its outcome and ask the rules
    RECORD_TAKE = "record_take"  # its one full update: both
    NOTHING = "nothing"  # the event changes the call's life only
    AGAIN = "again"  # a repeat of an update already taken
    LATE = "late"  # for a call whose run ended: counted nowhere
    UNEXPECTED = "unexpected"  # the table does not allow it: nothing, and said so


S, E = CallState, CallEvent

# (state, event) -> (new state, step). Missing pairs are UNEXPECTED (LATE from LATE).
TABLE: dict[tuple[CallState, CallEvent], tuple[CallState, Step]] = {
    # The first event of a call. A `running` update or the plugin's question records it
    # (where the plugin asks first, the stream's updates are matched to it later); a final
    # update of a call never seen running is its one full update, as is a finished part read
    # back. A call read back running is recorded as one seen live.
    (S.NEW, E.ASK): (S.ASKED, Step.RECORD),
    (S.NEW, E.RUN): (S.RUNNING, Step.RECORD),
    (S.NEW, E.FINISH): (S.FINISHED, Step.RECORD_TAKE),
    (S.NEW, E.READ_RUN): (S.RUNNING, Step.RECORD),
    (S.NEW, E.READ_FINISH): (S.FINISHED, Step.RECORD_TAKE),
    # First known from a read-back as unfinished in a run that is over (an aborted run's
    # calls end after the feedback that starts the next run): whatever comes of it is late.
    (S.NEW, E.END): (S.LATE, Step.NOTHING),
    # Asked by the plugin: the stream's first update of it is the same call, recorded already.
    (S.ASKED, E.RUN): (S.RUNNING, Step.NOTHING),
    (S.ASKED, E.FINISH): (S.FINISHED, Step.TAKE),
    (S.ASKED, E.CUT): (S.CANCELLED, Step.NOTHING),
    (S.ASKED, E.END): (S.LATE, Step.NOTHING),
    # Running: bash re-sends `running` while it streams (and a read-back sees it again);
    # its final update is its outcome. The plugin asking about a call the stream carried
    # first changes nothing here (the plugin's answer is the tracker's business).
    (S.RUNNING, E.RUN): (S.RUNNING, Step.AGAIN),
    (S.RUNNING, E.READ_RUN): (S.RUNNING, Step.AGAIN),
    (S.RUNNING, E.ASK): (S.RUNNING, Step.NOTHING),
    (S.RUNNING, E.FINISH): (S.FINISHED, Step.TAKE),
    (S.RUNNING, E.READ_FINISH): (S.FINISHED, Step.TAKE),
    (S.RUNNING, E.CUT): (S.CANCELLED, Step.NOTHING),
    (S.RUNNING, E.ABORT): (S.STOPPED, Step.NOTHING),
    (S.RUNNING, E.END): (S.LATE, Step.NOTHING),
    # Finished, kept only when read back: the stream may carry the same updates again (the
    # shell connects before it reads back, so an update in between reaches us twice).
    (S.FINISHED, E.RUN): (S.FINISHED, Step.AGAIN),
    (S.FINISHED, E.FINISH): (S.FINISHED, Step.AGAIN),
    (S.FINISHED, E.READ_RUN): (S.FINISHED, Step.AGAIN),
    (S.FINISHED, E.READ_FINISH): (S.FINISHED, Step.AGAIN),
    (S.FINISHED, E.CUT): (S.FINISHED, Step.NOTHING),
    (S.FINISHED, E.END): (S.LATE, Step.NOTHING),
    # Cancelled: its later updates are the intervention's doing, not the model's. The
    # plugin may still ask about it (its question raced the stream): answered, not recorded.
    (S.CANCELLED, E.RUN): (S.CANCELLED, Step.AGAIN),
    (S.CANCELLED, E.READ_RUN): (S.CANCELLED, Step.AGAIN),
    (S.CANCELLED, E.ASK): (S.CANCELLED, Step.NOTHING),
    (S.CANCELLED, E.FINISH): (S.CANCELLED, Step.AGAIN),
    (S.CANCELLED, E.READ_FINISH): (S.CANCELLED, Step.AGAIN),
    (S.CANCELLED, E.CUT): (S.CANCELLED, Step.NOTHING),
    (S.CANCELLED, E.ABORT): (S.STOPPED, Step.NOTHING),
    (S.CANCELLED, E.END): (S.LATE, Step.NOTHING),
    (S.STOPPED, E.RUN): (S.STOPPED, Step.AGAIN),
    (S.STOPPED, E.READ_RUN): (S.STOPPED, Step.AGAIN),
    (S.STOPPED, E.ASK): (S.STOPPED, Step.NOTHING),
    (S.STOPPED, E.FINISH): (S.STOPPED, Step.AGAIN),
    (S.STOPPED, E.READ_FINISH): (S.STOPPED, Step.AGAIN),
    (S.STOPPED, E.CUT): (S.STOPPED, Step.NOTHING),
    (S.STOPPED, E.ABORT): (S.STOPPED, Step.NOTHING),
    (S.STOPPED, E.END): (S.LATE, Step.NOTHING),
    # Late: its run is over. A read-back is the server's record of a run under way, the
    # one authority there is: it rebuilds the run, the call included, as new.
    (S.LATE, E.READ_RUN): (S.RUNNING, Step.RECORD),
    (S.LATE, E.READ_FINISH): (S.FINISHED, Step.RECORD_TAKE),
    (S.LATE, E.CUT): (S.LATE, Step.NOTHING),
    (S.LATE, E.END): (S.LATE, Step.NOTHING),
}

# Where a call stays for an event the table does not allow: what it says of the event.
_REFUSED = {state: Step.LATE if state is S.LATE else Step.UNEXPECTED for state in CallState}


class HasState(Protocol):
    state: CallState


def advance(call: HasState, event: CallEvent) -> Step:
    """Move `call` by `event`; what the tracker does about it. The one writer of `state`."""
    row = TABLE.get((call.state, event))
    if row is None:
        return _REFUSED[call.state]
    call.state, step = row
    return step
