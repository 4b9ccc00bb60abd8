"""Typing OpenCode 2 events: the new session engine's stream, as the core's own events.

OpenCode 2.0 (and the new engine that 1.18.33 runs for sessions made and prompted under
`/api`) does not send part updates. A call is a row of events: `tool.input.started` {callID,
name}, `tool.called` {callID, input}, then `tool.success` or `tool.failed`; text streams as
`text.started` / `.delta` / `.ended`; a model step ends with `step.ended` {finish, tokens,
cost}. 2.0 names them `session.tool.called`, ...; 1.18.33 `session.next.tool.called` and
`permission.v2.asked`. `Adapter.parse` turns both into the events `parse_event` makes of a 1.x
frame, so the tracker and its rules never know which server spoke:

- `tool.input.started`: a `ToolPart` pending (input `{}`); `tool.called`: running, with the
  input; `tool.success` / `tool.failed`: completed (`structured` as metadata: the shell's
  `exit`) / error;
- `text.*`, `reasoning.*`: `TextPart` started / ended, `PartDelta`;
- `step.started` with a `snapshot` (the workspace's, as 1.x's `step-start` part carries it):
  `WorkspaceState`; without one, `SessionSeen`;
- `step.ended`: `MessageUsage`; the step that ends with another reason than `tool-calls`
  ended the run too (`ends_run`: 1.18.33 sends neither `execution.*` nor status events for
  the new engine); `execution.succeeded` / `.failed` / `.interrupted`, `status` idle, `idle`:
  `SessionIdle`;
- `permission.asked` / `.replied`: `PermissionAsked` / `PermissionReplied`;
- `prompt.admitted` (a user message stored): `UserMessage`; `prompted` (it starts a turn): its
  text as a user's `TextPart`, which is how a person's message ends a hold.

A call's part id is its step's message id and its call id: models reuse call ids (`call_0`
in every run). Calls are named in the 1.x way (`core/profile.py` `server_call`).

Where the frames come from (seen on the real 1.18.33, `tests/recordings/engine/`):
- `/api/event` and the per-session replay `/api/session/{id}/event?after=SEQ`: envelopes
  `{id, type, durable?{aggregateID, seq}, location?{directory}, data}`;
- `/global/event`: the live copy as `{directory, payload: {type, properties}}` with no seq,
  and for every durable event a `sync` copy `{payload: {type: "sync", syncEvent: {type:
  "<name>.<version>", seq, aggregateID, data}}}`. Durable events are taken from the sync copy
  (it has the seq), ephemeral ones (deltas, status) from the live copy (they have no other);
- `/event`: the live copy `{type, properties}` alone.

Durable events count up per session (`seq`); an event at or below the last seq taken for its
session is one we had (a replay after a reconnect overlaps the live stream) and is dropped, so
no call is counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from monitor.core.events import (
    CATALOGUE_EVENT_TYPES,
    KNOWN_EVENT_TYPES,
    Event,
    Malformed,
    MessageUsage,
    PartDelta,
    PermissionAsked,
    PermissionReplied,
    SessionDeleted,
    SessionIdle,
    SessionSeen,
    TextPart,
    ToolPart,
    UserMessage,
    WorkspaceState,
    parse_event,
    parse_unwrapped,
    usage_total,
    workspace_digest,
)
from monitor.core.profile import server_call
from monitor.core.session import RecentMap

__all__ = [
    "IGNORED",
    "Adapter",
    "engine_name",
    "result_metadata",
    "result_output",
    "session_of",
]

# The 1.18.33 names of 2.0's events, by the part that differs.
_V1_18_PREFIXES = (("session.next.", "session."), ("permission.v2.", "permission."))

# Live copies on `/global/event` worth reading: the ones with no sync copy (never stored).
_EPHEMERAL = frozenset(
    {
        "session.text.delta",
        "session.reasoning.delta",
        "session.tool.input.delta",
        "session.tool.progress",
        "session.status",
        "session.idle",
        "session.usage.updated",
        "permission.asked",
        "permission.replied",
    }
)

# What a step ends with when the model asked for tools: the run goes on.
_MORE_STEPS = frozenset({"tool-calls", "tool_calls"})
# Calls remembered per session until they end: a few steps of parallel calls.
_CALLS_REMEMBERED = 256
# The most of a call's input kept while it runs (about, in characters): its later events do
# not repeat it, but by then the tracker has the call's identity (its digest, made when it
# started running), so a larger input is not kept. Kept whole, 1,200 calls of 400 KB in
# flight held 478 MB here, against 17 MB on the 1.x stream.
_INPUT_KEPT = 4096


def engine_name(kind: str) -> str | None:
    """The 2.0 name of a 2.x event type (1.18.33's `session.next.*` / `permission.v2.*`
    included), or None for a type that is not of the new engine."""
    for old, new in _V1_18_PREFIXES:
        if kind.startswith(old):
            return new + kind[len(old) :]
    return None


# The known types that are no 2.x event: most frames, which `parse` hands on without asking
# `engine_name` for each.
_CLASSIC = frozenset(kind for kind in KNOWN_EVENT_TYPES if engine_name(kind) is None) - {"sync"}


def session_of(frame: object) -> tuple[str | None, str | None, int]:
    """The session a decoded frame of either generation is about, the directory it came from
    (None where it does not say) and the engine it speaks (2: the new one), without the
    adapter's state: the shell asks it while a resync runs, to hold only the frames of the
    sessions it rebuilds (a 2.x frame parsed early would move its session's seq past the
    replay that must come first)."""
    if not isinstance(frame, dict):
        return None, None, 1
    data = frame.get("data")
    if data is not None and "properties" not in frame:  # an `/api` envelope
        location = frame.get("location")
        where = location.get("directory") if isinstance(location, dict) else None
    else:
        payload = frame.get("payload")
        event = payload if isinstance(payload, dict) else frame
        where = frame.get("directory")
        kind = event.get("type")
        if kind == "sync":
            sync = event.get("syncEvent")
            if not isinstance(sync, dict) or not isinstance(name := sync.get("type"), str):
                return None, None, 1
            if engine_name(name.rsplit(".", 1)[0]) is None:
                return None, None, 1  # a 1.x stored event: the adapter takes its live copy
            data = sync.get("data")
        elif isinstance(kind, str) and engine_name(kind) is not None:
            data = event.get("properties")
        else:
            _, parsed = parse_event(frame)
            if parsed is None or isinstance(parsed, Malformed):
                return None, None, 1
            return getattr(parsed, "session_id", None), getattr(parsed, "directory", None), 1
    session_id = data.get("sessionID") if isinstance(data, dict) else None
    if not isinstance(session_id, str) or not session_id:
        return None, None, 2
    return session_id, _directory(where), 2


class _Session:
    """What the adapter keeps of one new-engine session."""

    __slots__ = ("inbox", "seq", "tools")

    def __init__(self) -> None:
        self.seq = -1  # the last durable seq taken (`session.created` is 0)
        # Call id -> tool name (from `tool.input.started`) and raw input (from `tool.called`,
        # when small: `_kept`) of the calls in flight: the events after them repeat neither.
        self.tools: dict[str, tuple[str, object]] = {}
        # Inbox id -> the start of a user message's text, from `inbox.enqueued` until its
        # `inbox.delivered` (which names the message only): `_delivered`.
        self.inbox: dict[str, str] = {}


class Adapter:
    """Types frames of either server generation; knows which sessions speak 2.x.

    One per tracker: it keeps, per new-engine session, the last durable seq taken (what a
    replay resumes after) and the tool name of each call in flight (2.0 names the tool only
    when its input starts). At most `capacity` sessions, the least recently active dropped.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._sessions: RecentMap[str, _Session] = RecentMap(capacity)

    def parse(self, frame: object) -> tuple[str, Event | Malformed | None]:
        """`parse_event` for a 1.x frame, the table above for a 2.x one."""
        if not isinstance(frame, dict):
            return parse_event(frame)
        data = frame.get("data")
        if data is not None and "properties" not in frame:
            # An `/api` envelope (the live stream or a session's replay).
            return self._envelope(frame, data)
        payload = frame.get("payload")
        kind = (payload if isinstance(payload, dict) else frame).get("type")
        if kind in _CLASSIC:
            if isinstance(payload, dict):
                directory = frame.get("directory")
                if directory is None or isinstance(directory, str):
                    return parse_unwrapped(kind, payload, directory)
            elif "payload" not in frame:
                return parse_unwrapped(kind, frame, None)
            return parse_event(frame)  # what is malformed about it
        if kind == "sync" and isinstance(payload, dict):
            return self._sync(payload.get("syncEvent"), frame.get("directory"))
        name = engine_name(kind) if isinstance(kind, str) else None
        if name is None:
            return parse_event(frame)
        directory = None
        event: dict[str, Any] = frame
        if isinstance(payload, dict):
            if name not in _EPHEMERAL:
                return _label(name), None  # its sync copy, with its seq, follows
            directory, event = frame.get("directory"), payload
        props = event.get("properties")
        if not isinstance(props, dict):
            return _label(name), Malformed(f"{_label(name)}: properties is not an object")
        return self._typed(name, props, None, _directory(directory))

    def engine(self, session_id: str) -> int:
        """2 for a session seen on the new engine, else 1."""
        return 2 if session_id in self._sessions else 1

    def speak_engine(self, session_ids: Iterable[str]) -> None:
        """The server named these sessions as the new engine's (`/api/session/active`, a
        look-up) before any frame of theirs said so: they are its sessions from now on."""
        for session_id in session_ids:
            self._sessions.touch(session_id, _Session)

    def learn(self, session_id: str, part: ToolPart) -> None:
        """A call of a new-engine session read back still running (`Tracker.seed`): its
        end (`session.tool.success` / `failed`) names no tool, and the tool was named by a
        `tool.input.started` this process never saw (a restart, a reconnect)."""
        session = self._sessions.get(session_id)
        if session is None or part.call_id is None:
            return
        if part.call_id not in session.tools and len(session.tools) >= _CALLS_REMEMBERED:
            del session.tools[next(iter(session.tools))]
        session.tools[part.call_id] = (part.tool, _kept(part.input, part.part_id))

    def last_seq(self, session_id: str) -> int | None:
        """The last durable seq taken of a new-engine session: where its replay resumes."""
        session = self._sessions.get(session_id)
        return None if session is None or session.seq < 0 else session.seq

    def sessions(self) -> list[str]:
        """The new-engine sessions known, oldest first."""
        return list(self._sessions)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id)

    def _envelope(
        self, frame: dict[str, Any], data: object
    ) -> tuple[str, Event | Malformed | None]:
        kind = frame.get("type")
        if not isinstance(kind, str):
            return "malformed", Malformed("event type missing")
        name = _KNOWN_NAMES.get(kind)
        if name is None:
            return "other", None
        if not isinstance(data, dict):
            return name, Malformed(f"{name}: data is not an object")
        durable = frame.get("durable")
        seq = durable.get("seq") if isinstance(durable, dict) else None
        location = frame.get("location")
        directory = location.get("directory") if isinstance(location, dict) else None
        return self._typed(name, data, seq, _directory(directory))

    def _sync(self, event: object, directory: object) -> tuple[str, Event | Malformed | None]:
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return "sync", None
        # "session.next.tool.called.1": the name, then the version of its schema.
        name = engine_name(event["type"].rsplit(".", 1)[0])
        if name is None:
            return "sync", None  # a 1.x stored event: its live copy was typed
        data = event.get("data")
        if not isinstance(data, dict):
            return "sync", Malformed(f"{_label(name)}: data is not an object")
        # Counted as a `sync` copy, as 1.x's are: its live copy is counted under its name.
        _, typed = self._typed(name, data, event.get("seq"), _directory(directory))
        return "sync", typed

    def _typed(
        self, name: str, data: dict[str, Any], seq: object, directory: str | None
    ) -> tuple[str, Event | Malformed | None]:
        label = _label(name)
        parse = _PARSERS.get(name)
        session_id = data.get("sessionID")
        if not isinstance(session_id, str) or not session_id:
            if parse is None:
                return label, None
            return label, Malformed(f"{label}: sessionID is not a non-empty string")
        session = self._sessions.touch(session_id, _Session)
        if type(seq) is int:
            if seq <= session.seq:
                return label, None  # taken already: a replay overlapping the live stream
            session.seq = seq
        if parse is None:
            return label, None
        try:
            return label, parse(session, session_id, data, directory)
        except _Mistyped as exc:
            return label, Malformed(f"{label}: {exc}")


class _Mistyped(Exception):
    pass


def _label(name: str) -> str:
    # 2.0's names are in `KNOWN_EVENT_TYPES` with 1.x's: the metrics' label set is one.
    return name if name in KNOWN_EVENT_TYPES else "other"


def _directory(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _text(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise _Mistyped(f"{key} is not a non-empty string")
    return value


def _optional(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) and value else None


def _call_id(data: dict[str, Any]) -> str:
    # `callID` in the schema and on 1.18.33; clients of 2.0.6-2.0.21 read `id`.
    return _optional(data, "callID") or _text(data, "id")


def _tool(
    session: _Session, session_id: str, data: dict[str, Any], directory: str | None, status: str
) -> ToolPart:
    call_id = _call_id(data)
    known = session.tools.get(call_id)
    tool = _optional(data, "tool") or _optional(data, "name") or (known and known[0])
    if not tool:
        raise _Mistyped("the call's tool is not known (its input.started was missed)")
    message_id = _optional(data, "assistantMessageID")
    part_id = f"{message_id}:{call_id}" if message_id else call_id
    # Only `called` carries the input; the outcome is told apart by the call it ends.
    raw = data["input"] if "input" in data else (known[1] if known else {})
    name, args = server_call(tool, raw)
    output = error = metadata = None
    if status in ("completed", "error"):
        metadata = result_metadata(data)
    if status == "completed":
        output = result_output(data)
    elif status == "error":
        failure = data.get("error")
        error = failure.get("message", failure) if isinstance(failure, dict) else failure
    if status in ("completed", "error"):
        session.tools.pop(call_id, None)
    else:
        if known is None and len(session.tools) >= _CALLS_REMEMBERED:
            del session.tools[next(iter(session.tools))]
        session.tools[call_id] = (tool, _kept(raw, part_id))
    return ToolPart(
        session_id,
        part_id,
        name,
        status,
        args,
        output,
        error,
        directory,
        metadata,
        message_id,
        call_id,
    )


def _kept(raw: object, part_id: str) -> object:
    """What is kept of a running call's input for its outcome's update: the input when it is
    small, else a stand-in of this call alone. The tracker reads the input of an outcome's
    update only for a call it no longer holds (more in flight than a session keeps): then
    this call is one of its own, never the same as another (no false loop; such a loop among
    that many parallel calls is missed)."""
    budget = _INPUT_KEPT
    stack = [raw]
    while stack:
        item = stack.pop()
        # Counted before its members are walked, so the walk stops within the bound.
        budget -= len(item) if isinstance(item, (str, dict, list)) else 1
        if budget < 0:
            return {"\u2026": f"input over {_INPUT_KEPT} characters, not kept: {part_id}"}
        if isinstance(item, dict):
            stack += item
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return raw


def result_output(result: dict[str, Any]) -> object:
    """A finished call's output as a 1.x call's: its content blocks' text, else its
    structured result, else `result`. The stream's `tool.success` and a stored message's tool
    state (core/export_v2.py) say it alike, and both must read alike: the failure rule
    compares outputs, and a read-back that kept none made six different failures one."""
    return _text_of(result.get("content")) or result.get("structured") or result.get("result")


def result_metadata(result: dict[str, Any]) -> dict[str, Any] | None:
    """A finished call's metadata as a 1.x call's `state.metadata`: 2.2.5 sends it as
    `metadata` (the shell's `exit` there), the schema and 1.18.33 as `structured`. The
    failure and no-progress rules read a shell's exit status from it: without it a `shell`
    that exits 1 reached them as a success. The stream's `tool.success` / `tool.failed` and a
    stored message's tool state (core/export_v2.py) say it alike."""
    for key in ("metadata", "structured"):
        value = result.get(key)
        if isinstance(value, dict):
            return value
    return None


def _text_of(content: object) -> object:
    """A result's content blocks as the one text a 1.x call's output is, when they are text
    (`[{"type": "text", "text": ...}]`): the rules read outputs as text, and a list they
    cannot read made every failing shell command look the same (rule `failure`)."""
    if not isinstance(content, list) or not content:
        return content
    texts = [
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    ]
    return "".join(texts) if len(texts) == len(content) else content


def _input_started(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    return _tool(s, sid, data, d, "pending")


def _called(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    return _tool(s, sid, data, d, "running")


def _success(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    return _tool(s, sid, data, d, "completed")


def _failed(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    return _tool(s, sid, data, d, "error")


def _text_id(data: dict[str, Any], kind: str) -> str:
    # 1.18.33 names a text `textID` ("text-0"), 2.0 counts them by kind (`ordinal`).
    own = _optional(data, "textID") or _optional(data, "reasoningID")
    if own is None:
        ordinal = data.get("ordinal", 0)
        own = f"{kind}-{ordinal if type(ordinal) is int else 0}"
    message = _optional(data, "assistantMessageID")
    return f"{message}:{own}" if message else own


_Parse = Callable[[_Session, str, dict[str, Any], str | None], Event | None]


def _text_event(kind: str, ended: bool) -> _Parse:
    def parse(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
        text = data.get("text", "") if ended else ""
        if not isinstance(text, str):
            raise _Mistyped("text is not a string")
        return TextPart(
            sid,
            _text_id(data, kind),
            kind,
            text,
            started=True,
            ended=ended,
            directory=d,
            message_id=_optional(data, "assistantMessageID"),
        )

    return parse


def _delta(kind: str) -> _Parse:
    def parse(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
        delta = data.get("delta")
        if not isinstance(delta, str):
            raise _Mistyped("delta is not a string")
        return PartDelta(sid, _text_id(data, kind), "text", delta, d)

    return parse


def _step_ended(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    tokens, cost = usage_total(data)
    # Another finish than `tool-calls`: the model answered without asking for tools, the
    # run is over (1.18.33 sends no idle for it).
    ends_run = data.get("finish") not in _MORE_STEPS
    return MessageUsage(sid, _text(data, "assistantMessageID"), tokens, cost, d, ends_run)


def _seen(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    info = data.get("info")
    info = info if isinstance(info, dict) else data
    return SessionSeen(sid, _own_directory(info, data, d), _optional(info, "parentID"))


def _own_directory(info: dict[str, Any], data: dict[str, Any], d: str | None) -> str | None:
    own = _directory(info.get("directory"))
    location = data.get("location")
    if own is None and isinstance(location, dict):
        own = _directory(location.get("directory"))
    return own or d


def _step_started(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    snapshot = data.get("snapshot")
    if not isinstance(snapshot, str) or not snapshot:
        return _seen(s, sid, data, d)
    # A step's start names no parent: its directory is all `_seen` would have told.
    return WorkspaceState(sid, workspace_digest(snapshot), _own_directory(data, data, d))


def _admitted(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    # A user message stored: a person's prompt or the monitor's feedback (with `resume:
    # false` for a hold, nothing more follows it).
    return UserMessage(sid, _text(data, "messageID"), d)


def _prompted(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    """The admitted message starts a turn: its text tells a person's message from the
    monitor's feedback (`_user_text`)."""
    prompt = data.get("prompt")
    text = prompt.get("text") if isinstance(prompt, dict) else data.get("text")
    if not isinstance(text, str):
        raise _Mistyped("prompt.text is not a string")
    return _user_text(sid, _text(data, "messageID"), text, d)


def _user_text(sid: str, message_id: str, text: str, d: str | None) -> TextPart:
    """A user message's text as 1.x's user text part (neither started nor ended: not one the
    model writes): on a held session, the tracker ends the hold at the text of the user
    message it was told of last (`UserMessage`) unless it is the monitor's own (`MARKS`)."""
    return TextPart(sid, f"{message_id}:prompt", "text", text, False, False, d, message_id)


# The most of a user message's text kept between its `inbox.enqueued` and its delivery.
# Only its start is read (whether it is the monitor's feedback: `feedback.MARKS`); no text
# rule reads a user's text (its part is never `ended`), so a pasted megabyte is not kept.
_USER_TEXT_KEPT = 1024
# Messages kept per session until delivered: one posted with `resume: false` (a hold's
# feedback, a note) waits in the inbox until a later run takes it.
_INBOX_REMEMBERED = 64


def _enqueued(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event | None:
    """2.2.5's user message stored (`inbox.enqueued` {inboxID, item: {type, payload: {text},
    delivery}}): a person's prompt or the monitor's feedback, told apart by its text.

    1.x says a user message in two updates, the message (`UserMessage`), then its text part;
    2.2.5 says it once as it is stored, then once as a run takes it (`inbox.delivered`, the
    id alone). The message is told here with its text's start, which ends a held session's
    hold as soon as a person's message is stored (one posted with `resume: false` waits in
    the inbox, and a person has written all the same: a 1.x `noReply` message ends it too);
    its text part at the delivery, once, as on 1.x. Items that are no user's message (a
    `synthetic` note, a compaction, a move) are left out.
    """
    item = data.get("item")
    if not isinstance(item, dict):
        raise _Mistyped("item is not an object")
    if item.get("type") != "user":
        return None
    payload = item.get("payload")
    text = payload.get("text") if isinstance(payload, dict) else None
    if not isinstance(text, str):
        raise _Mistyped("item.payload.text is not a string")
    inbox_id = _text(data, "inboxID")
    if inbox_id not in s.inbox and len(s.inbox) >= _INBOX_REMEMBERED:
        del s.inbox[next(iter(s.inbox))]
    s.inbox[inbox_id] = text[:_USER_TEXT_KEPT]
    return UserMessage(sid, inbox_id, d, text[:_USER_TEXT_KEPT])


def _delivered(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event | None:
    """A run takes a stored message (`inbox.delivered` {inboxID}): its text, kept since its
    `inbox.enqueued`. One this process did not see stored (a restart) is left out: which
    message it was, the read-back says (`Tracker.seed`, `export.held_in`)."""
    inbox_id = _text(data, "inboxID")
    text = s.inbox.pop(inbox_id, None)
    return None if text is None else _user_text(sid, inbox_id, text, d)


def _step_failed(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    """A step that failed (2.2.5: `{error: {type: "aborted", message: "Step interrupted"}}`
    after an interrupt) in place of its `step.ended`: its spend, when it says one, counted as
    any step's. The run's end is not its to say: `execution.interrupted` / `.failed` follows
    it (a step the server retries is not the run's last)."""
    tokens, cost = usage_total(data)
    return MessageUsage(sid, _text(data, "assistantMessageID"), tokens, cost, d)


def _status(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    status = data.get("status")
    kind = status.get("type") if isinstance(status, dict) else status
    return SessionIdle(sid, d) if kind == "idle" else SessionSeen(sid, d)


def _execution_started(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    # 2.2.5's run begins (it sends no `session.status`): 1.x's `session.status` busy.
    return SessionSeen(sid, d, busy=True)


def _idle(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    return SessionIdle(sid, d)


def _deleted(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    return SessionDeleted(sid)


def _permission_asked(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    source = data.get("source")
    source = source if isinstance(source, dict) else {}
    legacy = data.get("tool")  # the 1.x shape, which 2.0 still sends as `permission.asked`
    legacy = legacy if isinstance(legacy, dict) else {}
    metadata = data.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    permission = _optional(data, "action") or _text(data, "permission")
    return PermissionAsked(
        sid,
        _text(data, "id"),
        permission,
        _optional(source, "messageID") or _optional(legacy, "messageID"),
        _optional(source, "callID") or _optional(source, "id") or _optional(legacy, "callID"),
        _optional(metadata, "tool"),
        d,
    )


def _permission_replied(s: _Session, sid: str, data: dict[str, Any], d: str | None) -> Event:
    reply = _optional(data, "reply") or _text(data, "decision")
    return PermissionReplied(sid, _text(data, "requestID"), reply)


_PARSERS: dict[str, _Parse] = {
    "session.created": _seen,
    "session.prompt.admitted": _admitted,
    "session.input.admitted": _admitted,
    "session.prompted": _prompted,
    "session.step.started": _step_started,
    "session.deleted": _deleted,
    "session.status": _status,
    "session.idle": _idle,
    "session.inbox.enqueued": _enqueued,
    "session.inbox.delivered": _delivered,
    "session.execution.started": _execution_started,
    "session.execution.succeeded": _idle,
    "session.execution.failed": _idle,
    "session.execution.interrupted": _idle,
    "session.step.ended": _step_ended,
    "session.step.failed": _step_failed,
    "session.text.started": _text_event("text", ended=False),
    "session.text.delta": _delta("text"),
    "session.text.ended": _text_event("text", ended=True),
    "session.reasoning.started": _text_event("reasoning", ended=False),
    "session.reasoning.delta": _delta("reasoning"),
    "session.reasoning.ended": _text_event("reasoning", ended=True),
    "session.tool.input.started": _input_started,
    "session.tool.called": _called,
    "session.tool.success": _success,
    "session.tool.failed": _failed,
    "permission.asked": _permission_asked,
    "permission.replied": _permission_replied,
}

# The 2.2.5 types (../shared/opencode/V2-REAL-NOTES.md, section 3) that say nothing of a run
# the rules judge, and why each is read as nothing: typed on purpose as no event, not left
# unknown. Those of a session still go through `Adapter._typed`: their seq is taken (where
# a replay resumes) and their session known as the new engine's.
IGNORED: Mapping[str, str] = MappingProxyType(
    {
        "server.connected": "the stream is open; the shell knows it already",
        "server.heartbeat": "the server lives: 2.x's `: heartbeat` comment, decoded as 1.x's "
        "event (core/frames.py), keeps the stream's frame deadline",
        "session.renamed": "the session's title",
        "session.instructions.updated": "digests of the system prompt's parts",
        "session.step.streamed": "the model's reply has streamed; the step ends at step.ended",
        "session.tool.input.delta": "a call's input as it streams; tool.called has it whole",
        "session.tool.input.ended": "a call's input as raw text; tool.called has it parsed",
        "session.tool.progress": "a running call's progress (its shell's id): it runs since "
        "tool.called",
        "session.usage.updated": "the session's totals; each step's spend is counted at its "
        "step.ended",
        "shell.created": "the process of a shell call; the call is typed by its own events",
        "shell.exited": "the process's exit; tool.success carries it in the call's metadata",
        "shell.deleted": "the process's record let go after its exit or kill; the call's end is "
        "its tool.success / failed",
        "worktree.resolved": "a project's folder named (its id once its repository has a "
        "commit), no session's run",
        **dict.fromkeys(
            sorted(CATALOGUE_EVENT_TYPES),
            "the server's catalogue or workspace changed, no session's run (empty data)",
        ),
    }
)

# What an `/api` envelope's type names, for the known ones: `engine_name`, else the type itself.
# One look-up for every frame of that stream instead of trying each prefix. The 2.2.5 types
# typed or ignored on purpose are known even where the metrics' label set does not name them
# (`_label`: "other").
_ENGINE_TYPES = KNOWN_EVENT_TYPES | _PARSERS.keys() | IGNORED.keys()
_KNOWN_NAMES = {kind: kind for kind in _ENGINE_TYPES} | {
    old + kind.removeprefix(new): kind
    for old, new in _V1_18_PREFIXES
    for kind in _ENGINE_TYPES
    if kind.startswith(new)
}
