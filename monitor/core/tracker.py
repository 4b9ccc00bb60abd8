"""Event tracker: follows every session's tool calls and decides when to intervene.

Fed decoded frames of either stream form, it returns a `Fed` result (the decisions, the
event's type, why a frame was malformed) and never raises on what the server sends. It is the
whole policy of the monitor; the asyncio shell only carries out the `Intervene` decisions it
returns and counts what the result says.

For `attach` it follows one session only (`only_session`) and takes that session's past
through `seed` under the same rules.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from monitor.core.budget import BudgetBook
from monitor.core.calls import CallEvent, CallState, Step, advance
from monitor.core.decisions import Deadline, Intervene, Outcome, Plan, Reply
from monitor.core.detection import SEED, Detection, rules_of
from monitor.core.events import (
    KNOWN_EVENT_TYPES,
    MALFORMED,
    OTHER,
    FileEdited,
    Malformed,
    MessageUsage,
    PartDelta,
    PermissionAsked,
    PermissionReplied,
    SessionDeleted,
    SessionDiff,
    SessionIdle,
    SessionSeen,
    TextPart,
    ToolPart,
    UserMessage,
    WorkspaceState,
)
from monitor.core.events_v2 import Adapter
from monitor.core.fed import Fed, Judged, SessionView
from monitor.core.feedback import (
    MARKS,
)
from monitor.core.findings import (
    RULES,
    DoomLoop,
    FailureRun,
    Finding,
    RunawayCall,
)
from monitor.core.frames import FrameError, decode_frame
from monitor.core.ids import is_permission_id, is_session_id
from monitor.core.ladder import FirstAction, OnLoop
from monitor.core.permissions import DOOM_LOOP_CALLS, PermissionGate
from monitor.core.plan import decide, failed_as, own_refusal, refused, withhold
from monitor.core.plugin_protocol import ALLOW, PluginCall, block
from monitor.core.profile import ignored_args, transparent_tools
from monitor.core.rules.facts import SIGNALS, Signals, rule_args
from monitor.core.rules.runaway import call_bound
from monitor.core.runs import RunEvent, run_advance
from monitor.core.session import (
    PLUGIN_PART,
    Call,
    RecentMap,
    SessionRecord,
    call_digest,
)
from monitor.core.texts import TextStreams

__all__ = [
    "RULES",
    "SEED",
    "Detection",
    "Fed",
    "FirstAction",
    "Intervene",
    "Judged",
    "OnLoop",
    "SessionView",
    "Tracker",
]

# Most frames change nothing the shell must act on: one shared result per event type, so the
# hot path allocates nothing for them.
_QUIET = {label: Fed(event_type=label) for label in (*KNOWN_EVENT_TYPES, OTHER, MALFORMED)}


class _Seeding:
    """State of one `Tracker.seed` call: whether it has decided yet."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        self.decided = False


class Tracker:
    """Feeds frames through the loop rules; see `feed`."""

    def __init__(
        self,
        detection: Detection = Detection(),
        directory: str | None = None,
        only_session: str | None = None,
        check_ids: bool = False,
        own_refusal_wait: float = 0.0,
    ) -> None:
        # `Detection` checked its invariants when it was made (monitor/core/limits.py).
        self.detection = detection
        # The daemon acts on ids (they go into request paths): one that is not of OpenCode's
        # shape makes its frame malformed. Off for replay and the core's own tests.
        self._check_ids = check_ids
        call_rules, self._text_rules = rules_of(detection)
        # The rules that read each kind of update, by (recorded, finished), in their order.
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
        self._default_directory = directory
        # The one table of session state (monitor/core/session.py).
        self._sessions: RecentMap[str, SessionRecord] = RecentMap(detection.max_sessions)
        # Events of every other session are ignored, as if the stream did not carry them.
        self.only_session = only_session
        # A monitor no plugin asks (`attach`) may follow sessions whose plugin refuses the
        # loop's call by its own rule, after the stream showed the call running: a loop found
        # at a call's start waits this long (0: not at all) for that call's end, to tell the
        # plugin's refusal (this monitor's block, `Intervene.refused`) from a call that runs.
        self._own_refusal_wait = own_refusal_wait
        # Those loops, by the part id of their call, until its end or the wait is over: one
        # or the other hands each over, also when the run ended meanwhile (someone stopped
        # it: the shell finds it over), so no decision goes unlogged.
        self._awaiting_end: dict[str, Intervene] = {}
        self._gate = PermissionGate(detection.permissions, detection.permission_grace)
        # Spend by session and by session tree (a tree spans sessions, so it is not a record's).
        self._budgets = BudgetBook(
            detection.run_budget,
            detection.tree_budget,
            detection.max_sessions,
            detection.tree_depth,
            detection.tree_fanout,
        )
        self.malformed: Counter[str] = Counter()
        # Sessions taken in since the start (one forgotten and seen again counts twice).
        self.sessions_seen = 0
        self.texts = TextStreams(detection.text_repeats)
        # Part ids of ours for the calls the plugin asks about before the stream carries them.
        self._plugin_parts = itertools.count(1)
        # Frames of either server generation become the same events (monitor/core/events_v2.py);
        # the shell asks it which sessions speak 2.x and where their replays resume.
        self.adapter = Adapter(detection.max_sessions)
        # Updates the call table placed nowhere: `late` (after their run ended) and
        # `unexpected`, by step.
        self.stray: Counter[Step] = Counter()
        # What each kind of event (a tool part aside) does to the sessions: one look-up, not a
        # chain of type tests, on every frame.
        self._handlers: dict[type, Callable[[Any, str], Fed]] = {
            PartDelta: self._on_delta,
            SessionSeen: self._on_seen,
            MessageUsage: self._usage,
            UserMessage: self._on_user,
            SessionDiff: self._on_diff,
            WorkspaceState: self._on_workspace,
            TextPart: self._on_text,
            SessionIdle: self._on_idle,
            PermissionAsked: self._on_asked,
            PermissionReplied: self._on_replied,
            SessionDeleted: self._on_deleted,
        }

    def feed_data(self, data: str) -> Fed:
        """Take the data of one SSE event, as read from the stream or a recording."""
        try:
            frame = decode_frame(data)
        except FrameError as exc:
            return self._malformed(MALFORMED, str(exc))
        return self._feed(frame, None)  # `feed`, one call less on every frame

    def feed(self, frame: object) -> Fed:
        """Take one decoded frame (`/event` or `/global/event` form); say what it did.

        A `Malformed` in place of a frame (what `export_frames` makes of an unusable entry)
        is counted like any other malformed frame.
        """
        return self._feed(frame, None)

    def expire(self, reply: Reply) -> Reply | None:
        """The deadline of `reply` (its `wait`) has passed: the time as an event.

        Returns the reply to send now (`wait` 0), or None when somebody (a person at the TUI)
        answered the request meanwhile, as far as the stream told us.
        """
        session = self._sessions.get(reply.session_id)
        if not self._gate.pending(session, reply.request_id):
            return None
        return dataclasses.replace(reply, wait=0.0)

    def overdue(self, deadline: Deadline) -> Intervene | None:
        """The time bound of a call (`Deadline.wait`) has passed: the time as an event. A call
        still running ran away (rule `runaway`); one that ended, or that an intervention is
        stopping already, is nothing."""
        if deadline.loop:
            # No refusal came: the call runs, its loop is stopped as any other (None: its
            # end came first and took the loop with it).
            return self._awaiting_end.pop(deadline.part_id, None)
        session = self._sessions.get(deadline.session_id)
        call = None if session is None else session.call(deadline.part_id)
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
        completed waited for this request (`Call.loop`) and is answered now. A blocked call
        never runs: its `error` update feeds no rule.
        """
        session = self._seen(asked.session_id, asked.directory)
        session.plugin = True
        if asked.tool in self._transparent or asked.call_id is None:
            # With no call id (a plugin's that was unusable) the stream's update of this call
            # cannot be told to be the same call: recorded now, it would count twice. The
            # stream records it, as a call no plugin asked about (its loop stops the run).
            return Judged()
        seen = session.unasked(asked.call_id, asked.tool)
        if seen is not None:
            seen.call_id = None  # the plugin asks once per call
            advance(seen, CallEvent.ASK)
            decision, seen.loop = seen.loop, None
            return _judged(decision)
        part_id = f"{PLUGIN_PART}{next(self._plugin_parts)}"
        call = self._identify(part_id, asked.tool, asked.args, asked.call_id)
        advance(call, CallEvent.ASK)
        session.start(call)
        pending, session.pending = session.pending, None
        if pending is not None:
            # The call a refusal waited for: refused, never recorded (its history started
            # over with that decision), its updates feed no rule.
            advance(call, CallEvent.CUT)
            return _judged(pending)
        if not self._record_at_running:
            return Judged()  # recorded at its outcome, from the stream
        session.calls += 1
        self._begin(session)
        session.record(call.recorded_as, call.tool, self.detection.history)
        return _judged(self._rules(session, call, True, False, asked.session_id, part_id, True))

    def seed(
        self,
        session_id: str,
        frames: Iterable[object],
        directory: str | None = None,
        interventions: int = 0,
        held: bool = False,
    ) -> list[Intervene]:
        """Read a session's current run back from the server before following it live.

        After a reconnect, at start, and for `attach`: events missed while away are gone, so
        the run is rebuilt from `frames`, what `monitor.core.export.export_frames` makes of its
        messages (each part in the state it had when they were read). The run starts over
        (its history and in-flight parts go; its intervention count stays) and the frames go
        through the rules of the live stream, with the differences `_tool_part` explains.
        Returns its decisions, for the shell to carry out as those of any frame.

        `interventions` is how many feedback messages the session's record holds, so that
        escalation counts the interventions of an earlier monitor process too; `held` whether
        its last user message is the feedback of a hold (`monitor.core.export.held_in`): the
        messages say whether it still waits for a person, whatever we believed.
        """
        session = self._seen(session_id, directory)
        session.interventions = max(session.interventions, interventions)
        session.held = "" if held else None
        # The record replaces what we knew of the run: its history and its calls (their
        # later updates are matched to the calls read back, or are late). Not a run end: the
        # run read back is the one under way.
        session.restart()
        session.end_calls()
        session.calls = session.run_start
        seeding = _Seeding()
        decisions: list[Intervene] = []
        for frame in frames:
            fed = self._feed(frame, seeding)
            # A loop whose call's request came before its `running` update, which only the
            # messages read back show: `seed` returns decisions, so the abort stops it.
            decisions += (*fed.decisions, *(r.loop for r in fed.replies if r.loop is not None))
            seeding.decided = seeding.decided or bool(decisions)
        return decisions

    def read_back_deadlines(self, session_id: str) -> tuple[Deadline, ...]:
        """The time bounds of the session's calls read back still running (`seed`): a call
        that started while we were away (a restart, a reconnect) gets its bound from now, as
        when it started is not known; without it a call that never ends, begun before a
        restart, would never be stopped."""
        session = self._sessions.get(session_id)
        if session is None or session.in_flight is None:
            return ()
        seconds = self.detection.call_seconds
        bounds = (
            (call.part_id, call_bound(call.tool, call.args, seconds))
            for call in session.in_flight.values()
            if call.state is CallState.RUNNING
        )
        return tuple(Deadline(session_id, part, wait) for part, wait in bounds if wait is not None)

    def directory_of(self, session_id: str) -> str | None:
        session = self._sessions.get(session_id)
        if session is None or session.directory is None:
            return self._default_directory
        return session.directory

    def running(self) -> dict[str, str | None]:
        """The sessions with a run under way (a history), with their directories."""
        return {
            session_id: session.directory or self._default_directory
            for session_id, session in self._sessions.items()
            if session.running
        }

    def known(self) -> dict[str, str | None]:
        """Every session held, with the directory the stream told us (None if it did not)."""
        return {session_id: session.directory for session_id, session in self._sessions.items()}

    def end_runs(self, session_ids: Iterable[str]) -> list[Intervene]:
        """`end_run` of each; the refusals released."""
        released = (self.end_run(session_id) for session_id in session_ids)
        return [decision for decision in released if decision is not None]

    def history_length(self, session_id: str) -> int:
        """Calls of the session's current run that the rules remember."""
        session = self._sessions.get(session_id)
        return 0 if session is None else session.history_length()

    @property
    def active_sessions(self) -> int:
        """Sessions with a run under way: what the sessions gauge reports."""
        return sum(session.running for session in self._sessions.values())

    @property
    def held_sessions(self) -> int:
        """Sessions on hold now, waiting for a person: what the held gauge reports."""
        return sum(session.held is not None for session in self._sessions.values())

    def held(self) -> dict[str, str | None]:
        """The sessions on hold, with their directories (to read back after a reconnect)."""
        return {
            session_id: session.directory or self._default_directory
            for session_id, session in self._sessions.items()
            if session.held is not None
        }

    def outcome(self, decision: Intervene, outcome: Outcome) -> None:
        """How the shell's intervention ended, as an event: a `held` one puts the session on
        hold until a person writes to it (a user message that is not our feedback)."""
        session = self._sessions.get(decision.session_id)
        if session is None:
            return
        session.outcomes += (outcome,)
        if outcome == Outcome.HELD:
            session.held = ""
        if session.acted is not None and session.acted.decision is decision:
            session.acted.done = True  # acted on: no longer under way (`Acted.same`)

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())

    def interventions(self, session_id: str) -> int:
        session = self._sessions.get(session_id)
        return 0 if session is None else session.interventions

    def end_run(self, session_id: str) -> Intervene | None:
        """The session's run is over, whoever says so (`session.status` idle, `session.idle`,
        a resync that found it idle): everything a run owns starts over, its history, the
        rules' state, its calls (late from now on) and its budget; its intervention count
        stays. Said twice for one run end (the server does), it counts once: the armed
        countdown and the run's first call number move only when a run was under way.

        A refusal that waited for a next call that never came (the model answered instead)
        is released: the shell finds its run over and posts the feedback for the next time
        (outcome `nudged`, late)."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        released, session.pending = session.pending, None
        session.run, ended = run_advance(session.run, RunEvent.END)
        session.restart()
        self._budgets.end_run(session_id)  # idempotent: a spent budget reset twice is reset
        if ended:
            session.end_calls()
            session.run_start = session.calls
            session.runs += 1
            session.acted = None  # an intervention stands for its run only
            session.run_ended()
        return released

    def run_over(self, decision: Intervene) -> bool:
        """Whether the run `decision` was made in has ended since (or the session is gone)."""
        session = self._sessions.get(decision.session_id)
        return session is None or session.runs != decision.run

    @staticmethod
    def _begin(session: SessionRecord) -> None:
        """A run is under way: the server said busy, or a call of it is recorded."""
        session.run = run_advance(session.run, RunEvent.BEGIN)[0]

    def sessions_view(self) -> list[SessionView]:
        """A read-only copy of what is known about every session held, oldest first."""
        return [
            SessionView(
                session_id,
                session.directory or self._default_directory,
                session.running,
                session.calls - session.run_start,
                session.calls,
                session.interventions,
                session.held is not None,
            )
            for session_id, session in self._sessions.items()
        ]

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id)
        self.adapter.forget(session_id)
        self._budgets.forget(session_id)

    def _feed(self, frame: object, seeding: _Seeding | None) -> Fed:
        if isinstance(frame, Malformed):
            return self._malformed(MALFORMED, frame.reason)
        label, event = self.adapter.parse(frame)
        if event is None:
            return _QUIET[label]
        if isinstance(event, Malformed):
            return self._malformed(label, event.reason)
        if isinstance(event, FileEdited):  # names no session, only its directory
            self._files_edited(event.directory or self._default_directory)
            return _QUIET[label]
        if self._check_ids:  # the daemon acts on ids: they go into request paths
            if not is_session_id(event.session_id):
                return self._malformed(label, f"{label}: sessionID is not of the shape ses_...")
            if isinstance(event, PermissionAsked) and not is_permission_id(event.request_id):
                return self._malformed(label, f"{label}: id is not of the shape per_...")
        if self.only_session is not None and event.session_id != self.only_session:
            return _QUIET[label]
        if isinstance(event, ToolPart):  # the one kind a read-back seeds
            return self._tool_part(event, seeding, label)
        return self._handlers[type(event)](event, label)

    def _on_delta(self, event: PartDelta, label: str) -> Fed:
        decision = self._delta(event)
        return _QUIET[label] if decision is None else Fed((decision,), label)

    def _on_seen(self, event: SessionSeen, label: str) -> Fed:
        seen = self._seen(event.session_id, event.directory)
        if event.busy:
            self._begin(seen)
        tripped = self._budgets.session(event.session_id, event.parent_id)
        if tripped is None:
            return _QUIET[label]
        # Rule `tree`: the tree is stopped at its root, whichever child tripped it; the book
        # keeps it to one intervention while that one is under way (until the root's run ends).
        shape, root_id = tripped
        root = self._seen(root_id, None)
        if root.directory is None:
            root.directory = event.directory
        return Fed((self._decide(root, root_id, shape, event.session_id),), label)

    def _on_user(self, event: UserMessage, label: str) -> Fed:
        # A held session waits for a person; which message is theirs, its text tells.
        asked = self._sessions.get(event.session_id)
        if asked is not None and asked.held is not None:
            asked.held = event.message_id
        return _QUIET[label]

    def _on_diff(self, event: SessionDiff, label: str) -> Fed:
        diffed = self._sessions.get(event.session_id)
        if diffed is not None and diffed.running:
            diffed.state(SIGNALS, Signals).diffed(event.digest)
        return _QUIET[label]

    def _on_workspace(self, event: WorkspaceState, label: str) -> Fed:
        # Seen as well: 2.x's step start is also what tells a session's directory.
        measured = self._seen(event.session_id, event.directory)
        if measured.running:
            measured.state(SIGNALS, Signals).measured(event.digest)
        return _QUIET[label]

    def _on_text(self, event: TextPart, label: str) -> Fed:
        decision = self._text_part(event)
        return _QUIET[label] if decision is None else Fed((decision,), label)

    def _on_idle(self, event: SessionIdle, label: str) -> Fed:
        self._seen(event.session_id, event.directory)
        released = self.end_run(event.session_id)
        return _QUIET[label] if released is None else Fed((released,), label)

    def _on_asked(self, event: PermissionAsked, label: str) -> Fed:
        if self._gate.mode == "off":
            return _QUIET[label]
        session = self._seen(event.session_id, event.directory)
        reply = self._gate.asked(
            session, event, self.directory_of(event.session_id), self._doom_loop
        )
        return _QUIET[label] if reply is None else Fed(event_type=label, replies=(reply,))

    def _on_replied(self, event: PermissionReplied, label: str) -> Fed:
        replied = self._sessions.get(event.session_id)
        if replied is not None:
            self._gate.replied(replied, event)
        return _QUIET[label]

    def _on_deleted(self, event: SessionDeleted, label: str) -> Fed:
        self.forget(event.session_id)
        return Fed(event_type=label, deleted=event.session_id)

    def _malformed(self, label: str, reason: str) -> Fed:
        self.malformed[reason] += 1
        return Fed(event_type=label, malformed=reason)

    def _seen(self, session_id: str, directory: str | None) -> SessionRecord:
        session = self._sessions.touch(session_id, self._new_session)
        if directory is not None:
            session.directory = directory
        return session

    def _new_session(self) -> SessionRecord:
        self.sessions_seen += 1
        return SessionRecord()

    def _usage(self, usage: MessageUsage, label: str) -> Fed:
        """A step's spend, and the end of the run if it ended it (`ends_run`)."""
        fed = self._spend(usage, label)
        if not usage.ends_run:
            return fed
        self._seen(usage.session_id, usage.directory)
        released = self.end_run(usage.session_id)
        if released is None:
            return fed
        return dataclasses.replace(fed, decisions=(*fed.decisions, released))

    def _spend(self, usage: MessageUsage, label: str) -> Fed:
        """A step's spend: counted for the metrics, and against the budgets."""
        taken = self._budgets.message(usage)
        if taken is None:
            return _QUIET[label]
        tokens, cost, reached = taken
        session_id = usage.session_id
        if reached is None:
            if not tokens and not cost:
                return _QUIET[label]
            where = usage.directory or self.directory_of(session_id)
            return Fed(event_type=label, spent=(where, tokens, cost))
        session = self._seen(session_id, usage.directory)
        decision = withhold(session, self._decide(session, session_id, reached, usage.message_id))
        where = session.directory or self._default_directory
        return Fed(() if decision is None else (decision,), label, spent=(where, tokens, cost))

    def _files_edited(self, directory: str | None) -> None:
        """`file.edited`: a change for every run under way in that directory."""
        for session in self._sessions.values():
            if session.running and (session.directory or self._default_directory) == directory:
                session.state(SIGNALS, Signals).count += 1

    def _doom_loop(self, request: PermissionAsked, part_id: str) -> Intervene:
        """The server's `doom_loop` check found a loop: an intervention like our own."""
        session = self._seen(request.session_id, request.directory)
        finding = DoomLoop(request.tool or request.permission, DOOM_LOOP_CALLS)
        return self._decide(session, request.session_id, finding, part_id)

    def _identify(self, part_id: str, tool: str, args: object, call_id: str | None) -> Call:
        """A call's identity, made once: its arguments after the profile, and their digest;
        the same for a call the plugin sends and one the stream carries."""
        dropped = self._ignore_args.get(tool)
        if dropped and isinstance(args, dict):
            args = {key: value for key, value in args.items() if key not in dropped}
        return Call(part_id, tool, call_digest(tool, args), rule_args(tool, args), call_id)

    def _identify_part(self, part: ToolPart) -> Call:
        return self._identify(part.part_id, part.tool, part.input, part.call_id)

    def _tool_part(self, part: ToolPart, seeding: _Seeding | None, label: str) -> Fed:
        transparent = part.tool in self._transparent
        follows = self._gate.follows(part)
        if transparent and not follows:
            return _QUIET[label]
        session = self._seen(part.session_id, part.directory)
        if part.message_id is not None:
            # The model step the call is of (one assistant message): the plugin's question
            # names none, and is taken to be of the latest step the stream showed.
            session.step = part.message_id
        running = part.status == "running"
        finished = part.status in _FINISHED
        call = self._claimed(session, part, follows)
        if (
            call is None
            and seeding is None
            and session.pending is not None
            and running
            and part.call_id is not None
            and not transparent
        ):
            return self._awaits_refusal(session, part, label)
        if call is None and running and follows:
            call = self._identify_part(part)
            session.start(call)
            self._gate.started(session, call, part)
        late = self._late(session, call, part, live=seeding is None) if finished else None
        # Its first `running` update on the stream: from now its time bound runs (`runaway`).
        starts = (
            running
            and seeding is None
            and (call is None or call.state in (CallState.NEW, CallState.ASKED))
        )
        decision = None if transparent else self._call(session, call, part, seeding)
        if decision is not None and finished and seeding is None and not decision.refused:
            decision = withhold(session, decision)
        call = call or session.call(part.part_id)  # `_call` made it, if it was new
        nudge: Intervene | None = None
        deadlines: tuple[Deadline, ...] = ()
        if decision is not None and running and call is not None:
            decision, nudge, deadlines = self._held_back(session, call, part, decision, seeding)
        if running and follows:
            now = self._gate.decide(
                part.session_id, session, call, decision, self.directory_of(part.session_id)
            )
        else:
            now = decision
        if finished and seeding is None:
            session.finish(part.part_id)  # done with: a read-back keeps it for its duplicates
        if starts and call is not None and not transparent:
            bound = call_bound(part.tool, part.input, self.detection.call_seconds)
            if bound is not None:
                deadlines = (Deadline(part.session_id, part.part_id, bound), *deadlines)
        if isinstance(now, Reply):
            done = tuple(d for d in (late, nudge) if d is not None)
            return Fed(done, label, replies=(now,), deadlines=deadlines)
        decisions = tuple(d for d in (late, nudge, now) if d is not None)
        if decisions or deadlines:
            return Fed(decisions, label, deadlines=deadlines)
        return _QUIET[label]

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
        """The loop a finished call still owes: found before it ran but not refused."""
        late = None
        if call is not None and call.key is not None:
            # The gate sees the update first: a call must be known before its loop is decided.
            late = self._gate.finished(session, call, live=live)
        elif call is not None and call.loop is not None:
            late = call.loop  # the plugin never asked (it fell open): stop the run after all
        if call is not None and call.state is CallState.LATE:
            late = None  # its run is over: nothing of it is stopped any more
        awaited = self._awaiting_end.pop(part.part_id, None)
        if awaited is not None:
            late = awaited  # the loop found at this call's start, handed over however it ended
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
        seeding: _Seeding | None,
    ) -> tuple[Intervene | None, Intervene | None, tuple[Deadline, ...]]:
        """A loop found as its call starts running: what is decided now, the nudge to send
        (the call runs), and the wait for the call's end, instead of acting at once."""
        if decision.plan == Plan.NUDGE:
            return None, decision, ()  # the call runs: nothing to refuse
        if seeding is not None or call.request is not None:
            return decision, None, ()
        if session.plugin and call.call_id is not None:
            # The plugin's request for this call is on its way: it blocks the call.
            call.loop = decision
            return None, None, ()
        if self._own_refusal_wait:
            # A plugin asking nobody may be refusing it: its end says, within the wait.
            self._awaiting_end[part.part_id] = decision
            wait = Deadline(part.session_id, part.part_id, self._own_refusal_wait, loop=True)
            return None, None, (wait,)
        return decision, None, ()

    def _awaits_refusal(self, session: SessionRecord, part: ToolPart, label: str) -> Fed:
        """The stream carries the session's next call before the plugin asks about it (they
        race), while a refusal waits for it: not recorded; the plugin's question, when it
        comes, is refused with it (`judge` finds it unasked, `Call.loop`), and should the
        call end unasked (the plugin fell open), the run is stopped then, as for any loop."""
        call = self._identify_part(part)
        session.start(call)
        advance(call, CallEvent.RUN)
        advance(call, CallEvent.CUT)
        call.loop, session.pending = session.pending, None
        return _QUIET[label]

    def _call(
        self, session: SessionRecord, call: Call | None, part: ToolPart, seeding: _Seeding | None
    ) -> Intervene | None:
        """Take a tool call's update: move it through its life (monitor/core/calls.py) and do
        what that says: record it, take its outcome, ask the rules."""
        finished = part.status in _FINISHED
        if not finished and part.status != "running":
            return None  # `pending`: no input yet; its `running` update will come
        if seeding is None:
            event = CallEvent.FINISH if finished else CallEvent.RUN
        else:
            # The shell connects the stream before it reads the messages back, so nothing
            # that happens in between is lost; an update made in that gap then reaches us
            # twice, in the messages and on the stream, and must count once: every part read
            # back stays in flight, also a finished one, and its later updates are repeats.
            event = CallEvent.READ_FINISH if finished else CallEvent.READ_RUN
        if call is None:
            call = self._identify_part(part)
            session.start(call)
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
        if record:
            session.calls += 1
            self._begin(session)
            if seeding is not None:
                if seeding.decided:
                    # A run that looped several times before we came is stopped once, at the
                    # first call where `watch` would have stopped it; later calls are counted
                    # (positions stay call numbers) but not recorded.
                    return None
                if part.part_id == session.intervened_part:
                    # The run read back is the one we just stopped, its feedback not stored
                    # yet: the same loop must not be acted on twice.
                    session.restart()
                    seeding.decided = True
                    return None
            if not self._record_at_running:
                call.recorded_as = hash((call.digest, call.outcome))
            session.record(call.recorded_as, call.tool, self.detection.history)
        return self._rules(
            session, call, record, outcome, part.session_id, part.part_id, seeding is None
        )

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
        a model that ignores the feedback gets no fresh budget of repetitions. Not for calls
        read back (`live` False): those were seen, and judged, before.
        """
        armed, finding = session.armed, session.armed_finding
        if live and armed is not None and finding is not None:
            if (record and call.digest in armed) or (
                # A stopped failure loop repeats as its failure, whatever the arguments.
                outcome and isinstance(finding, FailureRun) and failed_as(call) in armed
            ):
                return self._decide(session, session_id, finding, part_id, rearm=False)
        for rule in self._call_rules[record, outcome]:
            found = rule.call(session, call, record, outcome)
            if found is not None:
                return self._decide(session, session_id, found, part_id)
        return None

    def _delta(self, event: PartDelta) -> Intervene | None:
        finding = self.texts.delta(event)
        if finding is None:
            return None
        session = self._seen(event.session_id, event.directory)
        return self._decide(session, event.session_id, finding, event.part_id)

    def _text_part(self, part: TextPart) -> Intervene | None:
        held = self._sessions.get(part.session_id)
        if (
            held is not None
            and held.held
            and held.held == part.message_id
            and not part.text.startswith(MARKS)
        ):
            held.held = None  # a person wrote: the hold is over
        self.texts.part(part)
        if not part.ended or not self._text_rules:
            return None
        session = self._sessions.get(part.session_id)
        for rule in self._text_rules:
            if session is None:
                session = self._seen(part.session_id, part.directory)
            finding = rule.text(session, part)
            if finding is not None:
                return self._decide(session, part.session_id, finding, part.part_id)
        return None

    def _decide(
        self,
        session: SessionRecord,
        session_id: str,
        finding: Finding,
        part_id: str,
        rearm: bool = True,
    ) -> Intervene:
        directory = self._default_directory
        return decide(session, session_id, finding, part_id, self.detection, directory, rearm)


_FINISHED = ("completed", "error")
_RECORDS = (Step.RECORD, Step.RECORD_TAKE)
_TAKES = (Step.TAKE, Step.RECORD_TAKE)


def _judged(decision: Intervene | None) -> Judged:
    """The plugin's answer for a call that completes `decision`'s loop (None: no loop)."""
    if decision is None:
        return Judged()
    if decision.plan == Plan.NUDGE:
        return Judged(ALLOW, decision)
    return Judged(block(decision.refusal), decision)
