"""A new-engine session's messages in the 1.x form that `core/export.py` reads.

`GET /api/session/{id}/message` (OpenCode 2, and 1.18.33 for its new engine) answers `{data:
[message, ...], cursor}`, newest first as the shell asks it (`order=desc`). A message is typed
(2.2.5, `../shared/opencode/captures-2.2.5/messages-*.json`):

- `user` `{id, time, text, files}`: a person's prompt or the monitor's feedback;
- `assistant` `{id, time{created, streamed, completed}, content: [{type: "text", text} |
  {type: "reasoning", text} | {type: "tool", id: CALL_ID, name, state: {status, input,
  content?, metadata?, error?}}], finish, rawFinish, cost, tokens, error?{type, message}}`
  (1.18.33's tool state says `structured` for `metadata`: recording
  `tests/recordings/engine/new-engine-read-bash.messages.json`);
- `idle` `{outcome: "succeeded" | "failed" | "interrupted"}`, one per run's end; `synthetic`,
  `system`, `skill`, `shell`, `compaction`, `agent-selected`, `model-selected`,
  `location-switched`: the server's own notes and switches.

`messages_v1_shape` makes them the `{info, parts}` list, oldest first, that every read-back of
the monitor (seeding, the checks for another monitor's feedback, whether the feedback arrived)
already reads: one reading of a session's record for both engines. A tool part's id is what
`events_v2` calls the same call on the stream (`MESSAGE_ID:CALL_ID`), its tool and input named
the 1.x way, so a read-back after a reconnect and the stream's later events are one call. Only
`user` and `assistant` items are messages in 1.x's sense; the others are left out:

- an `idle` item says a run ended, which the assistant message before it says too (its
  `finish`, or its `error` for an interrupt); as the newest item it hid that message from
  `export.answered`, which reads the newest message only;
- a `synthetic` note (`POST /api/session/{id}/synthetic`) is not a person's message and not
  the monitor's (it posts prompts): as a user message it would start a run in
  `export.current_run` and hide the calls before it from the seeding;
- a compaction's items are not a run's start either (1.x's `compaction.by_compaction`).

`inbox_v1_shape` does the same for `GET /api/session/{id}/inbox` (`{data: [{id, sessionID, time,
type: "user", payload: {text}, delivery}]}`): messages stored but not yet taken by a run, which
`/message` does not list. A hold's feedback, posted with `resume: false`, waits there until a
person writes (`inbox-after-hold.json`), so a read-back that must tell whether a session is held
(`export.held_in`) reads the inbox's user messages after the record's.
"""

from __future__ import annotations

from typing import Any

from monitor.core.events_v2 import result_metadata, result_output
from monitor.core.profile import server_call

__all__ = ["inbox_v1_shape", "messages_v1_shape"]

# 2.x's error type -> 1.x's error name, where `core/export.py` reads the name: an interrupted
# step (`{type: "aborted", message: "Step interrupted"}`) is 1.x's aborted message.
_ERROR_NAMES = {"aborted": "MessageAbortedError"}
# A call's state while its input streams (2.x `streaming`, the input a string): 1.x's pending.
_STATUSES = {"streaming": "pending"}


def messages_v1_shape(page: object, session_id: str) -> list[dict[str, Any]]:
    """The messages of one answer (its `data`, newest first) as 1.x `{info, parts}`, oldest
    first; items that are not a user's or the model's message are left out."""
    data = page.get("data") if isinstance(page, dict) else page
    if not isinstance(data, list):
        return []
    messages = []
    for message in reversed(data):
        if not isinstance(message, dict) or not isinstance(message.get("id"), str):
            continue
        kind = message.get("type")
        if kind == "user":
            messages.append(_user(message, message.get("text"), session_id))
        elif kind == "assistant":
            messages.append(_assistant(message, session_id))
    return messages


def inbox_v1_shape(page: object, session_id: str) -> list[dict[str, Any]]:
    """The user messages of an inbox answer (its `data`, oldest first: the order a run takes
    them) as 1.x `{info, parts}`, to go after `messages_v1_shape`'s: they are newer than
    every message stored. Other items (a synthetic note, a compaction, a move) are left out."""
    data = page.get("data") if isinstance(page, dict) else page
    if not isinstance(data, list):
        return []
    messages = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        payload = item.get("payload")
        if item.get("type") == "user" and isinstance(payload, dict):
            messages.append(_user(item, payload.get("text"), session_id))
    return messages


def _user(message: dict[str, Any], text: object, session_id: str) -> dict[str, Any]:
    """A user message with its text as its one text part (1.x's prompt has no `time` on it:
    it is not one the model wrote)."""
    message_id = message["id"]
    info: dict[str, Any] = {"id": message_id, "sessionID": session_id, "role": "user"}
    if "time" in message:
        info["time"] = message["time"]
    parts: list[dict[str, Any]] = []
    if isinstance(text, str):
        parts.append({"type": "text", "text": text, "messageID": message_id})
    return {"info": info, "parts": parts}


def _assistant(message: dict[str, Any], session_id: str) -> dict[str, Any]:
    message_id = message["id"]
    info: dict[str, Any] = {"id": message_id, "sessionID": session_id, "role": "assistant"}
    for key in ("time", "finish", "cost", "tokens"):
        if key in message:
            info[key] = message[key]
    if "error" in message:
        info["error"] = _error(message["error"])
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    for item in content if isinstance(content, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("text", "reasoning") and isinstance(item.get("text"), str):
            parts.append({"type": item["type"], "text": item["text"], "messageID": message_id})
        elif item.get("type") == "tool" and isinstance(item.get("id"), str):
            parts.append(_tool(item, message_id, session_id))
    return {"info": info, "parts": parts}


def _error(error: object) -> object:
    """A step's error as 1.x's `{name, data: {message}}`: `export.intervened` reads an
    aborted run by the name, a run ended on a refusal by the message."""
    if not isinstance(error, dict) or "name" in error:
        return error  # 1.x's shape already, or nothing to read
    kind = error.get("type")
    name = _ERROR_NAMES.get(kind, kind) if isinstance(kind, str) else "UnknownError"
    return {"name": name, "data": {"message": error.get("message")}}


def _tool(item: dict[str, Any], message_id: str, session_id: str) -> dict[str, Any]:
    state = item.get("state")
    state = dict(state) if isinstance(state, dict) else {}
    status = state.get("status")
    if isinstance(status, str) and status in _STATUSES:
        # Its input is still the model's raw text: no arguments yet, as 1.x's pending part.
        state["status"], state["input"] = _STATUSES[status], {}
    name = item.get("name")
    tool, args = server_call(name if isinstance(name, str) else "", state.get("input", {}))
    state["input"] = args
    error = state.get("error")
    if isinstance(error, dict):
        state["error"] = error.get("message", error)
    if state.get("status") == "completed" and "output" not in state:
        state["output"] = result_output(state)
    metadata = result_metadata(state)
    if metadata is not None:
        state["metadata"] = metadata  # the shell's `exit`, where 1.x keeps it
    return {
        "type": "tool",
        "id": f"{message_id}:{item['id']}",
        "callID": item["id"],
        "messageID": message_id,
        "sessionID": session_id,
        "tool": tool,
        "state": state,
    }
