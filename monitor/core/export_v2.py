"""A new-engine session's messages in the 1.x form that `core/export.py` reads.

`GET /api/session/{id}/message` (OpenCode 2, and 1.18.33 for its new engine) answers `{data:
[message, ...], cursor}`, newest first; a message is `{id, type: "user", text}` or `{id, type:
"assistant", content: [{type: "text", text} | {type: "tool", id: CALL_ID, name, state:
{status, input, error?, ...}}], finish, error?}` (recording
`tests/recordings/engine/new-engine-read-bash.messages.json`). `messages_v1_shape` makes them the
`{info, parts}` list, oldest first, that every read-back of the monitor (seeding, the checks for
another monitor's feedback, whether the feedback arrived) already reads: one reading of a
session's record for both engines. A tool part's id is what `events_v2` calls the same call
on the stream (`MESSAGE_ID:CALL_ID`), its tool and input named the 1.x way.
"""

from __future__ import annotations

from typing import Any

from monitor.core.events_v2 import result_output
from monitor.core.profile import server_call

__all__ = ["messages_v1_shape"]


def messages_v1_shape(page: object, session_id: str) -> list[dict[str, Any]]:
    """The messages of one answer (its `data`, newest first) as 1.x `{info, parts}`, oldest
    first; entries that are not messages are left out."""
    data = page.get("data") if isinstance(page, dict) else page
    if not isinstance(data, list):
        return []
    messages = []
    for message in reversed(data):
        if isinstance(message, dict) and isinstance(message.get("id"), str):
            messages.append(_classic(message, session_id))
    return messages


def _classic(message: dict[str, Any], session_id: str) -> dict[str, Any]:
    message_id = message["id"]
    role = "user" if message.get("type") == "user" else "assistant"
    info: dict[str, Any] = {"id": message_id, "sessionID": session_id, "role": role}
    for key in ("time", "finish", "error", "cost", "tokens"):
        if key in message:
            info[key] = message[key]
    parts: list[dict[str, Any]] = []
    if role == "user":
        text = message.get("text")
        if isinstance(text, str):
            parts.append({"type": "text", "text": text, "messageID": message_id})
    content = message.get("content")
    for item in content if isinstance(content, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("text", "reasoning") and isinstance(item.get("text"), str):
            parts.append({"type": item["type"], "text": item["text"], "messageID": message_id})
        elif item.get("type") == "tool" and isinstance(item.get("id"), str):
            parts.append(_tool(item, message_id, session_id))
    return {"info": info, "parts": parts}


def _tool(item: dict[str, Any], message_id: str, session_id: str) -> dict[str, Any]:
    state = item.get("state")
    state = dict(state) if isinstance(state, dict) else {}
    name = item.get("name")
    tool, args = server_call(name if isinstance(name, str) else "", state.get("input", {}))
    state["input"] = args
    error = state.get("error")
    if isinstance(error, dict):
        state["error"] = error.get("message", error)
    if state.get("status") == "completed" and "output" not in state:
        state["output"] = result_output(state)
    structured = state.get("structured")
    if isinstance(structured, dict):
        state.setdefault("metadata", structured)  # the shell's `exit`, as 1.x keeps it
    return {
        "type": "tool",
        "id": f"{message_id}:{item['id']}",
        "callID": item["id"],
        "messageID": message_id,
        "sessionID": session_id,
        "tool": tool,
        "state": state,
    }
