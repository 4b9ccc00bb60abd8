"""Typing events: turn a decoded frame of either OpenCode stream into a typed event.

Both stream forms reach here: `/event` frames (`{"type", "properties"}`) and `/global/event`
envelopes (`{"directory", "project", "payload"}`). Only the few event types the monitor acts
on are typed; every other type, the heartbeats and the `sync` copies that `/global/event`
sends of every stored event, come back as None. A frame of a known type whose fields are
missing or mistyped comes back as `Malformed`, never as an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar, dataclass_transform

from monitor.core.compaction import continues, is_summary
from monitor.core.signature import int_digest, text_crc

__all__ = [
    "Event",
    "FileEdited",
    "CATALOGUE_EVENT_TYPES",
    "KNOWN_EVENT_TYPES",
    "MALFORMED",
    "Malformed",
    "MessageUsage",
    "NO_DIFF",
    "OTHER",
    "PartDelta",
    "PermissionAsked",
    "PermissionReplied",
    "SessionDeleted",
    "SessionDiff",
    "SessionIdle",
    "SessionSeen",
    "Summary",
    "TextPart",
    "ToolPart",
    "UserMessage",
    "WorkspaceState",
    "parse_event",
    "parse_unwrapped",
    "usage_total",
    "workspace_digest",
]

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def _event(cls: type[_T]) -> type[_T]:
    """An event: a frozen dataclass to the type checker, which refuses any assignment to its
    fields (`tests/test_types.py` holds every event to it), and at run time a slotted
    dataclass with the same equality and hash. A frozen dataclass's own `__init__` sets each
    field through `object.__setattr__` (its `__setattr__` refuses), 2 to 7 times the cost
    of a plain one, and the tracker makes an event of most frames: 8.5 % of its time went
    there (docs/performance.md)."""
    return dataclass(slots=True, unsafe_hash=True)(cls)


@_event
class ToolPart:
    """One update of a tool call part; the same part id arrives several times as it runs."""

    session_id: str
    part_id: str
    tool: str
    status: str
    input: Any
    output: Any
    error: Any
    directory: str | None
    # `state.metadata`: bash puts its exit status there (`exit`), see `rules/failure.py`.
    metadata: Any = None
    # What a permission request names its call by (`tool.messageID`, `tool.callID`).
    message_id: str | None = None
    call_id: str | None = None


@_event
class TextPart:
    """An update of a text or reasoning part (`kind`). A part the model writes has `started`
    from its first (empty) update on and `ended` on its final one, which carries the whole
    text; a user's prompt is a text part too, but has neither. `message_id` names the
    message it belongs to."""

    session_id: str
    part_id: str
    kind: str
    text: str
    started: bool
    ended: bool
    directory: str | None
    message_id: str | None = None


@_event
class UserMessage:
    """A user message was stored or updated (`message.updated`, role user): a person's prompt
    or the monitor's feedback. Its text comes after it, as a text part of `message_id`; 2.x
    says it with the message as it is stored (`inbox.enqueued`): `text`, its start."""

    session_id: str
    message_id: str
    directory: str | None
    text: str | None = None


@_event
class Summary:
    """A compaction's summary is being written (`message.updated`, an assistant message with
    `summary: true`, before its text): that text is the server's, no step of the model's
    (monitor/core/compaction.py)."""

    session_id: str
    message_id: str
    directory: str | None


@_event
class PermissionAsked:
    """The server waits for an answer before it runs a call (`permission.asked`).

    `message_id` and `call_id` name the call; both are None for OpenCode's own `doom_loop`
    check, which names the repeated tool in `tool` instead, and the repeated call's
    arguments in `input` (what makes it the same loop as one of ours: `Tracker._doom_loop`).
    """

    session_id: str
    request_id: str
    permission: str
    message_id: str | None
    call_id: str | None
    tool: str | None
    directory: str | None
    input: Any = None


@_event
class PartDelta:
    """One streamed chunk of a part (`message.part.delta`): text and reasoning parts alike
    stream their `text` field this way; the part's kind came with its first update."""

    session_id: str
    part_id: str
    field: str
    delta: str
    directory: str | None


@_event
class PermissionReplied:
    """Someone answered a permission request: `once`, `always` or `reject`."""

    session_id: str
    request_id: str
    reply: str


@_event
class SessionSeen:
    """A session event that tells us the session's directory (created, updated, busy), and
    for `session.created` / `session.updated` its parent (`info.parentID`: a subagent's
    session points at the session that started it)."""

    session_id: str
    directory: str | None
    parent_id: str | None = None
    # `session.status` busy (or retry): a run is under way.
    busy: bool = False


@_event
class MessageUsage:
    """An assistant message's running totals (`message.updated` with its `finish` reason: the
    update that ends a step). `tokens` is input + output + reasoning + cache read and write;
    `cost` in USD. Each assistant message is one step (one model call)."""

    session_id: str
    message_id: str
    tokens: int
    cost: float
    directory: str | None
    # The step ended the run (the new engine's last `step.ended`: the model answered; it
    # sends no idle of its own): counted, then the run ends as at `session.idle`.
    ends_run: bool = False


@_event
class SessionDiff:
    """The session's files differ from its start (`session.diff`); `digest` says which files
    and by how much (names and line counts, not contents), to tell a new diff from the same."""

    session_id: str
    digest: int
    directory: str | None


@_event
class FileEdited:
    """An edit tool changed a file (`file.edited`); the event names no session, only the
    directory of the stream it came on (None on `/event`: the one the monitor follows)."""

    directory: str | None


@_event
class WorkspaceState:
    """What the session's workspace is, as the server measured it at a step's start or end:
    1.x's `snapshot` of a `step-start` / `step-finish` part (a git tree hash of OpenCode's own
    snapshot repository: the same files give the same hash). `digest` is 32 bits of it, never
    0; the hash itself is not kept."""

    session_id: str
    digest: int
    directory: str | None


@_event
class SessionIdle:
    """The session's run ended: a new run starts with a clean history."""

    session_id: str
    directory: str | None


@_event
class SessionDeleted:
    session_id: str


@_event
class Malformed:
    """A frame we could not use; `reason` is safe to log (it never quotes the frame)."""

    reason: str


Event = (
    ToolPart
    | TextPart
    | UserMessage
    | Summary
    | PartDelta
    | SessionSeen
    | SessionIdle
    | SessionDeleted
    | PermissionAsked
    | PermissionReplied
    | MessageUsage
    | SessionDiff
    | FileEdited
    | WorkspaceState
)

# Event types OpenCode sends on `/event` and inside `/global/event` envelopes. Anything else
# is counted as "other": the label set stays this size whatever the server sends.
# 2.2.5's catalogue and workspace changed: no session's run (`data` empty); the 2.x adapter
# ignores them on purpose (events_v2.IGNORED).
CATALOGUE_EVENT_TYPES = frozenset(
    {
        "project.updated",
        "integration.updated",
        "provider.updated",
        "model.updated",
        "agent.updated",
        "command.updated",
        "skill.updated",
        "websearch.updated",
        "reference.updated",
        "plugin.updated",
        "vcs.branch.updated",
    }
)
KNOWN_EVENT_TYPES = (
    frozenset(
        {
            "server.connected",
            "server.heartbeat",
            "server.instance.disposed",
            "global.disposed",
            "installation.updated",
            "installation.update-available",
            "project.updated",
            "lsp.updated",
            "lsp.client.diagnostics",
            "file.edited",
            "file.watcher.updated",
            "vcs.branch.updated",
            "message.updated",
            "message.removed",
            "message.part.updated",
            "message.part.delta",
            "message.part.removed",
            "permission.updated",
            "permission.asked",
            "permission.replied",
            "question.asked",
            "question.replied",
            "session.created",
            "session.updated",
            "session.deleted",
            "session.status",
            "session.idle",
            "session.error",
            "session.diff",
            "session.compacted",
            "todo.updated",
            "command.executed",
            "pty.created",
            "pty.updated",
            "pty.exited",
            "pty.deleted",
            "tui.prompt.append",
            "tui.command.execute",
            "tui.toast.show",
            "ide.installed",
            "sync",  # /global/event's copy of every stored event
        }
    )
    | frozenset(
        # OpenCode 2's session engine under its 2.0 names (1.18.33 sends them as
        # `session.next.*` / `permission.v2.*`); typed by `monitor/core/events_v2.py`.
        {
            "session.prompt.admitted",
            "session.prompted",
            "session.input.admitted",
            "session.execution.started",
            "session.execution.succeeded",
            "session.execution.failed",
            "session.execution.interrupted",
            "session.step.started",
            "session.step.ended",
            "session.step.failed",
            "session.text.started",
            "session.text.delta",
            "session.text.ended",
            "session.reasoning.started",
            "session.reasoning.delta",
            "session.reasoning.ended",
            "session.tool.input.started",
            "session.tool.input.delta",
            "session.tool.input.ended",
            "session.tool.called",
            "session.tool.progress",
            "session.tool.success",
            "session.tool.failed",
            "session.usage.updated",
            # Seen on the real 2.2.5 (V2-REAL-NOTES.md): the person's message (queued, then taken
            # by a run), the session's bookkeeping, a shell call's process.
            "session.inbox.enqueued",
            "session.inbox.delivered",
            "session.renamed",
            "session.instructions.updated",
            "session.step.streamed",
            "shell.created",
            "shell.exited",
            "shell.deleted",
        }
    )
    | CATALOGUE_EVENT_TYPES
    # A project's folder named once its repository has a commit (`global` before).
    | {"worktree.resolved"}
)
# Our own values, not the server's: a frame without a usable type, and everything unknown.
MALFORMED = "malformed"
OTHER = "other"


def event_label(kind: str) -> str:
    """An event type as a bounded label value: a known type, or "other"."""
    return kind if kind in KNOWN_EVENT_TYPES else OTHER


def parse_event(frame: object) -> tuple[str, Event | Malformed | None]:
    """Type one decoded frame: its event type as a bounded label, and the typed event.

    The envelope is unwrapped here and nowhere else. The label is what metrics count frames
    by: a known type, "other", or "malformed" when the frame has no usable type; the event is
    None for frames the monitor has no use for.
    """
    if not isinstance(frame, dict):
        return MALFORMED, Malformed("frame is not an object")
    directory = None
    if "payload" in frame:
        directory = frame.get("directory")
        if directory is not None and not isinstance(directory, str):
            return MALFORMED, Malformed("envelope directory is not a string")
        frame = frame["payload"]
        if not isinstance(frame, dict):
            return MALFORMED, Malformed("payload is not an object")
    kind = frame.get("type")
    if not isinstance(kind, str):
        return MALFORMED, Malformed("event type missing")
    return parse_unwrapped(kind, frame, directory)


def parse_unwrapped(
    kind: str, frame: dict[str, Any], directory: str | None
) -> tuple[str, Event | Malformed | None]:
    """`parse_event` of an event out of its envelope, of type `kind`: for a reader that has
    unwrapped it already (the adapter, on every frame)."""
    parse = _PARSERS.get(kind)
    if parse is None:
        return (kind if kind in KNOWN_EVENT_TYPES else OTHER), None  # `event_label`
    label = kind  # every kind parsed is a known type (tests/test_events.py)
    props = frame.get("properties")
    if not isinstance(props, dict):
        return label, Malformed(f"{kind}: properties is not an object")
    try:
        return label, parse(props, directory)
    except _Mistyped as exc:
        return label, Malformed(f"{kind}: {exc}")


class _Mistyped(Exception):
    pass


def _text(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise _Mistyped(f"{key} is not a non-empty string")
    return value


def _object(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise _Mistyped(f"{key} is not an object")
    return value


def _part_updated(
    props: dict[str, Any], directory: str | None
) -> ToolPart | TextPart | WorkspaceState | None:
    part = _object(props, "part")
    kind = part.get("type")
    if kind in _TEXT_KINDS:
        # The server's own "continue" after a compaction's summary: neither a step of the
        # model (it has a start and an end, as those do) nor a person writing.
        return None if continues(part) else _text_part(part, kind, directory)
    if kind in _STEP_KINDS:
        return _step_part(part, directory)
    if kind != "tool":
        return None
    state = _object(part, "state")
    # Positional: the most frequent event the tracker types, and keywords cost a third more.
    return ToolPart(
        _text(part, "sessionID"),
        _text(part, "id"),
        _text(part, "tool"),
        _text(state, "status"),
        state.get("input"),
        state.get("output"),
        state.get("error"),
        directory,
        state.get("metadata"),
        _optional_text(part, "messageID"),
        _optional_text(part, "callID"),
    )


_TEXT_KINDS = frozenset({"text", "reasoning"})
# A `patch` part is not read: its `hash` is the snapshot the step started from and its
# `files` what the step changed, both told by the steps' own snapshots already.
_STEP_KINDS = frozenset({"step-start", "step-finish"})


def _step_part(part: dict[str, Any], directory: str | None) -> WorkspaceState | None:
    snapshot = part.get("snapshot")
    if not isinstance(snapshot, str) or not snapshot:
        return None  # snapshots off (`"snapshot": false`, or no git): the workspace is unknown
    return WorkspaceState(_text(part, "sessionID"), workspace_digest(snapshot), directory)


def workspace_digest(snapshot: str) -> int:
    """32 bits of a snapshot hash; 0 stands for "unknown", so never 0."""
    return text_crc(snapshot) or 1


def _text_part(part: dict[str, Any], kind: str, directory: str | None) -> TextPart:
    text = part.get("text", "")
    if not isinstance(text, str):
        raise _Mistyped("text is not a string")
    time = part.get("time")
    if not isinstance(time, dict):
        time = {}
    return TextPart(
        _text(part, "sessionID"),
        _text(part, "id"),
        kind,
        text,
        started=time.get("start") is not None,
        ended=time.get("end") is not None,
        directory=directory,
        message_id=_optional_text(part, "messageID"),
    )


def _optional_text(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) and value else None


def _permission_asked(props: dict[str, Any], directory: str | None) -> PermissionAsked:
    # `tool` is absent or null for a `doom_loop` request; its metadata names the tool.
    call = props.get("tool")
    call = call if isinstance(call, dict) else {}
    metadata = props.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    permission = _text(props, "permission")
    return PermissionAsked(
        session_id=_text(props, "sessionID"),
        request_id=_text(props, "id"),
        permission=permission,
        message_id=_optional_text(call, "messageID"),
        call_id=_optional_text(call, "callID"),
        tool=_optional_text(metadata, "tool"),
        directory=directory,
        # Kept only where it names a loop: other requests are matched to their call by id.
        input=metadata.get("input") if permission == "doom_loop" else None,
    )


def _part_delta(props: dict[str, Any], directory: str | None) -> PartDelta:
    delta = props.get("delta")
    if not isinstance(delta, str):
        raise _Mistyped("delta is not a string")
    return PartDelta(
        _text(props, "sessionID"), _text(props, "partID"), _text(props, "field"), delta, directory
    )


def _permission_replied(props: dict[str, Any], directory: str | None) -> PermissionReplied:
    return PermissionReplied(
        _text(props, "sessionID"), _text(props, "requestID"), _text(props, "reply")
    )


def _session_info(props: dict[str, Any], directory: str | None) -> SessionSeen:
    info = _object(props, "info")
    own = info.get("directory")
    return SessionSeen(
        _text(info, "id"),
        own if isinstance(own, str) and own else directory,
        _optional_text(info, "parentID"),
    )


_TOKENS = ("input", "output", "reasoning")
_CACHE_TOKENS = ("read", "write")


def _count(value: object) -> int:
    return value if type(value) is int and value > 0 else 0


# What one step of a model can spend, at most, as the server reports it. A larger number is
# not a model's (a 400-digit count overflowed the float of a counter and dropped the stream;
# two costs of 1e308 made the cost counter +Inf): it counts 0, as a mistyped one does, so
# every sum a counter or a budget keeps stays finite.
MAX_STEP_TOKENS = 10**9
MAX_STEP_COST = 1e6


def _sum_counts(counts: dict[str, Any], keys: tuple[str, ...]) -> int:
    """The sum of the counts under `keys`; a missing, mistyped, negative or implausibly large
    one counts 0."""
    total = 0
    for key in keys:
        value = counts.get(key)
        if type(value) is int and 0 < value <= MAX_STEP_TOKENS:
            total += value
    return total


def _message_updated(
    props: dict[str, Any], directory: str | None
) -> UserMessage | Summary | MessageUsage | None:
    """A user message (a person's prompt or the monitor's feedback), a compaction's summary
    begun, or the usage of an assistant message so far."""
    info = _object(props, "info")
    role = info.get("role")
    if role == "user":
        return UserMessage(_text(info, "sessionID"), _text(info, "id"), directory)
    if role == "assistant" and not info.get("finish") and is_summary(info):
        # Sent as the summary's message is made, before any of its parts.
        return Summary(_text(info, "sessionID"), _text(info, "id"), directory)
    if role != "assistant" or not info.get("finish"):
        # The server updates an assistant message many times as it streams; its usage comes
        # with the update that ends a step (`finish`, the reason), so only that one is typed.
        return None
    total, cost = usage_total(info)
    return MessageUsage(_text(info, "sessionID"), _text(info, "id"), total, cost, directory)


def usage_total(info: dict[str, Any]) -> tuple[int, float]:
    """The tokens (input + output + reasoning + cache read and write) and cost of a step, as
    1.x messages and 2.x `step.ended` events both carry them."""
    total = 0
    tokens = info.get("tokens")
    if isinstance(tokens, dict):
        total = _sum_counts(tokens, _TOKENS)
        cache = tokens.get("cache")
        if isinstance(cache, dict):
            total += _sum_counts(cache, _CACHE_TOKENS)
    cost = info.get("cost", 0)
    if type(cost) not in (int, float) or not 0 <= cost <= MAX_STEP_COST:
        cost = 0  # a mistyped, negative or implausible cost (NaN, inf) spends nothing
    return total, float(cost)


# Files of one diff that go into its digest, at most: a diff of more files than this is
# told from the previous one by its first files and its length.
_DIFF_FILES = 256


def _session_diff(props: dict[str, Any], directory: str | None) -> SessionDiff:
    diff = props.get("diff")
    entries = diff if isinstance(diff, list) else []
    summary = [len(entries)]
    for entry in entries[:_DIFF_FILES]:
        if isinstance(entry, dict):
            file, status = str(entry.get("file")), str(entry.get("status"))
            added, deleted = _count(entry.get("additions")), _count(entry.get("deletions"))
            summary.append(text_crc(f"{file}\0{added}\0{deleted}\0{status}"))
    return SessionDiff(_text(props, "sessionID"), int_digest(*summary), directory)


# The digest of a `session.diff` that lists no file: what a run starts from.
NO_DIFF = int_digest(0)


def _file_edited(props: dict[str, Any], directory: str | None) -> FileEdited:
    _text(props, "file")
    return FileEdited(directory)


def _session_status(props: dict[str, Any], directory: str | None) -> SessionSeen | SessionIdle:
    session_id = _text(props, "sessionID")
    if _text(_object(props, "status"), "type") == "idle":
        return SessionIdle(session_id, directory)
    return SessionSeen(session_id, directory, busy=True)


def _session_idle(props: dict[str, Any], directory: str | None) -> SessionIdle:
    return SessionIdle(_text(props, "sessionID"), directory)


def _session_deleted(props: dict[str, Any], directory: str | None) -> SessionDeleted:
    return SessionDeleted(_text(props, "sessionID"))


_PARSERS = {
    "message.part.updated": _part_updated,
    "message.part.delta": _part_delta,
    "message.updated": _message_updated,
    "session.created": _session_info,
    "session.updated": _session_info,
    "session.status": _session_status,
    "session.idle": _session_idle,
    "session.deleted": _session_deleted,
    "permission.asked": _permission_asked,
    "permission.replied": _permission_replied,
    "session.diff": _session_diff,
    "file.edited": _file_edited,
}
