"""An intervention's life, from a loop found to its outcome: its states and the one table of
how the results of its requests move it between them.

In the manner of h11's `_state.py` and of `monitor.core.calls`: the channel an intervention
takes is chosen once, when it begins (`found`, `refused_call`, `request`, `standby`), from the
decision and the facts the shell has (a dry run, a plugin that refused the call, a permission
request, another monitor that acts for this server). From then on every rule of its life is a
row of `TABLE` with the reason beside it: the shell carries out the one `Command` a state asks
for (read the session's record, abort, post the feedback, answer the request, wait for the
next connect), feeds back what came of it (`Read`, `Sent`, `Expired`, `Resumed`, `Cancelled`,
`Dropped`) and logs the `Report`s the move made. The shell never looks at a plan, a rule or
an outcome; it only executes.

What is read in the record is judged here too (`_judge`): another monitor's refusal, abort or
feedback means this loop is someone else's (`deferred`); a run that ended by itself means the
stop comes too late and the model is told once, for its next turn.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from monitor.core.decisions import Intervene, Outcome, Plan, Reply
from monitor.core.export import answered, feedback_delivered, intervened
from monitor.core.findings import Rule

__all__ = [
    "FEEDBACK_FOUND",
    "RECENT_MESSAGES",
    "REFUSED_READS",
    "REFUSED_READ_EVERY_S",
    "TABLE",
    "Abort",
    "Answer",
    "Cancelled",
    "Command",
    "Decided",
    "Dropped",
    "Effect",
    "Event",
    "Expired",
    "Forget",
    "Happened",
    "Intervention",
    "Logged",
    "Park",
    "Post",
    "Read",
    "ReadBack",
    "ReadRecent",
    "Report",
    "Result",
    "Resumed",
    "Sent",
    "State",
    "Turn",
    "Wait",
    "again",
    "found",
    "refused_call",
    "request",
    "standby",
]

# The check before acting reads only the newest messages: the loop's call is in the run's
# last steps, and another monitor's answer to it comes right after. A session's whole record
# can be megabytes, and this read delays the abort.
RECENT_MESSAGES = 20
# Where another monitor may answer the loop's call a moment after we see it (it answers the
# plugin, or answered the permission request first), or where a run found over may have been
# stopped by one (its mark comes a moment after the run's end): the record is read this many
# times, this far apart.
REFUSED_READS = 3
REFUSED_READ_EVERY_S = 0.1
# What a read-back finds when our own feedback was stored before the server went away.
FEEDBACK_FOUND = "feedback found in the session"


class State(enum.StrEnum):
    """Where an intervention is in its life."""

    # Reading the newest record before a stop: another monitor may have acted already.
    CHECK = "check"
    # The same before a nudge (the run goes on, so a run that ended changes nothing).
    NUDGE_CHECK = "nudge_check"
    # The run is over before our abort: reading whether another monitor stopped it.
    OVER = "over"
    # Aborting the run (then the feedback).
    ABORT = "abort"
    # Aborting the run of a refused `doom_loop` request: OpenCode ends that run by itself, but
    # seconds later, and feedback posted meanwhile is lost (../shared/opencode/NOTES.md).
    DOOM_ABORT = "doom_abort"
    # A permission request left to a person for a while before we answer it.
    GRACE = "grace"
    # Refusing the permission request of the loop's call.
    REPLY = "reply"
    # Reading the record once more before the feedback: of two monitors that stopped one loop
    # at once, the one whose (random) wait was longer finds the other's feedback.
    FEEDBACK_CHECK = "feedback_check"
    # Posting the feedback.
    POST = "post"
    # The server went away during the abort, or during the post: waiting for the next connect.
    DUE_ABORT = "due_abort"
    DUE_FEEDBACK = "due_feedback"
    # Connected again: reading the session back to learn what is left to do.
    RECHECK_ABORT = "recheck_abort"
    RECHECK_FEEDBACK = "recheck_feedback"
    DONE = "done"


class Event(enum.StrEnum):
    """What came of a state's command, as the table sees it (`Intervention._judge`)."""

    OTHER = "other"  # the record shows another monitor's intervention (or our own feedback)
    NOTHING = "nothing"  # nothing there yet, and another read is due
    ENDED = "ended"  # the run is over (before the abort), or ended by itself (the model answered)
    CLEAR = "clear"  # nothing there (or the record cannot be read: better act twice than never)
    BUSY = "busy"  # read back after a connect: the run still goes on
    OK = "ok"  # the request was answered as asked
    REFUSED_STOP = "refused_stop"  # the permission request is refused; the plan stops the run
    REFUSED_DOOM = "refused_doom"  # a `doom_loop` request is refused; its run must end first
    FIRST = "first"  # the permission request was answered by someone else first
    AWAY = "away"  # the server never answered: the work waits for the next connect
    FAILED = "failed"  # the server answered with an error (or the session is gone)
    EXPIRED = "expired"  # the grace period ended with the request still unanswered
    ANSWERED = "answered"  # a person answered the request within the grace period
    RESUMED = "resumed"  # the server answers again
    CANCELLED = "cancelled"  # shutdown
    DROPPED = "dropped"  # given up: too old, no room, or a bug of ours


class Effect(enum.StrEnum):
    """What a move reports (`Intervention._effect`)."""

    NONE = "none"
    DEFERRED = "deferred"  # outcome deferred: another monitor intervened on this loop
    NUDGED = "nudged"  # outcome nudged: the feedback follows, the run goes on
    NUDGED_LATE = "nudged_late"  # the run ended by itself: the feedback waits for its next turn
    STOPPED = "stopped"  # outcome aborted (or held): the feedback follows
    REJECTED = "rejected"  # outcome rejected: the call did not run
    ANSWERED = "answered"  # outcome answered: a person answered the request
    ABORT_FAILED = "abort_failed"
    CANCELLED = "cancelled"  # outcome cancelled: shutdown came before it was known
    CONFIRMED = "confirmed"  # the lost abort's run is stopped (read back): its outcome
    CONFIRMED_FOUND = "confirmed_found"  # ... and the feedback is in the session already
    FOUND = "found"  # the feedback (ours, or another monitor's) is in the session already
    SENT = "sent"  # feedback.sent
    FEEDBACK_FAILED = "feedback_failed"
    KEEP = "keep"  # intervention.due: waits for the next connect


S, E, X = State, Event, Effect

# Shared rows: shutdown and giving up. Before the outcome is known the intervention ends
# cancelled (or failed, with why); after it, what is lost is the feedback.
_BEFORE = {
    (s, e): (S.DONE, x)
    for s in (S.CHECK, S.NUDGE_CHECK, S.OVER, S.ABORT, S.DOOM_ABORT, S.GRACE, S.REPLY)
    for e, x in ((E.CANCELLED, X.CANCELLED), (E.DROPPED, X.ABORT_FAILED))
}
_AFTER = {
    (s, e): (S.DONE, X.FEEDBACK_FAILED)
    for s in (S.FEEDBACK_CHECK, S.POST, S.DUE_FEEDBACK, S.RECHECK_FEEDBACK)
    for e in (E.CANCELLED, E.DROPPED)
}

# (state, event) -> (new state, effect). A pair not here is a bug of ours: `feed` raises.
TABLE: dict[tuple[State, Event], tuple[State, Effect]] = {
    **_BEFORE,
    **_AFTER,
    # Before a stop. Another monitor acted: its intervention stands for the loop. Where its
    # answer may still be on its way, read again. A run over already is checked for whose
    # doing that was; otherwise stop it.
    (S.CHECK, E.OTHER): (S.DONE, X.DEFERRED),
    (S.CHECK, E.NOTHING): (S.CHECK, X.NONE),
    (S.CHECK, E.ENDED): (S.OVER, X.NONE),
    (S.CHECK, E.CLEAR): (S.ABORT, X.NONE),
    # Before a nudge: the run goes on either way, so only another monitor's doing matters.
    (S.NUDGE_CHECK, E.OTHER): (S.DONE, X.DEFERRED),
    (S.NUDGE_CHECK, E.NOTHING): (S.NUDGE_CHECK, X.NONE),
    (S.NUDGE_CHECK, E.ENDED): (S.FEEDBACK_CHECK, X.NUDGED),
    (S.NUDGE_CHECK, E.CLEAR): (S.FEEDBACK_CHECK, X.NUDGED),
    # The run ended before our abort. Stopped by another monitor, its mark shows a moment
    # after the end (read a few times); ended by itself (the model answered, or we cannot
    # tell), stopping it stops nothing, or the next run: the model is told once, for its
    # next turn. Neither answer nor mark: stopped all the same (a person, a late mark).
    (S.OVER, E.OTHER): (S.DONE, X.DEFERRED),
    (S.OVER, E.NOTHING): (S.OVER, X.NONE),
    (S.OVER, E.ENDED): (S.FEEDBACK_CHECK, X.NUDGED_LATE),
    (S.OVER, E.CLEAR): (S.DONE, X.DEFERRED),
    # The abort. A server away may have stopped the run or not: the next connect reads it.
    (S.ABORT, E.OK): (S.FEEDBACK_CHECK, X.STOPPED),
    (S.ABORT, E.AWAY): (S.DUE_ABORT, X.KEEP),
    (S.ABORT, E.FAILED): (S.DONE, X.ABORT_FAILED),
    # After a refused doom_loop request: the refusal is the intervention, the abort only
    # clears the way for the feedback. Without it the feedback would be lost: none is sent.
    (S.DOOM_ABORT, E.OK): (S.FEEDBACK_CHECK, X.REJECTED),
    (S.DOOM_ABORT, E.AWAY): (S.DONE, X.ABORT_FAILED),
    (S.DOOM_ABORT, E.FAILED): (S.DONE, X.ABORT_FAILED),
    # The grace period: a person at the TUI may answer first.
    (S.GRACE, E.EXPIRED): (S.REPLY, X.NONE),
    (S.GRACE, E.ANSWERED): (S.DONE, X.ANSWERED),
    # The refusal. Refused, the call did not run: a block is done (its text is the feedback),
    # a stop goes on to the abort. Answered first (by another monitor, whose refusal shows a
    # moment later, or by someone else: the call may be running) or not sent at all, the
    # loop is stopped as one without a request.
    (S.REPLY, E.OK): (S.DONE, X.REJECTED),
    (S.REPLY, E.REFUSED_STOP): (S.ABORT, X.NONE),
    (S.REPLY, E.REFUSED_DOOM): (S.DOOM_ABORT, X.NONE),
    (S.REPLY, E.FIRST): (S.CHECK, X.NONE),
    (S.REPLY, E.AWAY): (S.CHECK, X.NONE),
    (S.REPLY, E.FAILED): (S.CHECK, X.NONE),
    # The feedback, unless another monitor's is in the session by now.
    (S.FEEDBACK_CHECK, E.OTHER): (S.DONE, X.FOUND),
    (S.FEEDBACK_CHECK, E.CLEAR): (S.POST, X.NONE),
    (S.POST, E.OK): (S.DONE, X.SENT),
    (S.POST, E.AWAY): (S.DUE_FEEDBACK, X.KEEP),
    (S.POST, E.FAILED): (S.DONE, X.FEEDBACK_FAILED),
    # Waiting for the server. Given up (too old, no room, shutdown): said so, for the stop or
    # for the feedback.
    (S.DUE_ABORT, E.RESUMED): (S.RECHECK_ABORT, X.NONE),
    (S.DUE_ABORT, E.CANCELLED): (S.DONE, X.ABORT_FAILED),
    (S.DUE_ABORT, E.DROPPED): (S.DONE, X.ABORT_FAILED),
    (S.DUE_FEEDBACK, E.RESUMED): (S.RECHECK_FEEDBACK, X.NONE),
    # Read back after a connect. A run still going was not stopped: stop it now (the check
    # first). One no longer going was stopped, by the abort or by the server's restart: its
    # feedback is due, unless it is stored (ours before the server went away, or another
    # monitor's). Away again: wait again.
    (S.RECHECK_ABORT, E.BUSY): (S.CHECK, X.NONE),
    (S.RECHECK_ABORT, E.OTHER): (S.DONE, X.CONFIRMED_FOUND),
    (S.RECHECK_ABORT, E.CLEAR): (S.POST, X.CONFIRMED),
    (S.RECHECK_ABORT, E.AWAY): (S.DUE_ABORT, X.KEEP),
    (S.RECHECK_ABORT, E.FAILED): (S.DONE, X.ABORT_FAILED),
    (S.RECHECK_ABORT, E.CANCELLED): (S.DONE, X.CANCELLED),
    (S.RECHECK_ABORT, E.DROPPED): (S.DONE, X.ABORT_FAILED),
    (S.RECHECK_FEEDBACK, E.OTHER): (S.DONE, X.FOUND),
    (S.RECHECK_FEEDBACK, E.CLEAR): (S.POST, X.NONE),
    (S.RECHECK_FEEDBACK, E.AWAY): (S.DUE_FEEDBACK, X.KEEP),
    (S.RECHECK_FEEDBACK, E.FAILED): (S.DONE, X.FEEDBACK_FAILED),
}


# -- what the shell is told to do --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadRecent:
    """Read the session's newest `last` messages (after `pause` seconds, or a random stagger),
    and whether the decision's run is over (`Tracker.run_over`); feed `Read`."""

    decision: Intervene
    last: int
    pause: float = 0.0
    staggered: bool = False

    @property
    def at_once(self) -> bool:
        """Sent without a wait (the first check before a stop or a nudge)."""
        return not self.staggered and not self.pause


@dataclass(frozen=True, slots=True)
class ReadBack:
    """Read the session's whole record, and (`busy`) whether it is busy; feed `Read`, or
    `Sent` with the failure."""

    decision: Intervene
    busy: bool


@dataclass(frozen=True, slots=True)
class Abort:
    """Abort the session's run, by its engine's routes (`route`, as `Intervene.route`); feed
    `Sent`."""

    session_id: str
    directory: str | None
    route: int


@dataclass(frozen=True, slots=True)
class Post:
    """Post the feedback after part `after_part`, by the session's engine's routes; feed
    `Sent`."""

    session_id: str
    directory: str | None
    text: str
    no_reply: bool
    after_part: str
    route: int


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the permission request; feed `Sent` (result `NOT_TAKEN`: answered first)."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait `reply.wait` seconds, then feed `Expired` with `Tracker.expire(reply)`."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Park:
    """Keep the intervention until the server answers again; then feed `Resumed`."""

    session_id: str
    part_id: str


Command = ReadRecent | ReadBack | Abort | Post | Answer | Wait | Park


# -- what came of it ---------------------------------------------------------------------------


class Result(enum.StrEnum):
    OK = "ok"
    NOT_TAKEN = "not_taken"  # a permission answer the server did not take: answered first
    AWAY = "away"  # no answer at all (connection refused, timed out)
    GONE = "gone"  # the session is not there (404)
    FAILED = "failed"  # any other error


@dataclass(frozen=True, slots=True)
class Read:
    """The record read (None: it could not be read), whether the run is over, and whether
    the session is busy (for `ReadBack`)."""

    messages: list[Any] | None
    run_over: bool = False
    busy: bool = False


@dataclass(frozen=True, slots=True)
class Sent:
    """How a request ended, and how long it took."""

    result: Result
    error: str | None = None
    ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Expired:
    """The grace period ended: what to answer now (None: somebody answered meanwhile)."""

    reply: Reply | None


@dataclass(frozen=True, slots=True)
class Resumed:
    pass


@dataclass(frozen=True, slots=True)
class Cancelled:
    error: str = "cancelled at shutdown"


@dataclass(frozen=True, slots=True)
class Dropped:
    error: str


Happened = Read | Sent | Expired | Resumed | Cancelled | Dropped


# -- what the shell reports ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Logged:
    """A log line: `level` is structlog's method name."""

    level: str
    event: str
    fields: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Decided:
    """The intervention's outcome: logged as `intervention.outcome`, counted."""

    decision: Intervene
    outcome: Outcome
    fields: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Forget:
    """The session is gone from the server: the tracker forgets it."""

    session_id: str


Report = Logged | Decided | Forget


@dataclass(frozen=True, slots=True)
class Turn:
    """What one move reports, and the command of the state it moved to (None: done, or
    nothing to carry out)."""

    reports: tuple[Report, ...] = ()
    command: Command | None = None


# -- one intervention ----------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Intervention:
    """One intervention's life. `state` changes only through `feed`; the rest is what the
    commands are made of."""

    decision: Intervene
    state: State
    # The loop's call was refused by us (the plugin threw our text, or we refused its
    # request): that refusal in the record is ours, never another monitor's.
    ours: bool = False
    # Reads of the record still to make before a check is done.
    reads: int = 1
    # The feedback waits a random stagger first (see `FEEDBACK_CHECK`).
    stagger: bool = True
    no_reply: bool = False
    reply: Reply | None = None
    # Logged with the outcome: how the intervention came to be (via, call_id, request_id...).
    fields: dict[str, object] = field(default_factory=dict)
    # Why the last read judged the loop someone else's.
    _reason: str | None = None
    _first_read: bool = True

    def command(self) -> Command | None:
        """What the current state asks the shell to do."""
        decision = self.decision
        state = self.state
        if state in (S.CHECK, S.NUDGE_CHECK, S.OVER):
            pause = 0.0 if self._first_read else REFUSED_READ_EVERY_S
            return ReadRecent(decision, RECENT_MESSAGES, pause)
        if state == S.FEEDBACK_CHECK:
            return ReadRecent(decision, RECENT_MESSAGES, staggered=self.stagger)
        if state in (S.ABORT, S.DOOM_ABORT):
            return Abort(decision.session_id, decision.directory, decision.route)
        if state == S.GRACE:
            assert self.reply is not None
            return Wait(self.reply)
        if state == S.REPLY:
            assert self.reply is not None
            return Answer(self.reply)
        if state == S.POST:
            no_reply = self.no_reply or decision.plan in (Plan.HOLD, Plan.NUDGE)
            return Post(
                decision.session_id,
                decision.directory,
                decision.feedback,
                no_reply,
                decision.part_id,
                decision.route,
            )
        if state in (S.DUE_ABORT, S.DUE_FEEDBACK):
            return Park(decision.session_id, decision.part_id)
        if state in (S.RECHECK_ABORT, S.RECHECK_FEEDBACK):
            return ReadBack(decision, busy=state == S.RECHECK_ABORT)
        return None

    def feed(self, happened: Happened) -> Turn:
        """Move by what came of the last command (or by a shutdown, a give-up, a connect):
        the reports of the move and the next command. The one writer of `state`."""
        event = self._judge(happened)
        row = TABLE.get((self.state, event))
        if row is None:
            raise AssertionError(f"intervention in {self.state} cannot take {event}")
        before = self.state
        if isinstance(happened, Sent):
            self._timed(happened)
        self.state, effect = row
        reports = self._effect(effect, happened)
        if self.state == before and event == E.NOTHING:
            self.reads -= 1
            self._first_read = False
        elif self.state != before:
            self._first_read = True
            self.reads = self._reads_for(before, event)
        return Turn(reports, self.command())

    def _reads_for(self, before: State, event: Event) -> int:
        """Reads the check entered now makes: several where an answer may be on its way."""
        if self.state == S.OVER or (before == S.REPLY and event == E.FIRST):
            return REFUSED_READS
        return 1

    def _timed(self, sent: Sent) -> None:
        """How long an abort took (answered, well or not), or a refusal that was taken."""
        name = _MS.get(self.state)
        if name is not None and sent.result != Result.AWAY:
            if self.state != S.REPLY or sent.result == Result.OK:
                self.fields[name] = sent.ms

    def _judge(self, happened: Happened) -> Event:
        """What the table sees of a result: the record judged, a request's end named."""
        if isinstance(happened, Read):
            return self._judge_read(happened)
        if isinstance(happened, Sent):
            return self._judge_sent(happened)
        if isinstance(happened, Expired):
            if happened.reply is None:
                return E.ANSWERED
            self.reply = happened.reply
            return E.EXPIRED
        if isinstance(happened, Resumed):
            return E.RESUMED
        return E.CANCELLED if isinstance(happened, Cancelled) else E.DROPPED

    def _judge_sent(self, sent: Sent) -> Event:
        if sent.result == Result.OK and self.state == S.REPLY:
            decision = self.decision
            self.ours = True
            self.stagger = False
            if decision.plan in _STOPS:
                return E.REFUSED_STOP
            return E.REFUSED_DOOM if decision.rule == Rule.DOOM_LOOP else E.OK
        if self.state == S.REPLY:
            # Not refused by us: stopped as a loop without a request, its record read first.
            taken = sent.result == Result.NOT_TAKEN
            self.fields["fallback"] = "answered first" if taken else sent.error
            self.stagger = True
        return {
            Result.OK: E.OK,
            Result.NOT_TAKEN: E.FIRST,
            Result.AWAY: E.AWAY,
        }.get(sent.result, E.FAILED)

    def _judge_read(self, read: Read) -> Event:
        decision = self.decision
        messages = read.messages
        state = self.state
        self._reason = None
        if state in (S.RECHECK_ABORT, S.RECHECK_FEEDBACK):
            assert messages is not None
            if state == S.RECHECK_ABORT and read.busy:
                return E.BUSY
            if feedback_delivered(messages, decision.feedback, decision.part_id):
                self._reason = FEEDBACK_FOUND
            else:
                self._reason = intervened(
                    messages, decision.part_id, aborted=False, refused=not self.ours
                )
            return E.CLEAR if self._reason is None else E.OTHER
        if state == S.OVER:
            if messages is None or answered(messages):
                return E.ENDED
        elif messages is None:
            return E.ENDED if state == S.CHECK and read.run_over else E.CLEAR
        self._reason = intervened(
            messages,
            decision.part_id,
            aborted=state != S.FEEDBACK_CHECK,
            refused=not self.ours,
        )
        if self._reason is not None:
            return E.OTHER
        if self.reads > 1:
            return E.NOTHING
        if state == S.OVER:
            self._reason = "run ended without an answer"
            return E.CLEAR
        if state == S.CHECK and (read.run_over or answered(messages)):
            return E.ENDED
        return E.CLEAR

    def _effect(self, effect: Effect, happened: Happened) -> tuple[Report, ...]:
        decision = self.decision
        error = getattr(happened, "error", None)
        if effect == X.NONE:
            return ()
        if effect == X.NUDGED_LATE:
            self.no_reply = True  # the run is over: the model reads it at its next turn
        if effect == X.KEEP:
            step = "abort" if self.state == S.DUE_ABORT else "feedback"
            fields = {"session_id": decision.session_id, "step": step, "error": error}
            return (Logged("warning", "intervention.due", fields),)
        if effect in (X.FOUND, X.SENT, X.FEEDBACK_FAILED):
            return (self._feedback(effect, error),)
        if effect == X.CONFIRMED_FOUND:
            return (self._outcome(X.CONFIRMED, None), self._feedback(X.FOUND, None))
        outcome = self._outcome(effect, error)
        if isinstance(happened, Sent) and happened.result == Result.GONE:
            return (outcome, Forget(decision.session_id))
        return (outcome,)

    def _outcome(self, effect: Effect, error: str | None) -> Decided:
        decision = self.decision
        stopped = Outcome.HELD if decision.plan == Plan.HOLD else Outcome.ABORTED
        outcomes: dict[Effect, tuple[Outcome, dict[str, object]]] = {
            X.DEFERRED: (Outcome.DEFERRED, {"reason": self._reason}),
            X.NUDGED: (Outcome.NUDGED, {}),
            X.NUDGED_LATE: (Outcome.NUDGED, {"late": "run ended before the abort"}),
            X.STOPPED: (stopped, {}),
            X.REJECTED: (Outcome.REJECTED, {}),
            X.ANSWERED: (Outcome.ANSWERED, {}),
            X.ABORT_FAILED: (Outcome.ABORT_FAILED, {"error": error}),
            X.CANCELLED: (Outcome.CANCELLED, {}),
            X.CONFIRMED: (stopped, {"confirmed": "run stopped, read back after reconnect"}),
        }
        outcome, extra = outcomes[effect]
        fields = {**decision.fields(), "outcome": str(outcome), **self.fields, **extra}
        return Decided(decision, outcome, _present(fields))

    def _feedback(self, effect: Effect, error: str | None) -> Logged:
        decision = self.decision
        session = {"session_id": decision.session_id}
        if effect == X.FEEDBACK_FAILED:
            return Logged("error", "feedback.failed", {**session, "error": error})
        if effect == X.SENT or self._reason == FEEDBACK_FOUND:
            found = {} if effect == X.SENT else {"found": True}
            return Logged("info", "feedback.sent", {**session, "hold": decision.hold, **found})
        return Logged("info", "feedback.deferred", {**session, "reason": self._reason})


# The plans that stop the run after the call is refused.
_STOPS = (Plan.STOP, Plan.HOLD)
# The field a request's time is logged as, by the state that made it.
_MS = {S.ABORT: "abort_ms", S.REPLY: "reply_ms"}


def _present(fields: Mapping[str, object]) -> dict[str, object]:
    return {key: value for key, value in fields.items() if value is not None}


def _detected(decision: Intervene, **fields: object) -> Logged:
    return Logged("warning", "loop.detected", {**fields, **decision.fields()})


# -- how an intervention begins: its channel, from the decision and the facts --------------------


def again(decision: Intervene, **fields: object) -> Turn:
    """A loop's call refused again within the intervention that stands for it (`DEFER`)."""
    said = {
        "session_id": decision.session_id,
        "part_id": decision.part_id,
        "rule": str(decision.rule),
        "call_index": decision.position,
        **fields,
    }
    return Turn((Logged("info", "loop.again", said),))


def _immediately(decision: Intervene, outcome: Outcome, **fields: object) -> Decided:
    return Decided(
        decision, outcome, _present({**decision.fields(), "outcome": str(outcome), **fields})
    )


def _at_once(decision: Intervene, outcome: Outcome, **fields: object) -> Turn:
    """A loop whose outcome is known as it is handed over: its two lines."""
    return Turn((_detected(decision, **fields), _immediately(decision, outcome, **fields)))


def _begin(life: Intervention, detected: Logged) -> tuple[Intervention, Turn]:
    return life, Turn((detected,), life.command())


def found(decision: Intervene, dry_run: bool, reads: int = 1) -> tuple[Intervention | None, Turn]:
    """A loop found on the stream (its call ran, or asked nobody): the run is stopped, or
    nudged, after a check of the record (`reads` reads: more where another monitor answers
    this server's plugin, whose refusal of the call may show a moment later). A call the
    plugin's own rule refused is `refused_call`'s; a dry run only logs."""
    if decision.refused:
        return refused_call(decision, via="plugin_rule", dry_run=dry_run)
    if decision.plan == Plan.DEFER:
        return None, again(decision)
    if dry_run:
        return None, _at_once(decision, Outcome.DRY_RUN, channel="none")
    # A refusal planned for a call that asked no one (no plugin, no permission request, or
    # found after it ran) is carried out by the abort: `channel` says so, in both lines.
    nudge = decision.plan == Plan.NUDGE
    fields: dict[str, object] = {"channel": "nudge" if nudge else "abort"}
    life = Intervention(decision, S.NUDGE_CHECK if nudge else S.CHECK, reads=reads, fields=fields)
    return _begin(life, _detected(decision, **fields))


def refused_call(
    decision: Intervene, via: str, call_id: str | None = None, dry_run: bool = False
) -> tuple[Intervention | None, Turn]:
    """The plugin threw (told to by us: `via` plugin; or by its own rule): the loop's call
    did not run. A block is done with that; a stop (or a hold) also stops the run, then
    gives the feedback."""
    fields = _present({"via": via, "call_id": call_id})
    if decision.plan == Plan.DEFER:
        return None, again(decision, **fields)
    fields["channel"] = "plugin"
    if decision.plan not in _STOPS:
        return None, _at_once(decision, Outcome.BLOCKED, **fields)
    if dry_run:
        return None, _at_once(decision, Outcome.DRY_RUN, **{**fields, "channel": "none"})
    life = Intervention(decision, S.CHECK, ours=True, fields=fields)
    return _begin(life, _detected(decision, **fields))


def request(reply: Reply) -> tuple[Intervention | None, Turn]:
    """A permission request to refuse, for the loop its call completes. None for an answer
    that is no intervention of its own (an approval, or a loop's call refused again): the
    shell sends it as it is."""
    decision = reply.loop
    if decision is None:
        return None, Turn()
    if decision.plan == Plan.DEFER:
        return None, again(decision, request_id=reply.request_id)
    fields: dict[str, object] = {"request_id": reply.request_id, "channel": "permission"}
    state = S.GRACE if reply.wait else S.REPLY
    life = Intervention(decision, state, stagger=False, reply=reply, fields=fields)
    return _begin(life, _detected(decision, **fields))


def standby(decision: Intervene, acting_pid: int | None) -> Turn:
    """Another monitor acts for this server (monitor.shell.acting): the loop found here is
    logged, and left to it. Under its own name, not `loop.detected`: what counts those lines
    (an alert, a query) counts each loop once, the acting monitor's, however many stand by."""
    if decision.plan == Plan.DEFER:
        return again(decision, standby=True)
    said = {"standby": True, "channel": "none", **decision.fields()}
    detected = Logged("warning", "loop.standby", said)
    outcome = _immediately(decision, Outcome.STANDBY, channel="none", acting_pid=acting_pid)
    return Turn((detected, outcome))
