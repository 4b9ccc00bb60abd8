"""A tool call's updates, from the stream, a read-back or the plugin's question, through the
call table (monitor/core/calls.py) to the rules, and where and when a loop they complete is
handed over.

`Tracker` owns the sessions and every other kind of event; it hands each tool part here
(`update`), with the plugin's questions (`judge`) and the time bounds that passed
(`overdue`). This part of the policy keeps, beside the records it shares with the tracker
and the permission gate, only what is its own: the rules each kind of update asks, the part
ids it gives the plugin's calls, the stray updates. Where a loop waits before its hand-over
(for its call's question, request or end, or for the session's next call) is the wait's
table (monitor/core/handover.py), held on the call or the session.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from monitor.core import handover
from monitor.core.calls import CallEvent, CallState, Step, advance
from monitor.core.decisions import Deadline, Intervene, Plan, Reply
from monitor.core.detection import Detection
from monitor.core.events import ToolPart
from monitor.core.fed import QUIET, Fed, Judged
from monitor.core.findings import FailureRun, Finding, LoopAgain, RunawayCall
from monitor.core.handover import Awaiting, Then, WaitEvent, WaitState, handed, waiting
from monitor.core.permissions import PermissionGate
from monitor.core.plan import own_refusal, refused, withhold
from monitor.core.plugin_protocol import ALLOW, PluginCall, block
from monitor.core.profile import ignored_args, transparent_tools
from monitor.core.rules import CallRule
from monitor.core.rules.facts import rule_args
from monitor.core.rules.failure import failed_as
from monitor.core.rules.runaway import call_bound
from monitor.core.runs import RunEvent, run_advance
from monitor.core.session import PLUGIN_PART, Call, RecentMap, SessionRecord, call_digest
from monitor.core.signature import int_digest

__all__ = ["Seeding", "ToolUpdates"]


class Seeding:
    """State of one `Tracker.seed` call: whether it has decided yet."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        self.decided = False


class Decide(Protocol):
    """The tracker's one way from a finding to a decision (`plan.decide`)."""

    def __call__(
        self,
        session: SessionRecord,
        session_id: str,
        finding: Finding,
        part_id: str,
        rearm: bool = True,
    ) -> Intervene: ...


class ToolUpdates:
    """Takes tool call updates for `Tracker`; see `update` and `judge`."""

    def __init__(
        self,
        detection: Detection,
        call_rules: list[CallRule],
        sessions: RecentMap[str, SessionRecord],
        gate: PermissionGate,
        seen: Callable[[str, str | None], SessionRecord],
        decide: Decide,
        directory_of: Callable[[str], str | None],
        route: Callable[[str], int],
        own_refusal_wait: float,
    ) -> None:
        self._detection = detection
        self._sessions = sessions
        self._gate = gate
        # The tracker's: they count a session taken in, and make a decision, in one place.
        self._seen = seen
        self._decide = decide
        self._directory_of = directory_of
        self._route = route
        # The rules that read each kind of update, by (recorded, finished), in their order
        # (`StepsRule` is a text rule of the tracker's too: one object, one state).
        self._call_rules = {
            (recorded, finished): [
                rule
                for rule in call_rules
                if (recorded and rule.reads_recorded)
                or (finished and rule.reads_finished)
                or (not (recorded or finished) and rule.reads_running)
            ]
            for recorded in (False, True)
            for finished in (False, True)
        }
        self._ignore_args = ignored_args(detection.profile, detection.ignore_args)
        self._transparent = transparent_tools(detection.profile, detection.ignore_tools)
        self._record_at_running = detection.match == "input"
        # A monitor no plugin asks (`attach`) may follow sessions whose plugin refuses the
        # loop's call by its own rule, after the stream showed the call running: a loop found
        # at a call's start waits this long (0: not at all) for that call's end, to tell the
        # plugin's refusal (this monitor's block, `Intervene.refused`) from a call that runs.
        self._own_refusal_wait = own_refusal_wait
        # Part ids of ours for the calls the plugin asks about before the stream carries them.
        self._plugin_parts = itertools.count(1)
        # Updates the call table placed nowhere: `late` (after their run ended) and
        # `unexpected`, by step.
        self.stray: Counter[Step] = Counter()

    def overdue(self, deadline: Deadline) -> Intervene | None:
        """The time bound of a call (`Deadline.wait`) has passed: the time as an event. A call
        still running ran away (rule `runaway`); one that ended, or that an intervention is
        stopping already, is nothing."""
        session = self._sessions.get(deadline.session_id)
        call = None if session is None else session.call(deadline.part_id)
        if deadline.loop:
            # No refusal came: the call runs, its loop is stopped as any other (None: its
            # end came first and took the loop with it).
            return None if call is None else handed(call.waiting, WaitEvent.DEADLINE)
        if session is None or call is None or call.state is not CallState.RUNNING:
            return None
        finding = RunawayCall(call.tool, seconds=deadline.wait)
        return self._decide(session, deadline.session_id, finding, deadline.part_id)

    def judge(self, asked: PluginCall) -> Judged:
        """The plugin asks whether a call may run (its `tool.execute.before` hook).

        The call is recorded once, under the same identity and rules as a call seen on the
        stream, whichever of the two comes first (they race): asked first, it is recorded now
        under a part id of ours and the stream's updates are matched to it later (session,
        call id and tool, oldest first: call ids repeat across steps); seen first, the loop it
        completed waited for this request (`Call.waiting`) and is answered now. A blocked
        call never runs: its `error` update feeds no rule.
        """
        session = self._seen(asked.session_id, asked.directory)
        session.plugin = True
        if asked.message_id is not None:
            # The step the plugin saw the call in, which the stream may show only later: a
            # call of the model's next step, asked before, was taken for the refused call's
            # step (a burst), and its loop was not climbed on the ladder (issue 30, under load).
            session.at_step(asked.message_id, asked=True)
        if asked.tool in self._transparent or asked.call_id is None:
            # With no call id (a plugin's that was unusable) the stream's update of this call
            # cannot be told to be the same call: recorded now, it would count twice. The
            # stream records it, as a call no plugin asked about (its loop stops the run).
            return Judged()
        seen = session.unasked(asked.call_id, asked.tool)
        if seen is not None:
            seen.call_id = None  # the plugin asks once per call
            advance(seen, CallEvent.ASK)
            return _judged(handed(seen.waiting, WaitEvent.ASK))
        if asked.cut:
            # Its arguments were too large to send: not recorded from here, but from the
            # stream, which carries them. A loop found there waits for the call's end (the
            # plugin asks: `_held_back`), where the plugin's own rule has refused it (this
            # monitor's block, no abort) or it ran (the abort, as for any loop).
            return Judged()
        part_id = f"{PLUGIN_PART}{next(self._plugin_parts)}"
        call = self._identify(part_id, asked.tool, asked.args, asked.call_id)
        advance(call, CallEvent.ASK)
        session.start(call)
        pending = handed(session.waiting, WaitEvent.ASK)
        if pending is not None:
            # The call a refusal waited for: refused, never recorded (its history started
            # over with that decision), its updates feed no rule.
            advance(call, CallEvent.CUT)
            return _judged(pending)
        if not self._record_at_running:
            return Judged()  # recorded at its outcome, from the stream
        session.calls += 1
        session.run = run_advance(session.run, RunEvent.BEGIN)[0]
        session.record(call.recorded_as, call.tool, self._detection.history)
        return _judged(self._rules(session, call, True, False, asked.session_id, part_id, True))

    def read_back_deadlines(self, session_id: str) -> tuple[Deadline, ...]:
        """The time bounds of the session's calls read back still running (`seed`): a call
        that started while we were away (a restart, a reconnect) gets its bound from now, as
        when it started is not known; without it a call that never ends, begun before a
        restart, would never be stopped."""
        session = self._sessions.get(session_id)
        if session is None or session.in_flight is None:
            return ()
        seconds = self._detection.call_seconds
        bounds = (
            (call.part_id, call_bound(call.tool, call.args, seconds))
            for call in session.in_flight.values()
            if call.state is CallState.RUNNING
        )
        return tuple(Deadline(session_id, part, wait) for part, wait in bounds if wait is not None)

    def update(self, part: ToolPart, seeding: Seeding | None, label: str) -> Fed:
        """One update of a tool part, live (`seeding` None) or read back: the call's life
        moves on, and a loop it completes is handed over now or made to wait (`_claimed`,
        `_late`, `_held_back`, monitor/core/handover.py)."""
        transparent = part.tool in self._transparent
        follows = self._gate.follows(part)
        if transparent and not follows:
            return QUIET[label]
        session = self._seen(part.session_id, part.directory)
        if part.message_id is not None:
            # The model step the call is of (one assistant message): a question that names
            # none is taken to be of the latest step the stream showed.
            session.at_step(part.message_id)
        if part.status == "pending":
            return QUIET[label]  # no input yet: the call's life begins with its `running`
        running = part.status == "running"
        finished = part.status in _FINISHED
        call = self._claimed(session, part, follows)
        if call is None and running:
            if seeding is None and not transparent and self._refuses_next(session, part):
                return self._awaits_refusal(session, part, label)
            call = self._followed(session, part, follows)
        late = self._late(session, call, part, live=seeding is None) if finished else None
        # Its first `running` update on the stream: from now its time bound runs (`runaway`).
        starts = running and seeding is None and (call is None or call.state in _STARTING)
        decision = None if transparent else self._call(session, call, part, seeding)
        if finished and seeding is None:
            decision = _withheld(session, decision)
        call = call or session.call(part.part_id)  # `_call` made it, if it was new
        nudge: Intervene | None = None
        deadlines: tuple[Deadline, ...] = ()
        if decision is not None and running and call is not None:
            decision, nudge, deadlines = self._held_back(session, call, part, decision, seeding)
        now = self._gated(session, call, part, decision) if running and follows else decision
        if finished and seeding is None:
            session.finish(part.part_id)  # done with: a read-back keeps it for its duplicates
        if starts and call is not None and not transparent:
            deadlines = (*self._bound(part), *deadlines)
        return _fed(label, late, nudge, now, deadlines)

    def _followed(self, session: SessionRecord, part: ToolPart, follows: bool) -> Call | None:
        """A new call's first `running` update, on a call the gate follows: known from now
        (to the gate too, by its key); else `_call` makes it, if it is one to take."""
        if not follows:
            return None
        call = self._identify_part(part)
        session.start(call)
        self._gate.started(session, call, part)
        return call

    def _bound(self, part: ToolPart) -> tuple[Deadline, ...]:
        """The time bound of a call that starts running (`runaway`), if its tool has one."""
        bound = call_bound(part.tool, part.input, self._detection.call_seconds)
        return () if bound is None else (Deadline(part.session_id, part.part_id, bound),)

    def _gated(
        self, session: SessionRecord, call: Call | None, part: ToolPart, decision: Intervene | None
    ) -> Intervene | Reply | None:
        """`PermissionGate.decide` on a `running` update the gate follows. Only a call it
        named with a loop, or with its request come, has anything to decide: the session's
        directory and routes are looked up for those alone (most updates pass as they came)."""
        if call is None or call.key is None or (decision is None and call.request is None):
            return decision
        session_id = part.session_id
        where, route = self._directory_of(session_id), self._route(session_id)
        return self._gate.decide(session_id, session, call, decision, where, route)

    def _claimed(self, session: SessionRecord, part: ToolPart, follows: bool) -> Call | None:
        """The call this update is of, if known: recorded from the stream, or from the
        plugin's question, which came first (the same call, claimed now by its part id)."""
        call = session.call(part.part_id)
        if call is not None or not session.plugin:
            return call
        if part.call_id is None or part.status == "pending":
            return None
        call = session.claim(part.part_id, part.call_id, part.tool)
        if call is not None and follows and part.status == "running":
            self._gate.started(session, call, part)
        return call

    def _late(
        self, session: SessionRecord, call: Call | None, part: ToolPart, live: bool
    ) -> Intervene | None:
        """The loop a finished call still owes: found before it ran but not refused (its
        question or request never came), or found at its start, waiting for its end."""
        if call is None:
            return None
        if call.key is not None:
            # The gate sees the update first: a call must be known before its loop is decided.
            self._gate.finished(session, call, live=live)
        ended = WaitEvent.LATE_END if call.state is CallState.LATE else WaitEvent.END
        late = handed(call.waiting, ended)
        if late is not None and own_refusal(part.error):
            # Unless the plugin's own rule refused the call: that is the loop's block.
            late = refused(session, late)
        return late

    def _held_back(
        self,
        session: SessionRecord,
        call: Call,
        part: ToolPart,
        decision: Intervene,
        seeding: Seeding | None,
    ) -> tuple[Intervene | None, Intervene | None, tuple[Deadline, ...]]:
        """A loop found as its call starts running: what is decided now, the nudge to send
        (the call runs), and the wait for the call's end, instead of acting at once."""
        if decision.plan == Plan.NUDGE:
            return None, decision, ()  # the call runs: nothing to refuse
        if seeding is not None or call.request is not None:
            return decision, None, ()
        if session.plugin and call.call_id is not None:
            # The plugin's request for this call is on its way: it blocks the call.
            call.waiting = Awaiting(WaitState.AWAIT_QUESTION, decision)
            return None, None, ()
        if self._own_refusal_wait:
            # A plugin asking nobody may be refusing it: its end says, within the wait.
            call.waiting = Awaiting(WaitState.AWAIT_END, decision)
            wait = Deadline(part.session_id, part.part_id, self._own_refusal_wait, loop=True)
            return None, None, (wait,)
        return decision, None, ()

    @staticmethod
    def _refuses_next(session: SessionRecord, part: ToolPart) -> bool:
        """Whether a new call's first `running` update on the stream is the next call a
        refusal waits for (the plugin names calls by their call id)."""
        return part.call_id is not None and waiting(session.waiting, WaitState.AWAIT_NEXT_CALL)

    def _awaits_refusal(self, session: SessionRecord, part: ToolPart, label: str) -> Fed:
        """The stream carries the session's next call before the plugin asks about it (they
        race), while a refusal waits for it: not recorded; the refusal moves onto the call,
        the plugin's question, when it comes, is refused with it (`judge` finds it unasked),
        and should the call end unasked (the plugin fell open), the run is stopped then, as
        for any loop."""
        call = self._identify_part(part)
        session.start(call)
        advance(call, CallEvent.RUN)
        advance(call, CallEvent.CUT)
        wait = session.waiting
        if wait is not None and handover.advance(wait, WaitEvent.RUN) is Then.MOVE:
            call.waiting, session.waiting = wait, None
        return QUIET[label]

    def _call(
        self, session: SessionRecord, call: Call | None, part: ToolPart, seeding: Seeding | None
    ) -> Intervene | None:
        """Take a tool call's update: move it through its life (monitor/core/calls.py) and do
        what that says: record it, take its outcome, ask the rules."""
        finished = part.status in _FINISHED
        if not finished and part.status != "running":
            return None  # a status of no kind we know
        if call is None:
            call = self._identify_part(part)
            session.start(call)
        event = _call_event(session, call, finished, seeding)
        step = advance(call, event)
        if step is Step.AGAIN and event is CallEvent.RUN and call.state is CallState.RUNNING:
            # bash re-sends `running` while it streams output: only `runaway` reads those
            if not self._call_rules[False, False]:
                return None
            call.metadata = part.metadata
            return self._rules(session, call, False, False, part.session_id, part.part_id, True)
        record = step in _RECORDS
        outcome = step in _TAKES
        if not self._record_at_running:
            record = outcome  # under input+output a call is recorded with its outcome
        if not (record or outcome):
            if step in (Step.LATE, Step.UNEXPECTED):
                self.stray[step] += 1
            return None
        if outcome:
            call.finished(part.status, part.output, part.error, part.metadata)
        if record and not self._record(session, call, part, seeding):
            return None
        return self._rules(
            session, call, record, outcome, part.session_id, part.part_id, seeding is None
        )

    def _record(
        self, session: SessionRecord, call: Call, part: ToolPart, seeding: Seeding | None
    ) -> bool:
        """Count a call and put it in the run's history; False when a read-back leaves it
        out of the history and unjudged."""
        session.calls += 1
        session.run = run_advance(session.run, RunEvent.BEGIN)[0]
        if seeding is not None:
            if seeding.decided:
                # A run that looped several times before we came is stopped once, at the
                # first call where `watch` would have stopped it; later calls are counted
                # (positions stay call numbers) but not recorded.
                return False
            if part.part_id == session.intervened_part:
                # The run read back is the one we just stopped, its feedback not stored
                # yet: the same loop must not be acted on twice.
                session.restart()
                seeding.decided = True
                return False
        if not self._record_at_running:
            call.recorded_as = int_digest(call.digest, call.outcome)
        session.record(call.recorded_as, call.tool, self._detection.history)
        return True

    def _rules(
        self,
        session: SessionRecord,
        call: Call,
        record: bool,
        outcome: bool,
        session_id: str,
        part_id: str,
        live: bool,
    ) -> Intervene | None:
        """Ask the rules about a call just recorded or finished; the first finding decides.

        A call of the loop stopped last (`SessionRecord.armed`) is that loop again at once:
        a model that ignores the feedback gets no fresh budget of repetitions. Its finding is
        its own (`LoopAgain`: this call, of that loop), so what the model reads is what this
        call did. Not for calls read back (`live` False): those were seen, and judged, before.
        """
        armed, loop = session.armed, session.armed_finding
        if live and armed is not None and loop is not None:
            again = None
            if record and call.digest in armed:
                again = LoopAgain(call.tool, loop)
            elif outcome and isinstance(loop, FailureRun) and failed_as(call) in armed:
                # A stopped failure loop repeats as its failure, whatever the arguments.
                again = LoopAgain(call.tool, loop, failed=True)
            if again is not None:
                return self._decide(session, session_id, again, part_id, rearm=False)
        for rule in self._call_rules[record, outcome]:
            found = rule.call(session, call, record, outcome)
            if found is not None:
                return self._decide(session, session_id, found, part_id)
        return None

    def _identify(self, part_id: str, tool: str, args: object, call_id: str | None) -> Call:
        """A call's identity, made once: its arguments after the profile, and their digest;
        the same for a call the plugin sends and one the stream carries."""
        args = self._profiled(tool, args)
        return Call(part_id, tool, call_digest(tool, args), rule_args(tool, args), call_id)

    def digest(self, tool: str, args: object) -> int:
        """The digest `_identify` gives a call of `tool` with `args` (a `doom_loop` request
        names its repeated call so)."""
        return call_digest(tool, self._profiled(tool, args))

    def _profiled(self, tool: str, args: object) -> object:
        dropped = self._ignore_args.get(tool)
        if dropped and isinstance(args, dict):
            return {key: value for key, value in args.items() if key not in dropped}
        return args

    def _identify_part(self, part: ToolPart) -> Call:
        return self._identify(part.part_id, part.tool, part.input, part.call_id)


_FINISHED = ("completed", "error")
_RECORDS = (Step.RECORD, Step.RECORD_TAKE)
_TAKES = (Step.TAKE, Step.RECORD_TAKE)
# The states of a call whose end is still to be taken.
_CUTTABLE = (CallState.ASKED, CallState.RUNNING)
# The states of a call whose first `running` update on the stream this may be.
_STARTING = (CallState.NEW, CallState.ASKED)


def _withheld(session: SessionRecord, decision: Intervene | None) -> Intervene | None:
    """A loop found at its call's live end: `plan.withhold`, unless the plugin's own rule
    refused that call (the loop's block, carried out)."""
    if decision is None or decision.refused:
        return decision
    return withhold(session, decision)


def _fed(
    label: str,
    late: Intervene | None,
    nudge: Intervene | None,
    now: Intervene | Reply | None,
    deadlines: tuple[Deadline, ...],
) -> Fed:
    """What an update did: the decisions handed over, the reply to send, the time bounds."""
    if isinstance(now, Reply):
        done = tuple(d for d in (late, nudge) if d is not None)
        return Fed(done, label, replies=(now,), deadlines=deadlines)
    if late is None and nudge is None and now is None:  # most updates
        return Fed((), label, deadlines=deadlines) if deadlines else QUIET[label]
    return Fed(tuple(d for d in (late, nudge, now) if d is not None), label, deadlines=deadlines)


def _judged(decision: Intervene | None) -> Judged:
    """The plugin's answer for a call that completes `decision`'s loop (None: no loop)."""
    if decision is None:
        return Judged()
    if decision.plan == Plan.NUDGE:
        return Judged(ALLOW, decision)
    return Judged(block(decision.refusal), decision)


def _call_event(
    session: SessionRecord, call: Call, finished: bool, seeding: Seeding | None
) -> CallEvent:
    """What an update of `call` is to its life."""
    if seeding is not None:
        # The shell connects the stream before it reads the messages back, so nothing that
        # happens in between is lost; an update made in that gap then reaches us twice, in
        # the messages and on the stream, and must count once: every part read back stays
        # in flight, also a finished one, and its later updates are repeats.
        return CallEvent.READ_FINISH if finished else CallEvent.READ_RUN
    if session.stopping is not None:
        # The run is being aborted (`SessionRecord.stopping`): a call that begins now is
        # recorded (a repetition of the loop is that intervention again), but no call's end
        # is taken, since the abort is what ends it ("Task cancelled" for each subagent,
        # "Tool execution aborted"). The intervention's own cut covers only the calls in
        # flight at its decision; a burst's later calls start after it.
        if call.state is CallState.NEW:
            return CallEvent.RUN
        if finished and call.state in _CUTTABLE:
            advance(call, CallEvent.CUT)
    return CallEvent.FINISH if finished else CallEvent.RUN
