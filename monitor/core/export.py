"""Session exports: what `GET /session/{id}/message` answers, as the frames the stream carried.

Used to seed the tracker with what a session did before we could see it (after a reconnect,
at start, for `attach`) and to replay exported sessions offline. Pure: data in, frames out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from monitor.core.compaction import by_compaction, is_summary
from monitor.core.events import Malformed
from monitor.core.feedback import MARKS, OWN_REFUSALS, is_hold_feedback

__all__ = [
    "answered",
    "current_run",
    "export_frames",
    "feedback_count",
    "feedback_delivered",
    "held_in",
    "intervened",
    "late_frames",
    "tool_parts",
]


def _info(message: object) -> dict[str, Any] | None:
    info = message.get("info") if isinstance(message, dict) else None
    return info if isinstance(info, dict) else None


def _parts(message: object) -> list[Any] | None:
    parts = message.get("parts") if isinstance(message, dict) else None
    return parts if isinstance(parts, list) else None


def _is_user(message: object) -> bool:
    info = _info(message)
    return info is not None and info.get("role") == "user"


def _starts_run(message: object) -> bool:
    """A user message that starts a run: a prompt or a feedback, not one a compaction stored
    in the middle of the run it compacted (monitor/core/compaction.py)."""
    return _is_user(message) and not by_compaction(message)


def _says(message: object, text: Callable[[str], bool]) -> bool:
    """Whether `message` is a user message with a text part whose text passes `text`."""
    return _is_user(message) and any(
        isinstance(part, dict)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
        and text(part["text"])
        for part in _parts(message) or ()
    )


def tool_parts(message: object) -> Iterator[dict[str, Any]]:
    """The tool parts of one message of an export (none if it is not a message)."""
    for part in _parts(message) or ():
        if isinstance(part, dict) and part.get("type") == "tool":
            yield part


def current_run(messages: list[Any]) -> list[Any]:
    """The messages of the session's current run: from its last user message on.

    A user message (a prompt, or the monitor's own feedback) starts a new run, so the calls
    before it belong to runs that are over and must not count. Those a compaction stores
    do not: the run goes on across them, its calls before them included.
    """
    start = _run_start(messages)
    return messages[start:] if start else messages


def _run_start(messages: list[Any]) -> int:
    """The index of the message that starts the current run (`current_run`), 0 if none."""
    for index in range(len(messages) - 1, -1, -1):
        if _starts_run(messages[index]):
            return index
    return 0


# A call's states before its end: the record of an aborted run keeps them until its end comes.
_UNFINISHED = ("pending", "running")


def late_frames(messages: object) -> Iterator[object]:
    """The frames of the calls the record shows unfinished (pending or running) in runs
    that are over, before the current one (`current_run`): an abort's calls end a moment
    after it, often after the run's idle and after the feedback that starts the next run
    (25 cancelled tasks, NOTES.md), so a monitor that reads the session back in between must
    take their ends, still to come on the stream, as late (`Tracker.seed`), not as calls of
    the run under way: else the abort's own aftermath looks like a new loop."""
    if not isinstance(messages, list):
        return
    for message in messages[: _run_start(messages)]:
        for part in tool_parts(message):
            state = part.get("state")
            if isinstance(state, dict) and state.get("status") in _UNFINISHED:
                yield _part_frame(part)


def feedback_count(messages: list[Any]) -> int:
    """How many of the monitor's feedback messages the session holds: its interventions."""
    return sum(_says(message, lambda text: text.startswith(MARKS)) for message in messages)


def answered(messages: list[Any]) -> bool:
    """Whether the session's run ended by itself: its newest message is the model's final
    answer (an assistant message completed without asking for tools, and without an error)."""
    info = _info(messages[-1]) if messages else None
    if info is None or info.get("role") != "assistant" or info.get("error") is not None:
        return False
    if is_summary(info):
        return False  # a compaction's summary: the run goes on after it
    time = info.get("time")
    completed = isinstance(time, dict) and bool(time.get("completed"))
    return completed and info.get("finish") not in (None, "tool-calls")


def held_in(messages: list[Any]) -> bool:
    """Whether the session is still on hold: its last user message is the monitor's feedback
    of a hold (stored with noReply), so no person has written since."""
    for message in reversed(messages):
        if _is_user(message):
            return _says(message, is_hold_feedback)
    return False


def export_frames(messages: object) -> Iterator[object]:
    """The frames the live stream would have carried for a session export, in message order.

    Only tool parts matter to the tracker; each is sent once in the state it had when the
    export was read, which the tracker records like a call whose `running` update it missed.
    A user message after the first starts a new run, as a prompt does on the server, so a
    `session.idle` frame goes before it and the history resets as it would have live; not
    one a compaction stored, which the live stream carries in the middle of a busy run.
    Unusable entries come out as `Malformed`, to be counted, never raised.
    """
    if not isinstance(messages, list):
        yield Malformed("export: not a JSON array of {info, parts}")
        return
    for index, message in enumerate(messages):
        info = _info(message)
        if info is None or _parts(message) is None:
            yield Malformed("export: message is not {info, parts}")
            continue
        if index > 0 and _starts_run(message):
            yield {"type": "session.idle", "properties": {"sessionID": info.get("sessionID")}}
        for part in tool_parts(message):
            yield _part_frame(part)


def _part_frame(part: dict[str, Any]) -> dict[str, Any]:
    """The `message.part.updated` frame the stream carries for a tool part."""
    return {
        "type": "message.part.updated",
        "properties": {"sessionID": part.get("sessionID"), "part": part},
    }


def _holding(messages: list[Any], part_id: str) -> int | None:
    """The index of the message that holds tool part `part_id`, if the record has it."""
    for index, message in enumerate(messages):
        if any(_has_id(part, part_id) for part in _parts(message) or ()):
            return index
    return None


def _has_id(part: object, part_id: str) -> bool:
    return isinstance(part, dict) and part.get("id") == part_id


def feedback_delivered(messages: list[Any], text: str, part_id: str) -> bool:
    """Whether the feedback `text` for the loop caught at tool part `part_id` is stored.

    Only a user message after the one holding `part_id` counts: an identical feedback from an
    earlier intervention comes before it. Without that part in the record, any copy counts:
    a copy too many is worse than none (the model reads every one).
    """
    index = _holding(messages, part_id)
    start = 0 if index is None else index + 1
    return any(_says(message, lambda said: said == text) for message in messages[start:])


def intervened(
    messages: list[Any], part_id: str, aborted: bool = True, refused: bool = True
) -> str | None:
    """Whether some monitor already intervened on the loop caught at part `part_id`: why, or
    None. What another monitor of the same server (or this one before a restart) leaves in
    the session's record, in the order it leaves it: the call refused with a monitor's text,
    or the run ended on a refused request (`refused`: False when the refusal was the asker's
    own), the run aborted (`aborted`; its feedback follows), a monitor's feedback message
    after the part. Nothing is known of a part the record does not hold yet.
    """
    index = _holding(messages, part_id)
    if index is None:
        return None
    for part in tool_parts(messages[index]) if refused else ():
        state = part.get("state")
        if (
            _has_id(part, part_id)
            and isinstance(state, dict)
            and state.get("status") == "error"
            and _monitor_refused(str(state.get("error", "")))
        ):
            return "call already refused"
    later = messages[index:]
    if refused and any(_run_refused(other) for other in later):
        return "run already refused"
    if any(_says(other, lambda text: text.startswith(MARKS)) for other in later):
        return "feedback already in the session"
    if aborted and any(_aborted(other) for other in later):
        return "run already aborted"
    return None


def _monitor_refused(error: str) -> bool:
    """Whether a call's error is a monitor's refusal; the plugin's own rule is nobody's
    intervention (`OWN_REFUSAL`: the acting monitor counts it as its own)."""
    return any(mark in error for mark in MARKS) and not any(own in error for own in OWN_REFUSALS)


def _run_refused(message: object) -> bool:
    """Whether a step ended on a monitor's refused request: a refused `doom_loop` request
    ends the run with its message in the step's error (NOTES.md), not in a part's."""
    info = _info(message)
    error = info.get("error") if info is not None else None
    data = error.get("data") if isinstance(error, dict) else None
    said = data.get("message") if isinstance(data, dict) else None
    return isinstance(said, str) and _monitor_refused(said)


def _aborted(message: object) -> bool:
    info = _info(message)
    error = info.get("error") if info is not None else None
    return isinstance(error, dict) and error.get("name") == "MessageAbortedError"
