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
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from monitor.core.budget import BudgetBook
from monitor.core.calls import CallEvent, advance
from monitor.core.decisions import Deadline, Intervene, Outcome, Reply
from monitor.core.detection import SEED, Detection, rules_of
from monitor.core.events import (
    MALFORMED,
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
    Summary,
    TextPart,
    ToolPart,
    UserMessage,
    WorkspaceState,
)
from monitor.core.events_v2 import Adapter
from monitor.core.fed import QUIET, Fed, Judged, SessionView
from monitor.core.feedback import MARKS
from monitor.core.findings import RULES, DoomLoop, Finding
from monitor.core.frames import FrameError, decode_frame
from monitor.core.handover import WaitEvent, handed
from monitor.core.ids import is_permission_id, is_session_id
from monitor.core.ladder import FirstAction, OnLoop
from monitor.core.permissions import DOOM_LOOP_CALLS, PermissionGate
from monitor.core.plan import decide, withhold
from monitor.core.plugin_protocol import PluginCall
from monitor.core.profile import ENGINE_NAMES, NO_NAMES
from monitor.core.resync import Waiting
from monitor.core.rules.facts import SIGNALS, Signals
from monitor.core.runs import RunEvent, run_advance
from monitor.core.server import session_route
from monitor.core.session import Call, RecentMap, SessionRecord
from monitor.core.texts import TextStreams
from monitor.core.tool_updates import Seeding, ToolUpdates

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


# How an intervention ended, as far as whether it stopped its run (`SessionRecord.stopping`):
# stopped (another monitor's doing, or the one acting for this server, counts as stopped), or
# the run goes on.
_STOPPED = (Outcome.ABORTED, Outcome.HELD)
_NOT_STOPPED = (
    Outcome.DRY_RUN,
    Outcome.ABORT_FAILED,
    Outcome.CANCELLED,
    Outcome.NUDGED,
    Outcome.BLOCKED,
    Outcome.REJECTED,
    Outcome.ANSWERED,
)


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
        self._default_directory = directory
        # The one table of session state (monitor/core/session.py).
        self._sessions: RecentMap[str, SessionRecord] = RecentMap(detection.max_sessions)
        # Events of every other session are ignored, as if the stream did not carry them.
        self.only_session = only_session
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
        # Frames of either server generation become the same events (monitor/core/events_v2.py);
        # the shell asks it which sessions speak 2.x and where their replays resume.
        self.adapter = Adapter(detection.max_sessions)
        # Whether the server has the classic routes (the shell says so after each detection):
        # one without them runs every session on the new engine (`route`).
        self._classic = True
        # A tool part's updates, and the plugin's questions about a call (the hot path).
        self._tools = ToolUpdates(
            detection,
            call_rules,
            self._sessions,
            self._gate,
            self._seen,
            self._decide,
            self.directory_of,
            self.route,
            own_refusal_wait,
        )
        self.stray = self._tools.stray
        # What each kind of event (a tool part aside) does to the sessions: one look-up, not a
        # chain of type tests, on every frame.
        self._handlers: dict[type, Callable[[Any, str], Fed]] = {
            PartDelta: self._on_delta,
            SessionSeen: self._on_seen,
            MessageUsage: self._usage,
            UserMessage: self._on_user,
            Summary: self._on_summary,
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
        """The time bound of a call has passed: `ToolUpdates.overdue`."""
        return self._tools.overdue(deadline)

    def judge(self, asked: PluginCall) -> Judged:
        """The plugin asks whether a call may run: `ToolUpdates.judge`."""
        return self._tools.judge(asked)

    def seed(
        self,
        session_id: str,
        frames: Iterable[object],
        directory: str | None = None,
        interventions: int = 0,
        held: bool = False,
        late: Iterable[object] = (),
    ) -> list[Intervene]:
        """Read a session's current run back from the server before following it live.

        After a reconnect, at start, and for `attach`: events missed while away are gone, so
        the run is rebuilt from `frames`, what `monitor.core.export.export_frames` makes of its
        messages (each part in the state it had when they were read). The run starts over
        (its history and in-flight parts go; its intervention count stays) and the frames go
        through the rules of the live stream, with the differences `ToolUpdates.update` explains.
        Returns its decisions, for the shell to carry out as those of any frame.

        `interventions` is how many feedback messages the session's record holds, so that
        escalation counts the interventions of an earlier monitor process too; `held` whether
        its last user message is the feedback of a hold (`monitor.core.export.held_in`): the
        messages say whether it still waits for a person, whatever we believed.

        `late` are the frames of the calls the record shows unfinished in runs that are over
        (`monitor.core.export.late_frames`: an abort's calls, whose ends come after the
        feedback that starts the next run): their calls are late from the start, so their
        ends are counted nowhere, as for a monitor that followed the abort live.
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
        late, frames = list(late), list(frames)
        self._learn_calls(session_id, (*late, *frames))
        for frame in late:
            self._read_late(session_id, session, frame)
        seeding = Seeding()
        decisions: list[Intervene] = []
        for frame in frames:
            fed = self._feed(frame, seeding)
            # A loop whose call's request came before its `running` update, which only the
            # messages read back show: `seed` returns decisions, so the abort stops it.
            decisions += (*fed.decisions, *(r.loop for r in fed.replies if r.loop is not None))
            seeding.decided = seeding.decided or bool(decisions)
        return decisions

    def _learn_calls(self, session_id: str, frames: Iterable[object]) -> None:
        """A new-engine session's calls read back unfinished are named to the adapter, whose
        later events of them name no tool (`Adapter.learn`)."""
        if self.adapter.engine(session_id) != 2:
            return
        for frame in frames:
            part = self.adapter.parse(frame)[1]
            if isinstance(part, ToolPart) and part.status in ("pending", "running"):
                self.adapter.learn(session_id, part)

    def _read_late(self, session_id: str, session: SessionRecord, frame: object) -> None:
        """A call read back unfinished in a run that is over: late (`seed`)."""
        part = self.adapter.parse(frame)[1]
        if not isinstance(part, ToolPart) or part.session_id != session_id:
            return
        call = session.call(part.part_id)
        if call is None:
            digest = self._tools.digest(part.tool, part.input)
            call = Call(part.part_id, part.tool, digest, None, part.call_id)
            session.start(call)
        advance(call, CallEvent.END)

    def read_back_deadlines(self, session_id: str) -> tuple[Deadline, ...]:
        """The time bounds of the session's calls read back still running (`seed`)."""
        return self._tools.read_back_deadlines(session_id)

    def server_routes(self, classic: bool) -> None:
        """The server was detected: whether it has the classic `/session` routes."""
        self._classic = classic

    def engine_sessions(self, session_ids: Iterable[str]) -> None:
        """The server named these sessions as the new engine's (its list of active ones, a
        look-up): they are routed so before any frame of theirs comes."""
        self.adapter.speak_engine(session_ids)

    def named_busy(self, engine: int, session_ids: Iterable[str]) -> None:
        """The busy sessions one engine's route named (`engine` 2: the new one's list)."""
        if engine == 2:
            self.engine_sessions(session_ids)

    def waits(self, waiting: Waiting, session_id: str, directory: str | None) -> bool:
        """Whether a question about the session waits for the resync under way, placed as
        its first frame would be: by the engine its frames (or the server) said it runs on."""
        return waiting.waits(session_id, directory, self.adapter.engine(session_id))

    def route(self, session_id: str) -> int:
        """Which engine's routes act on the session (`Intervene.route`): 2 on a server
        without the classic ones, for a session whose frames are the new engine's, or one the
        server named as such (`engine_sessions`); else 1."""
        return session_route(self._classic, self.adapter.engine(session_id))

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
        stopping = session.stopping
        if outcome in _STOPPED and decision.run == session.runs:
            session.stopping = decision  # a block that had to abort: as `plan.decide` marks
        elif (
            outcome in _NOT_STOPPED
            and stopping is not None
            and (stopping.run, stopping.prior_interventions)
            == (decision.run, decision.prior_interventions)
        ):
            session.stopping = None  # no abort came (a dry run, a failed one): the run goes on
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
        released = handed(session.waiting, WaitEvent.RUN_END)
        session.waiting = None  # no wait of the session's outlives its run: an idle one is small
        if session.compacted:
            # A compaction a person asked for (`/summarize`) ends in idle, and a person's
            # prompt goes on: a compaction is not a run (issue 44), as an automatic one is
            # not. The run's history, the rules' state, its budget, and the runs a stopped loop
            # stays armed for all go on.
            session.run = run_advance(session.run, RunEvent.END)[0]
            return released
        session.run, ended = run_advance(session.run, RunEvent.END)
        session.restart()
        self._budgets.end_run(session_id)  # idempotent: a spent budget reset twice is reset
        if ended:
            session.end_calls()
            session.run_start = session.calls
            session.runs += 1
            if not session.ahead_of_stream():
                session.acted = None  # an intervention stands for its run only
            session.stopping = None
            session.run_ended()
        return released

    def run_over(self, decision: Intervene) -> bool:
        """Whether the run `decision` was made in has ended since (or the session is gone)."""
        session = self._sessions.get(decision.session_id)
        return session is None or session.runs != decision.run

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

    def _feed(self, frame: object, seeding: Seeding | None) -> Fed:
        if isinstance(frame, Malformed):
            return self._malformed(MALFORMED, frame.reason)
        label, event = self.adapter.parse(frame)
        if event is None:
            return QUIET[label]
        if isinstance(event, Malformed):
            return self._malformed(label, event.reason)
        if isinstance(event, FileEdited):  # names no session, only its directory
            self._files_edited(event.directory or self._default_directory)
            return QUIET[label]
        if self._check_ids:  # the daemon acts on ids: they go into request paths
            if not is_session_id(event.session_id):
                return self._malformed(label, f"{label}: sessionID is not of the shape ses_...")
            if isinstance(event, PermissionAsked) and not is_permission_id(event.request_id):
                return self._malformed(label, f"{label}: id is not of the shape per_...")
        if self.only_session is not None and event.session_id != self.only_session:
            return QUIET[label]
        if isinstance(event, ToolPart):  # the one kind a read-back seeds
            return self._tools.update(event, seeding, label)
        return self._handlers[type(event)](event, label)

    def _on_delta(self, event: PartDelta, label: str) -> Fed:
        decision = self._delta(event)
        return QUIET[label] if decision is None else Fed((decision,), label)

    def _on_seen(self, event: SessionSeen, label: str) -> Fed:
        seen = self._seen(event.session_id, event.directory)
        if event.busy:
            seen.run = run_advance(seen.run, RunEvent.BEGIN)[0]
        tripped = self._budgets.session(event.session_id, event.parent_id)
        if tripped is None:
            return QUIET[label]
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
        if asked is not None:
            if asked.held is not None:
                asked.held = event.message_id
                if event.text is not None and not event.text.startswith(MARKS):
                    # A person's message stored ends the hold, whether or not a run takes
                    # it now (2.x's `resume: false`, 1.x's `noReply`): as the read-back
                    # (`export.held_in`, the inbox after the record) tells after a restart.
                    asked.held = None
            asked.compacted = False  # a prompt (or the "continue"): the compaction is over
        return QUIET[label]

    def _on_summary(self, event: Summary, label: str) -> Fed:
        self._seen(event.session_id, event.directory).summary = event.message_id
        return QUIET[label]

    def _on_diff(self, event: SessionDiff, label: str) -> Fed:
        diffed = self._sessions.get(event.session_id)
        if diffed is not None and diffed.running:
            diffed.state(SIGNALS, Signals).diffed(event.digest)
        return QUIET[label]

    def _on_workspace(self, event: WorkspaceState, label: str) -> Fed:
        # Seen as well: 2.x's step start is also what tells a session's directory.
        measured = self._seen(event.session_id, event.directory)
        if measured.running:
            measured.state(SIGNALS, Signals).measured(event.digest)
        return QUIET[label]

    def _on_text(self, event: TextPart, label: str) -> Fed:
        decision = self._text_part(event)
        return QUIET[label] if decision is None else Fed((decision,), label)

    def _on_idle(self, event: SessionIdle, label: str) -> Fed:
        self._seen(event.session_id, event.directory)
        released = self.end_run(event.session_id)
        return QUIET[label] if released is None else Fed((released,), label)

    def _on_asked(self, event: PermissionAsked, label: str) -> Fed:
        if self._gate.mode == "off":
            return QUIET[label]
        session = self._seen(event.session_id, event.directory)
        where = self.directory_of(event.session_id)
        reply = self._gate.asked(
            session, event, where, self.route(event.session_id), self._doom_loop
        )
        return QUIET[label] if reply is None else Fed(event_type=label, replies=(reply,))

    def _on_replied(self, event: PermissionReplied, label: str) -> Fed:
        replied = self._sessions.get(event.session_id)
        if replied is not None:
            self._gate.replied(replied, event)
        return QUIET[label]

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
        finished = self._sessions.get(usage.session_id)
        if finished is not None:  # a compaction's summary finished, or a step after it
            finished.compacted = usage.message_id == finished.summary
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
            return QUIET[label]
        tokens, cost, reached = taken
        session_id = usage.session_id
        if reached is None:
            if not tokens and not cost:
                return QUIET[label]
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
        tool = request.tool or request.permission
        finding = DoomLoop(tool, DOOM_LOOP_CALLS)
        # The request names the repeated call by its arguments: that call's identity is the
        # loop, so a burst whose call the plugin refused already (its history started over
        # with that refusal) is recognised as that loop again, not counted as a second.
        calls = (
            None if request.input is None else frozenset((self._tools.digest(tool, request.input),))
        )
        return self._decide(session, request.session_id, finding, part_id, calls=calls)

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
        if session is not None and part.message_id == session.summary:
            # A compaction's summary: the run goes on after it as if it were not there, the
            # count of the model's same answers included.
            return None
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
        calls: frozenset[int] | None = None,
    ) -> Intervene:
        directory, route = self._default_directory, self.route(session_id)
        # A 2.x server's tools are `shell` and `subagent`, 1.18.33's new engine's as its own.
        names = NO_NAMES if self._classic else ENGINE_NAMES
        return decide(
            session,
            session_id,
            finding,
            part_id,
            self.detection,
            directory,
            rearm,
            route,
            calls,
            names,
        )
