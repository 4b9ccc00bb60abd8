"""Building `/event` frames shaped like the real server's (see the captures)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from monitor.core.decisions import Outcome

_ids = itertools.count(1)


def tool_part(
    session: str,
    part: str,
    tool: str,
    status: str,
    input: Any = None,
    output: Any = None,
    error: Any = None,
    call_id: str = "call_0",
    message_id: str = "msg_1",
) -> dict:
    """One `message.part.updated` of a tool part; `call_id` and `message_id` name the call
    the way a permission request does."""
    state: dict[str, Any] = {"status": status, "input": {} if input is None else input}
    if output is not None:
        state["output"] = output
    if error is not None:
        state["error"] = error
    return {
        "id": f"evt_{next(_ids)}",
        "type": "message.part.updated",
        "properties": {
            "sessionID": session,
            "part": {
                "id": part,
                "type": "tool",
                "tool": tool,
                "callID": call_id,
                "sessionID": session,
                "messageID": message_id,
                "state": state,
            },
        },
    }


def call(session: str, part: str, tool: str, input: Any, output: str = "ok") -> list[dict]:
    """The updates of one call as the server sends them: pending, running, completed; each
    call a model step of its own (its own assistant message)."""
    step = f"msg_{part}"
    return [
        tool_part(session, part, tool, "pending", message_id=step),
        tool_part(session, part, tool, "running", input, message_id=step),
        tool_part(session, part, tool, "completed", input, output=output, message_id=step),
    ]


def status(session: str, kind: str) -> dict:
    return {
        "type": "session.status",
        "properties": {"sessionID": session, "status": {"type": kind}},
    }


def idle(session: str) -> dict:
    return {"type": "session.idle", "properties": {"sessionID": session}}


def deleted(session: str) -> dict:
    return {
        "type": "session.deleted",
        "properties": {"sessionID": session, "info": {"id": session}},
    }


def created(session: str, directory: str) -> dict:
    return {
        "type": "session.created",
        "properties": {"sessionID": session, "info": {"id": session, "directory": directory}},
    }


def subagent(
    session: str, parent: str, kind: str = "session.created", directory: str = "/p"
) -> dict:
    """A session whose `info.parentID` names its parent (`session.created` or `.updated`)."""
    info = {"id": session, "parentID": parent, "directory": directory}
    return envelope({"type": kind, "properties": {"info": info}}, directory)


def envelope(frame: dict, directory: str = "/home/dev/project") -> dict:
    return {"directory": directory, "project": "global", "payload": frame}


READ = {"filePath": "README.md"}


def loop_of(session: str, count: int, tool: str = "read", input: Any = READ, prefix: str = "p"):
    """`count` identical calls, part ids `{prefix}1`, `{prefix}2`, ..."""
    frames = []
    for n in range(count):
        frames += call(session, f"{prefix}{n + 1}", tool, input)
    return frames


def feed_all(tracker, frames) -> list:
    """Every decision the tracker returns for `frames`, in order; each is reported carried
    out at once, as the shell does (an intervention under way stands for its loop)."""
    decisions = []
    for frame in frames:
        for decision in tracker.feed(frame).decisions:
            tracker.outcome(decision, Outcome.DRY_RUN)
            decisions.append(decision)
    return decisions


# -- session exports: what GET /session/{id}/message answers ---------------------------------


def export_part(session: str, part_id: str, status: str, input: Any = READ, tool: str = "read"):
    state: dict[str, Any] = {"status": status, "input": {} if status == "pending" else input}
    if status == "completed":
        state["output"] = "ok"
    return {"id": part_id, "type": "tool", "tool": tool, "sessionID": session, "state": state}


def user_message(session: str, text: str = "go") -> dict:
    return {
        "info": {"id": f"msg_u_{text}", "role": "user", "sessionID": session},
        "parts": [{"type": "text", "text": text}],
    }


def assistant_message(session: str, *parts: dict) -> dict:
    return {"info": {"role": "assistant", "sessionID": session}, "parts": list(parts)}


def answer_message(session: str, text: str = "Done.") -> dict:
    """The model's final answer: the run ended by itself."""
    info = {"role": "assistant", "sessionID": session, "time": {"completed": 2}, "finish": "stop"}
    return {"info": info, "parts": [{"type": "text", "text": text}]}


def export_reads(session: str, count: int, prefix: str = "p", status: str = "completed"):
    """One assistant message per identical read, as a model step makes them."""
    return [
        assistant_message(session, export_part(session, f"{prefix}{n + 1}", status))
        for n in range(count)
    ]


def run_record(session: str, count: int, prefix: str = "p") -> list[dict]:
    """A session's messages: a prompt, then `count` identical reads (the current run)."""
    return [user_message(session), *export_reads(session, count, prefix)]


# --- permission requests, as the gate sees them -------------------------------------------

PERMISSION_SESSION = "ses_1"
BASH = ("bash", {"command": "echo hi >> out.txt", "description": "append"})


def part(
    n: int, status: str, tool: str, args: dict[str, Any], session: str = PERMISSION_SESSION
) -> dict:
    """Update of call n, named `call_n` in message `msg_n` as its permission request names it."""
    output = "ok" if status == "completed" else None
    return tool_part(
        session, f"prt_{n}", tool, status, args, output, call_id=f"call_{n}", message_id=f"msg_{n}"
    )


def asked(n: int, permission: str = "read", session: str = PERMISSION_SESSION) -> dict:
    return {
        "type": "permission.asked",
        "properties": {
            "id": f"per_{n}",
            "sessionID": session,
            "permission": permission,
            "patterns": ["README.md"],
            "metadata": {},
            "always": ["*"],
            "tool": {"messageID": f"msg_{n}", "callID": f"call_{n}"},
        },
    }


def doom_loop(n: int, tool: str = "read", session: str = PERMISSION_SESSION) -> dict:
    return {
        "type": "permission.asked",
        "properties": {
            "id": f"per_doom{n}",
            "sessionID": session,
            "permission": "doom_loop",
            "patterns": [tool],
            "metadata": {"tool": tool, "input": {"filePath": "README.md"}},
            "always": [tool],
            "tool": None,
        },
    }


def replied(n: int | str, reply: str, session: str = PERMISSION_SESSION) -> dict:
    request = n if isinstance(n, str) else f"per_{n}"
    return {
        "type": "permission.replied",
        "properties": {"sessionID": session, "requestID": request, "reply": reply},
    }


def user_frames(session: str, message: str, text: str) -> list[dict]:
    """A user message as the stream carries it: the message, then its text as a part (a
    prompt's text part has no `time`, unlike the model's)."""
    return [
        {
            "type": "message.updated",
            "properties": {
                "sessionID": session,
                "info": {"id": message, "role": "user", "sessionID": session},
            },
        },
        {
            "type": "message.part.updated",
            "properties": {
                "sessionID": session,
                "part": {
                    "id": f"prt_{message}",
                    "type": "text",
                    "text": text,
                    "messageID": message,
                    "sessionID": session,
                },
            },
        },
    ]


def usage(session: str, message: str, tokens: int, cost: float = 0.0) -> dict:
    info = {
        "id": message,
        "sessionID": session,
        "role": "assistant",
        "finish": "tool-calls",
        "cost": cost,
        "tokens": {"input": tokens, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}},
    }
    return envelope({"type": "message.updated", "properties": {"info": info}}, "/p")


# ../shared beside the repository (as the developers' guide places it), beside the worktrees'
# folder, $OLM_SHARED_DIR, or this workplace's /work/shared (a clone made elsewhere, in /tmp).
_REPO = Path(__file__).resolve().parents[1]
SHARED_PLACES = [
    *([Path(os.environ["OLM_SHARED_DIR"])] if os.environ.get("OLM_SHARED_DIR") else []),
    _REPO.parent / "shared",
    _REPO.parent.parent / "shared",
    Path("/work/shared"),
]


def engine_record(calls: int, args: Any = None) -> list[dict[str, Any]]:
    """A session's messages in 2.0's form, oldest first: a prompt, then `calls` identical
    reads (`args`, by default 2.x's `{"path": "README.md"}`), one assistant message each
    (`msg_N`, call `call_N`, as `monitor.testing.engine_call` names them)."""
    args = {"path": "README.md"} if args is None else args
    messages: list[dict[str, Any]] = [{"id": "msg_0", "type": "user", "text": "go"}]
    for n in range(1, calls + 1):
        tool = {"type": "tool", "id": f"call_{n}", "name": "read"}
        state = {"status": "completed", "input": args}
        messages.append(
            {"id": f"msg_{n}", "type": "assistant", "content": [{**tool, "state": state}]}
        )
    return messages
