"""Event tracker: follows every session's tool calls and decides when to intervene.

Fed decoded frames of either stream form, it returns a `Fed` result (the decisions, the
event's type, why a frame was malformed) and never raises on what the server sends. It is the
whole policy of the monitor; the asyncio shell only carries out the `Intervene` decisions it
returns and counts what the result says.

For `attach` it follows one session only (`only_session`) and takes that session's past
through `seed` under the same rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from monitor.core.events import (
    KNOWN_EVENT_TYPES,
    MALFORMED,
    OTHER,
    Malformed,
    PartDelta,
    PermissionAsked,
    PermissionReplied,
    SessionDeleted,
    SessionIdle,
    SessionSeen,
    TextPart,
    ToolPart,
    parse_event,
)
from monitor.core.feedback import feedback_text, text_feedback_text
from monitor.core.frames import FrameError, decode_frame
from monitor.core.guard import LoopGuard, RecentMap
from monitor.core.ids import is_permission_id, is_session_id
from monitor.core.limits import check_history, derived_history
from monitor.core.permissions import (
    DOOM_LOOP,
    DOOM_LOOP_CALLS,
    PermissionGate,
    PermissionMode,
    Reply,
)
from monitor.core.profile import Profile, ignored_args, transparent_tools
from monitor.core.rules.cycle import Cycle
from monitor.core.rules.failure import FailureRun, failure_digest
from monitor.core.rules.text import StepRepeats, TextStream, text_digest
from monitor.core.rules.waiting import answers_in_progress, waits_by_command
from monitor.core.signature import canonical_signature, signature_digest

MatchMode = Literal["input", "input+output"]
OnLoop = Literal["resume", "hold"]

# Parts of one session that started but have not finished yet; a model step rarely runs more
# than a few calls at once, so this bound only matters for a server that never finishes any.
_MAX_IN_FLIGHT = 64
# Text and reasoning parts streaming at once, over all sessions; the oldest is dropped first.
# Each holds at most about 3 KB (docs/performance.md), so all of them stay under 12 MB.
MAX_STREAMING_PARTS = 4096
# Distinct waiting calls remembered per run; a run rarely waits on more than a few things.
_MAX_WAITING = 16

# Every rule's name, as decisions, logs, the metric label and `evaluate` carry it.
RULES = ("cycle", "failure", "wait", "text_repeat", "text_steps", DOOM_LOOP)


@dataclass(frozen=True, slots=True)
class Intervene:
    """Stop this session's run and give the model `feedback`.

    `rule` names the rule that found the loop (`cycle`, ..., or `doom_loop`: the server's own
    check, seen as its permission request): it goes into logs, metrics, replay output and the
    feedback.
    """

    rule: str
    session_id: str
    directory: str | None
    cycle: Cycle
    tools: tuple[str, ...]
    part_id: str
    call_index: int
    prior_interventions: int
    hold: bool
    escalated: bool
    feedback: str


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
    max_sessions: int = 10_000
    # Text loops (monitor/core/rules/text.py); 0 turns a check off.
    text_repeats: int = 5  # back-to-back repetitions of a passage inside one part
    text_steps: int = 8  # successive steps of a run with the same whole text
    failure_repeats: int = 4
    wait_calls: int = 20
    profile: Profile = "opencode"

    # How the server's permission requests are answered (monitor.core.permissions); "off"
    # leaves them all to others, and every loop to the abort.
    permissions: PermissionMode = "off"
    permission_grace: float = 30.0

    def __post_init__(self) -> None:
        if not self.history:
            derived = derived_history(self.max_period, self.repeats, self.wait_calls)
            object.__setattr__(self, "history", derived)  # frozen: set once, here
        check_history(self.history, self.max_period, self.repeats, self.wait_calls)


# Exactly the seed's behaviour: exact arguments, periods 1-4 repeated 3 times, a single call
# on its 4th, nothing else. `dataclasses.replace` it to keep other settings.
SEED = Detection(
    max_period=4, failure_repeats=0, wait_calls=0, profile="none", text_repeats=0, text_steps=0
)


@dataclass(frozen=True, slots=True)
class Fed:
    """What one frame did: the decisions it led to, and what the shell counts and logs.

    `event_type` is a bounded label (a known type, "other" or "malformed"); `malformed` says
    why the frame could not be used; `deleted` is the session the frame deleted; `replies`
    are the permission requests to answer.
    """

    decisions: tuple[Intervene, ...] = ()
    event_type: str = OTHER
    malformed: str | None = None
    deleted: str | None = None
    replies: tuple[Reply, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionView:
    """One followed session as `Tracker.sessions_view` shows it (for `status`)."""

    session_id: str
    directory: str | None
    # Calls of a run under way are remembered; false once the run ended or an intervention
    # dropped them.
    busy: bool
    run_calls: int  # tool calls of the current run
    calls: int  # tool calls seen since the session was first seen
    interventions: int


# Most frames change nothing the shell must act on: one shared result per event type, so the
# hot path allocates nothing for them.
_QUIET = {label: Fed(event_type=label) for label in (*KNOWN_EVENT_TYPES, OTHER, MALFORMED)}


class _Seeding:
    """State of one `Tracker.seed` call: whether it has decided yet."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        self.decided = False


class _Session:
    __slots__ = (
        "directory",
        "interventions",
        "calls",
        "run_start",
        "intervened_part",
        "in_flight",
        "steps",
        "failures",
        "waiting",
    )

    def __init__(self) -> None:
        self.directory: str | None = None
        self.interventions = 0
        self.calls = 0
        # `calls` when the current run began, so a run read back again (`seed`) is not
        # counted twice.
        self.run_start = 0
        # The part that completed the last cycle: a seed that replays the same run must not
        # act on it a second time (the feedback may not be stored yet when we read back).
        self.intervened_part: str | None = None
        # Part ids recorded at `running` whose final update has not come yet: their later
        # updates must not be recorded a second time. The value says whether the part's
        # outcome was already taken (a part read back finished, or one a decision stopped).
        # None until needed, to stay small.
        self.in_flight: dict[str, bool] | None = None
        # The run of identical failures (rule `failure`); None until a call fails.
        self.failures: FailureRun | None = None
        # Digests of the run's calls that wait (rule `wait`); None until one does.
        self.waiting: dict[int, None] | None = None
        # The current run's finished text and reasoning parts, by kind. None until needed.
        self.steps: dict[str, StepRepeats] | None = None

    def reset_rules(self) -> None:
        """A new run, or a run stopped: the rules' own state starts over."""
        self.failures = None
        self.waiting = None
        self.steps = None


class Tracker:
    """Feeds frames through the loop rules; see `feed`."""

    def __init__(
        self,
        detection: Detection = Detection(),
        directory: str | None = None,
        only_session: str | None = None,
        check_ids: bool = False,
    ) -> None:
        self.detection = detection
        if detection.history < detection.wait_calls:
            raise ValueError(
                f"history ({detection.history}) must hold wait_calls ({detection.wait_calls})"
            )
        # The daemon acts on ids (they go into request paths): one that is not of OpenCode's
        # shape makes its frame malformed. Off for replay and the core's own tests.
        self._check_ids = check_ids
        self._guard = LoopGuard(
            max_history=detection.history,
            max_sessions=detection.max_sessions,
            max_period=detection.max_period,
            repeats=detection.repeats,
        )
        self._ignore_args = ignored_args(detection.profile, detection.ignore_args)
        self._transparent = transparent_tools(detection.profile, detection.ignore_tools)
        self._record_at_running = detection.match == "input"
        self._default_directory = directory
        self._sessions: RecentMap[str, _Session] = RecentMap(detection.max_sessions)
        # Events of every other session are ignored, as if the stream did not carry them.
        self.only_session = only_session
        self.permissions = PermissionGate(
            detection.permissions, detection.permission_grace, detection.max_sessions
        )
        self.malformed: Counter[str] = Counter()
        # Sessions taken in since the start (one forgotten and seen again counts twice).
        self.sessions_seen = 0
        # Text and reasoning parts being streamed, by part id, in the order they started.
        self._streams: dict[str, TextStream] = {}
        # Deltas that reached parts after a text loop was found in them, counted when each
        # such part ends: what stopping a text loop late costs.
        self.chunks_after_detection = 0

    def feed_data(self, data: str) -> Fed:
        """Take the data of one SSE event, as read from the stream or a recording."""
        try:
            frame = decode_frame(data)
        except FrameError as exc:
            return self._malformed(MALFORMED, str(exc))
        return self.feed(frame)

    def feed(self, frame: object) -> Fed:
        """Take one decoded frame (`/event` or `/global/event` form); say what it did.

        A `Malformed` in place of a frame (what `export_frames` makes of an unusable entry)
        is counted like any other malformed frame.
        """
        return self._feed(frame, None)

    def seed(
        self,
        session_id: str,
        frames: Iterable[object],
        directory: str | None = None,
        interventions: int = 0,
    ) -> list[Intervene]:
        """Read a session's current run back from the server before following it live.

        After a reconnect, at start, and for `attach`: events missed while away are gone, so
        the run is rebuilt from `frames`, what `monitor.core.export.export_frames` makes of its
        messages (each part in the state it had when they were read). The run starts over
        (its history and in-flight parts go; its intervention count stays) and the frames go
        through the rules of the live stream, with the differences `_tool_part` explains.

        `interventions` is how many feedback messages the session's record holds, so that
        escalation counts the interventions of an earlier monitor process too.
        """
        session = self._seen(session_id, directory)
        session.interventions = max(session.interventions, interventions)
        self._guard.clear(session_id)
        session.in_flight = None
        session.reset_rules()
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

    def directory_of(self, session_id: str) -> str | None:
        session = self._sessions.get(session_id)
        if session is None or session.directory is None:
            return self._default_directory
        return session.directory

    def running(self) -> dict[str, str | None]:
        """The sessions with a run under way (a history), with their directories."""
        return {session_id: self.directory_of(session_id) for session_id in self._guard}

    def known(self) -> dict[str, str | None]:
        """Every session held, with the directory the stream told us (None if it did not)."""
        return {session_id: session.directory for session_id, session in self._sessions.items()}

    def end_runs(self, session_ids: Iterable[str]) -> None:
        for session_id in session_ids:
            self.end_run(session_id)

    def history_length(self, session_id: str) -> int:
        """Calls of the session's current run that the rules remember."""
        return self._guard.history_length(session_id)

    @property
    def active_sessions(self) -> int:
        """Sessions with a run under way: what the sessions gauge reports."""
        return len(self._guard)

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())

    def interventions(self, session_id: str) -> int:
        session = self._sessions.get(session_id)
        return 0 if session is None else session.interventions

    def end_run(self, session_id: str) -> None:
        """The session's run is over: its history goes, its intervention count stays."""
        self._guard.clear(session_id)
        session = self._sessions.get(session_id)
        if session is not None:
            session.in_flight = None
            session.reset_rules()
            session.run_start = session.calls

    def sessions_view(self) -> list[SessionView]:
        """A read-only copy of what is known about every session held, oldest first."""
        return [
            SessionView(
                session_id,
                session.directory or self._default_directory,
                session_id in self._guard,
                session.calls - session.run_start,
                session.calls,
                session.interventions,
            )
            for session_id, session in self._sessions.items()
        ]

    def forget(self, session_id: str) -> None:
        self._guard.clear(session_id)
        self._sessions.pop(session_id)
        self.permissions.forget(session_id)

    def _feed(self, frame: object, seeding: _Seeding | None) -> Fed:
        if isinstance(frame, Malformed):
            return self._malformed(MALFORMED, frame.reason)
        label, event = parse_event(frame)
        if event is None:
            return _QUIET[label]
        if isinstance(event, Malformed):
            return self._malformed(label, event.reason)
        if self._check_ids and not is_session_id(event.session_id):
            return self._malformed(label, f"{label}: sessionID is not of the shape ses_...")
        if (
            self._check_ids
            and isinstance(event, PermissionAsked)
            and not is_permission_id(event.request_id)
        ):
            return self._malformed(label, f"{label}: id is not of the shape per_...")
        if self.only_session is not None and event.session_id != self.only_session:
            return _QUIET[label]
        if isinstance(event, PartDelta):  # the most frequent frames: first
            decision = self._delta(event)
            return _QUIET[label] if decision is None else Fed((decision,), label)
        if isinstance(event, ToolPart):
            return self._call(event, seeding, label)
        if isinstance(event, TextPart):
            decision = self._text_part(event)
            return _QUIET[label] if decision is None else Fed((decision,), label)
        if isinstance(event, PermissionAsked):
            reply = self.permissions.asked(
                event, self.directory_of(event.session_id), self._doom_loop
            )
            return _QUIET[label] if reply is None else Fed(event_type=label, replies=(reply,))
        if isinstance(event, PermissionReplied):
            self.permissions.replied(event)
            return _QUIET[label]
        if isinstance(event, SessionIdle):
            self._seen(event.session_id, event.directory)
            self.end_run(event.session_id)
        elif isinstance(event, SessionSeen):
            self._seen(event.session_id, event.directory)
        elif isinstance(event, SessionDeleted):
            self.forget(event.session_id)
            return Fed(event_type=label, deleted=event.session_id)
        return _QUIET[label]

    def _malformed(self, label: str, reason: str) -> Fed:
        self.malformed[reason] += 1
        return Fed(event_type=label, malformed=reason)

    def _seen(self, session_id: str, directory: str | None) -> _Session:
        if session_id not in self._sessions:
            self.sessions_seen += 1
        session = self._sessions.touch(session_id, _Session)
        if directory is not None:
            session.directory = directory
        return session

    def _call(self, part: ToolPart, seeding: _Seeding | None, label: str) -> Fed:
        # The gate sees the update first: a call must be known before its loop is decided.
        late = self.permissions.part(part, live=seeding is None)
        decision = self._tool_part(part, seeding)
        now = self.permissions.decide(part, decision, self.directory_of(part.session_id))
        if isinstance(now, Reply):
            return Fed(() if late is None else (late,), label, replies=(now,))
        decisions = tuple(d for d in (late, now) if d is not None)
        return Fed(decisions, label) if decisions else _QUIET[label]

    def _doom_loop(self, request: PermissionAsked, part_id: str) -> Intervene:
        """The server's `doom_loop` check found a loop: an intervention like our own."""
        session = self._seen(request.session_id, request.directory)
        tools = (request.tool or request.permission,)
        return self._decide(
            session, request.session_id, DOOM_LOOP, Cycle(1, DOOM_LOOP_CALLS), tools, part_id
        )

    def _tool_part(self, part: ToolPart, seeding: _Seeding | None) -> Intervene | None:
        if part.tool in self._transparent:
            return None
        session = self._seen(part.session_id, part.directory)
        record, outcome = self._update_kind(session, part)
        if record:
            session.calls += 1
            if seeding is not None:
                # The shell connects the stream before it reads the messages back, so nothing
                # that happens in between is lost; an update made in that gap then reaches us
                # twice, in the messages and on the stream, and must count once. So every part
                # read back is held in flight, also a finished one: its later updates on the
                # stream are dropped as live. A part still `pending` (no input yet) is not
                # recorded here (`_update_kind`): its `running` on the stream will be.
                _hold_in_flight(session, part.part_id, outcome)
                if seeding.decided:
                    # A run that looped several times before we came is stopped once, at the
                    # first call where `watch` would have stopped it; later calls are counted
                    # (positions stay call numbers) but not recorded.
                    return None
                if part.part_id == session.intervened_part:
                    # The run read back is the one we just stopped, its feedback not stored
                    # yet: the same loop must not be acted on twice.
                    self._guard.clear(part.session_id)
                    session.reset_rules()
                    seeding.decided = True
                    return None
            args = self._call_args(part)
            digest = signature_digest(canonical_signature(part.tool, args))
            if outcome:
                self._note_waiting(session, part, digest)
            decision = self._record(session, part, args, digest)
            if decision is not None:
                return decision
        elif outcome:
            self._note_waiting(session, part, None)
        return self._failure(session, part) if outcome else None

    def _update_kind(self, session: _Session, part: ToolPart) -> tuple[bool, bool]:
        """Whether this update records a call, and whether it brings the call's outcome.

        Each part is recorded once and its outcome taken once.
        """
        finished = part.status in ("completed", "error")
        in_flight = session.in_flight
        if finished and in_flight is not None and part.part_id in in_flight:
            taken = in_flight.pop(part.part_id)
            return False, not taken
        if part.status == "running" and self._record_at_running:
            if in_flight is not None and part.part_id in in_flight:
                return False, False  # bash re-sends `running` while it streams output
            _hold_in_flight(session, part.part_id, False)
            return True, False
        # `completed` or `error` of a part whose `running` we never saw (or, in input+output
        # mode, never record at): this is its one full update.
        return finished, finished

    def _record(
        self, session: _Session, part: ToolPart, args: Any, digest: int
    ) -> Intervene | None:
        """Rules `cycle` and `wait`: does this call complete a cycle?"""
        wait_calls = self.detection.wait_calls
        if wait_calls and waits_by_command(part.tool, args):
            _remember_waiting(session, digest)
        cycle = self._guard.record_digest(part.session_id, part.tool, digest)
        if cycle is None:
            return None
        waiting = session.waiting
        if waiting is not None and any(
            call in waiting for call in self._guard.block(part.session_id, cycle.length)
        ):
            # A wait gets its allowance; the history (at least wait_calls long) counts it.
            if cycle.length * cycle.repetitions < wait_calls:
                return None
            return self._intervene(session, part, "wait", cycle)
        return self._intervene(session, part, "cycle", cycle)

    def _note_waiting(self, session: _Session, part: ToolPart, digest: int | None) -> None:
        """A call answered "in progress" waits: later calls with its signature too."""
        if not self.detection.wait_calls or part.status != "completed":
            return
        if not answers_in_progress(part.output):
            return
        if digest is None:
            digest = signature_digest(canonical_signature(part.tool, self._call_args(part)))
        _remember_waiting(session, digest)

    def _failure(self, session: _Session, part: ToolPart) -> Intervene | None:
        """Rule `failure`: the same failure `failure_repeats` times in a row."""
        limit = self.detection.failure_repeats
        if not limit:
            return None
        digest = failure_digest(part.tool, part.status, part.output, part.error, part.metadata)
        failures = session.failures
        if failures is None:
            if digest is None:
                return None  # successes cost nothing until a call fails
            failures = session.failures = FailureRun()
        count = failures.feed(digest)
        if count < limit:
            return None
        return self._intervene(session, part, "failure", Cycle(1, count), (part.tool,))

    def _call_args(self, part: ToolPart) -> Any:
        args = part.input
        dropped = self._ignore_args.get(part.tool)
        if dropped and isinstance(args, dict):
            args = {key: value for key, value in args.items() if key not in dropped}
        if self._record_at_running:
            return args
        if part.status == "error":
            return {"input": args, "error": part.error}
        return {"input": args, "output": part.output}

    def _delta(self, event: PartDelta) -> Intervene | None:
        if not self.detection.text_repeats or event.field != "text":
            return None
        stream = self._streams.get(event.part_id)
        if stream is None:
            # Its first update was missed (we connected mid-part): judge it from here on.
            stream = self._stream(event.part_id, "text")
        found = stream.feed(event.delta)
        if found is None:
            return None
        cycle = Cycle(found.units, found.repetitions)
        return self._intervene_text(event, stream.kind, cycle, found.chunk, steps=False)

    def _stream(self, part_id: str, kind: str) -> TextStream:
        streams = self._streams
        if len(streams) >= MAX_STREAMING_PARTS:
            del streams[next(iter(streams))]
        stream = streams[part_id] = TextStream(kind, self.detection.text_repeats)
        return stream

    def _text_part(self, part: TextPart) -> Intervene | None:
        if not part.ended:
            if part.started and self.detection.text_repeats and part.part_id not in self._streams:
                self._stream(part.part_id, part.kind)
            return None
        stream = self._streams.pop(part.part_id, None)
        if stream is not None and stream.found is not None:
            self.chunks_after_detection += stream.chunks - stream.found.chunk
        digest = text_digest(part.text) if self.detection.text_steps else None
        if digest is None:
            return None
        session = self._seen(part.session_id, part.directory)
        if session.steps is None:
            session.steps = {}
        repeated = session.steps.setdefault(part.kind, StepRepeats()).see(digest)
        if repeated < self.detection.text_steps:
            return None
        return self._intervene_text(part, part.kind, Cycle(1, repeated), session.calls, steps=True)

    def _intervene_text(
        self, event: PartDelta | TextPart, kind: str, cycle: Cycle, index: int, steps: bool
    ) -> Intervene:
        session = self._seen(event.session_id, event.directory)
        session.reset_rules()  # the model gets a fresh start, as after a tool loop
        prior, hold, escalated = self._escalation(session)
        return Intervene(
            rule="text_steps" if steps else "text_repeat",
            session_id=event.session_id,
            directory=session.directory or self._default_directory,
            cycle=cycle,
            tools=(),
            part_id=event.part_id,
            call_index=index,
            prior_interventions=prior,
            hold=hold,
            escalated=escalated,
            feedback=text_feedback_text(
                kind, cycle.length, cycle.repetitions, steps, hold, prior + 1
            ),
        )

    def _escalation(self, session: _Session) -> tuple[int, bool, bool]:
        """Count one more intervention: the earlier ones, whether to hold, and whether that
        is because there were too many."""
        prior = session.interventions
        session.interventions += 1
        detection = self.detection
        escalated = detection.on_loop == "resume" and prior >= detection.max_interventions
        hold = escalated or detection.on_loop == "hold"
        return prior, hold, escalated

    def _intervene(
        self,
        session: _Session,
        part: ToolPart,
        rule: str,
        cycle: Cycle,
        tools: tuple[str, ...] | None = None,
    ) -> Intervene:
        if tools is None:
            tools = self._guard.tools(part.session_id, cycle.length)
        return self._decide(session, part.session_id, rule, cycle, tools, part.part_id)

    def _decide(
        self,
        session: _Session,
        session_id: str,
        rule: str,
        cycle: Cycle,
        tools: tuple[str, ...],
        part_id: str,
    ) -> Intervene:
        # Later updates of the parts already recorded must not fire again, so the history
        # starts over; the in-flight set stays to keep recognising those parts, and their
        # outcomes (the abort ends them in error) are not taken.
        self._guard.clear(session_id)
        session.reset_rules()
        if session.in_flight is not None:
            session.in_flight = dict.fromkeys(session.in_flight, True)
        session.intervened_part = part_id
        prior, hold, escalated = self._escalation(session)
        return Intervene(
            rule=rule,
            session_id=session_id,
            directory=session.directory or self._default_directory,
            cycle=cycle,
            tools=tools,
            part_id=part_id,
            call_index=session.calls,
            prior_interventions=prior,
            hold=hold,
            escalated=escalated,
            feedback=feedback_text(cycle, tools, hold, prior + 1, rule),
        )


def _hold_in_flight(session: _Session, part_id: str, taken: bool) -> None:
    """Remember a recorded part until its final update comes; `taken`: its outcome is known."""
    in_flight = session.in_flight
    if in_flight is None:
        in_flight = session.in_flight = {}
    elif part_id in in_flight:
        return
    if len(in_flight) >= _MAX_IN_FLIGHT:
        del in_flight[next(iter(in_flight))]
    in_flight[part_id] = taken


def _remember_waiting(session: _Session, digest: int) -> None:
    waiting = session.waiting
    if waiting is None:
        waiting = session.waiting = {}
    elif len(waiting) >= _MAX_WAITING:
        del waiting[next(iter(waiting))]
    waiting[digest] = None
