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
    SessionDeleted,
    SessionIdle,
    SessionSeen,
    ToolPart,
    parse_event,
)
from monitor.core.feedback import feedback_text
from monitor.core.frames import FrameError, decode_frame
from monitor.core.guard import LoopGuard, RecentMap
from monitor.core.ids import is_session_id
from monitor.core.rules.cycle import Cycle

MatchMode = Literal["input", "input+output"]
OnLoop = Literal["resume", "hold"]

# Parts of one session that started but have not finished yet; a model step rarely runs more
# than a few calls at once, so this bound only matters for a server that never finishes any.
_MAX_IN_FLIGHT = 64


@dataclass(frozen=True, slots=True)
class Intervene:
    """Stop this session's run and give the model `feedback`.

    `rule` names the rule that found the loop (`cycle`, ...): it goes into logs, metrics,
    replay output and the feedback.
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
    """What counts as a loop and what to do about it; the tracker's settings."""

    max_period: int = 4
    repeats: int = 3
    history: int = 32
    match: MatchMode = "input"
    ignore_tools: frozenset[str] = frozenset()
    ignore_args: Mapping[str, frozenset[str]] | None = None
    on_loop: OnLoop = "resume"
    max_interventions: int = 2
    max_sessions: int = 10_000


@dataclass(frozen=True, slots=True)
class Fed:
    """What one frame did: the decisions it led to, and what the shell counts and logs.

    `event_type` is a bounded label (a known type, "other" or "malformed"); `malformed` says
    why the frame could not be used; `deleted` is the session the frame deleted.
    """

    decisions: tuple[Intervene, ...] = ()
    event_type: str = OTHER
    malformed: str | None = None
    deleted: str | None = None


# Most frames change nothing the shell must act on: one shared result per event type, so the
# hot path allocates nothing for them.
_QUIET = {label: Fed(event_type=label) for label in (*KNOWN_EVENT_TYPES, OTHER, MALFORMED)}


class _Seeding:
    """State of one `Tracker.seed` call: whether it has decided yet."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        self.decided = False


class _Session:
    __slots__ = ("directory", "interventions", "calls", "run_start", "intervened_part", "in_flight")

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
        # updates must not be recorded a second time. None until needed, to stay small.
        self.in_flight: dict[str, None] | None = None


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
        # The daemon acts on ids (they go into request paths): one that is not of OpenCode's
        # shape makes its frame malformed. Off for replay and the core's own tests.
        self._check_ids = check_ids
        self._guard = LoopGuard(
            max_history=detection.history,
            max_sessions=detection.max_sessions,
            max_period=detection.max_period,
            repeats=detection.repeats,
        )
        self._ignore_args = dict(detection.ignore_args or {})
        self._record_at_running = detection.match == "input"
        self._default_directory = directory
        self._sessions: RecentMap[str, _Session] = RecentMap(detection.max_sessions)
        # Events of every other session are ignored, as if the stream did not carry them.
        self.only_session = only_session
        self.malformed: Counter[str] = Counter()
        # Sessions taken in since the start (one forgotten and seen again counts twice).
        self.sessions_seen = 0

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
        session.calls = session.run_start
        seeding = _Seeding()
        decisions: list[Intervene] = []
        for frame in frames:
            decisions += self._feed(frame, seeding).decisions
            seeding.decided = seeding.decided or bool(decisions)
        return decisions

    def follows(self, session_id: str) -> bool:
        """False for the sessions `only_session` leaves out."""
        return self.only_session is None or session_id == self.only_session

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
        known: dict[str, str | None] = {}
        for session_id in self._sessions:
            session = self._sessions.get(session_id)
            known[session_id] = None if session is None else session.directory
        return known

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
            session.run_start = session.calls

    def forget(self, session_id: str) -> None:
        self._guard.clear(session_id)
        self._sessions.pop(session_id)

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
        if self.only_session is not None and event.session_id != self.only_session:
            return _QUIET[label]
        if isinstance(event, ToolPart):
            decision = self._tool_part(event, seeding)
            return _QUIET[label] if decision is None else Fed((decision,), label)
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

    def _tool_part(self, part: ToolPart, seeding: _Seeding | None) -> Intervene | None:
        if part.tool in self.detection.ignore_tools:
            return None
        session = self._seen(part.session_id, part.directory)
        if not self._first_full_update(session, part):
            return None
        session.calls += 1
        if seeding is not None:
            # The shell connects the stream before it reads the messages back, so nothing
            # that happens in between is lost; an update made in that gap then reaches us
            # twice, in the messages and on the stream, and must count once. So every part
            # read back is held in flight, also a finished one: its later updates on the
            # stream are dropped as live. A part still `pending` (no input yet) is not
            # recorded here (`_first_full_update`): its `running` on the stream will be.
            _hold_in_flight(session, part.part_id)
            if seeding.decided:
                # A run that looped several times before we came is stopped once, at the
                # first call where `watch` would have stopped it; later calls are counted
                # (positions stay call numbers) but not recorded.
                return None
            if part.part_id == session.intervened_part:
                # The run read back is the one we just stopped, its feedback not stored yet:
                # the same loop must not be acted on twice.
                self._guard.clear(part.session_id)
                seeding.decided = True
                return None
        cycle = self._guard.record(part.session_id, part.tool, self._call_args(part))
        if cycle is None:
            return None
        return self._intervene(session, part, cycle)

    def _first_full_update(self, session: _Session, part: ToolPart) -> bool:
        """True on the update at which a call is recorded; each part is recorded once."""
        finished = part.status in ("completed", "error")
        in_flight = session.in_flight
        if finished and in_flight is not None and part.part_id in in_flight:
            del in_flight[part.part_id]
            return False
        if part.status == "running" and self._record_at_running:
            if in_flight is not None and part.part_id in in_flight:
                return False  # bash re-sends `running` while it streams output
            _hold_in_flight(session, part.part_id)
            return True
        # `completed` or `error` of a part whose `running` we never saw (or, in input+output
        # mode, never record at): this is its one full update.
        return finished

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

    def _intervene(self, session: _Session, part: ToolPart, cycle: Cycle) -> Intervene:
        tools = self._guard.tools(part.session_id, cycle.length)
        # Later updates of the parts already recorded must not fire again, so the history
        # starts over; the in-flight set stays to keep recognising those parts.
        self._guard.clear(part.session_id)
        prior = session.interventions
        session.interventions += 1
        session.intervened_part = part.part_id
        detection = self.detection
        escalated = detection.on_loop == "resume" and prior >= detection.max_interventions
        hold = escalated or detection.on_loop == "hold"
        return Intervene(
            rule="cycle",
            session_id=part.session_id,
            directory=session.directory or self._default_directory,
            cycle=cycle,
            tools=tools,
            part_id=part.part_id,
            call_index=session.calls,
            prior_interventions=prior,
            hold=hold,
            escalated=escalated,
            feedback=feedback_text(cycle, tools, hold, prior + 1),
        )


def _hold_in_flight(session: _Session, part_id: str) -> None:
    """Remember a recorded part until its final update comes."""
    in_flight = session.in_flight
    if in_flight is None:
        in_flight = session.in_flight = {}
    elif part_id in in_flight:
        return
    if len(in_flight) >= _MAX_IN_FLIGHT:
        del in_flight[next(iter(in_flight))]
    in_flight[part_id] = None
