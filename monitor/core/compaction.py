"""Compaction: the messages OpenCode adds when it compacts a session are not a new run.

When a step's usage passes the model's context limit, OpenCode 1.18.33 compacts the session
in the middle of its run (docs/detection.md, "Compaction"): it stores a user message whose
only part is of type `compaction`, answers it with a summary (an assistant message with
`summary: true`, `mode` and `agent` "compaction"), stores a synthetic user message "Continue
if you have next steps, ..." (a text part with `synthetic: true` and
`metadata.compaction_continue`), sends `session.compacted`, and goes on with the same run:
no idle comes between. Whoever reads the record back must not take those user messages for
a prompt that starts a run, or a loop that goes on across the compaction would get a fresh
budget of repetitions; nor the summary for the model's final answer.
"""

from __future__ import annotations

from typing import Any

__all__ = ["by_compaction", "continues", "is_summary"]


def _parts(message: object) -> list[Any]:
    parts = message.get("parts") if isinstance(message, dict) else None
    return parts if isinstance(parts, list) else []


def continues(part: object) -> bool:
    """The synthetic text OpenCode posts after an automatic compaction's summary."""
    if not isinstance(part, dict) or part.get("type") != "text":
        return False
    metadata = part.get("metadata")
    return (
        part.get("synthetic") is True
        and isinstance(metadata, dict)
        and metadata.get("compaction_continue") is True
    )


def by_compaction(message: object) -> bool:
    """Whether a user message is one a compaction stored (its request for a summary, or its
    "continue"), not a person's prompt. Any other part in it (a person's text) makes it a
    prompt: only a message made of compaction parts alone is the server's own."""
    parts = _parts(message)
    return bool(parts) and all(
        isinstance(part, dict) and (part.get("type") == "compaction" or continues(part))
        for part in parts
    )


def is_summary(info: object) -> bool:
    """Whether an assistant message's `info` is a compaction's summary: a step of the run
    that the run goes on after, not the model's answer that ends it."""
    return isinstance(info, dict) and (
        info.get("summary") is True or info.get("mode") == "compaction"
    )
