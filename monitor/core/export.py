"""Session exports: what `GET /session/{id}/message` answers, as the frames the stream carried.

Used to seed the tracker with what a session did before we could see it (after a reconnect,
at start, for `attach`) and to replay exported sessions offline. Pure: data in, frames out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from monitor.core.events import Malformed
from monitor.core.feedback import MARKS, is_hold_feedback


def current_run(messages: list[Any]) -> list[Any]:
    """The messages of the session's current run: from its last user message on.

    A user message (a prompt, or the monitor's own feedback) starts a new run, so the calls
    before it belong to runs that are over and must not count.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        info = message.get("info") if isinstance(message, dict) else None
        if isinstance(info, dict) and info.get("role") == "user":
            return messages[index:]
    return messages


def feedback_count(messages: list[Any]) -> int:
    """How many of the monitor's feedback messages the session holds: its interventions."""
    return sum(
        1
        for message in messages
        if isinstance(message, dict)
        and isinstance(message.get("info"), dict)
        and message["info"].get("role") == "user"
        and any(
            isinstance(part, dict)
            and part.get("type") == "text"
            and str(part.get("text", "")).startswith(MARKS)
            for part in message.get("parts") or ()
        )
    )


def held_in(messages: list[Any]) -> bool:
    """Whether the session is still on hold: its last user message is the monitor's feedback
    of a hold (stored with noReply), so no person has written since."""
    for message in reversed(messages):
        info = message.get("info") if isinstance(message, dict) else None
        if isinstance(info, dict) and info.get("role") == "user":
            return any(
                isinstance(part, dict)
                and part.get("type") == "text"
                and is_hold_feedback(str(part.get("text", "")))
                for part in message.get("parts") or ()
            )
    return False


def export_frames(messages: object) -> Iterator[object]:
    """The frames the live stream would have carried for a session export, in message order.

    Only tool parts matter to the tracker; each is sent once in the state it had when the
    export was read, which the tracker records like a call whose `running` update it missed.
    A user message after the first starts a new run, as a prompt does on the server, so a
    `session.idle` frame goes before it and the history resets as it would have live.
    Unusable entries come out as `Malformed`, to be counted, never raised.
    """
    if not isinstance(messages, list):
        yield Malformed("export: not a JSON array of {info, parts}")
        return
    for index, message in enumerate(messages):
        info = message.get("info") if isinstance(message, dict) else None
        parts = message.get("parts") if isinstance(message, dict) else None
        if not isinstance(info, dict) or not isinstance(parts, list):
            yield Malformed("export: message is not {info, parts}")
            continue
        if info.get("role") == "user" and index > 0:
            yield {"type": "session.idle", "properties": {"sessionID": info.get("sessionID")}}
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "tool":
                yield {
                    "type": "message.part.updated",
                    "properties": {"sessionID": part.get("sessionID"), "part": part},
                }


def feedback_delivered(messages: list[Any], text: str, part_id: str) -> bool:
    """Whether the feedback `text` for the loop caught at tool part `part_id` is stored.

    Only a user message after the one holding `part_id` counts: an identical feedback from an
    earlier intervention comes before it. Without that part in the record, any copy counts:
    a copy too many is worse than none (the model reads every one).
    """
    start = 0
    for index, message in enumerate(messages):
        parts = message.get("parts") if isinstance(message, dict) else None
        if isinstance(parts, list) and any(
            isinstance(part, dict) and part.get("id") == part_id for part in parts
        ):
            start = index + 1
            break
    return any(
        isinstance(message, dict)
        and isinstance(message.get("info"), dict)
        and message["info"].get("role") == "user"
        and any(
            isinstance(part, dict) and part.get("type") == "text" and part.get("text") == text
            for part in message.get("parts") or ()
        )
        for message in messages[start:]
    )
