"""A toast at the TUI when a loop is stopped or a session held (`POST /tui/show-toast`).

Best effort and after the fact: the intervention is already carried out when the toast is
posted, in a task of its own with a short timeout, and a failure (no TUI attached, an old
server) is logged at debug and changes nothing else.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from monitor.core.decisions import Intervene, Outcome
from monitor.shell.api import OpencodeAPI
from monitor.shell.webhook import notification

log = structlog.get_logger("monitor.shell.toast")

# The outcomes a person at the TUI should hear of, and how loud.
VARIANTS = {Outcome.ABORTED: "warning", Outcome.REJECTED: "warning", Outcome.HELD: "error"}
TIMEOUT_S = 2.0
TITLE = "opencode-loop-monitor"


def toast_body(decision: Intervene, outcome: Outcome) -> dict[str, Any] | None:
    """The request body for this outcome (the schema's title, message, variant), or None."""
    variant = VARIANTS.get(outcome)
    if variant is None:
        return None
    # The webhook's sentence: ids, names and counts only, written for a person.
    return {"title": TITLE, "message": notification(decision, outcome)["text"], "variant": variant}


class Toasts:
    """Posts toasts apart from the interventions; `close` ends those still in flight."""

    def __init__(self, api: OpencodeAPI, timeout: float = TIMEOUT_S) -> None:
        self._api = api
        self._timeout = timeout
        self._tasks: set[asyncio.Task[None]] = set()

    def show(self, decision: Intervene, outcome: Outcome) -> None:
        body = toast_body(decision, outcome)
        if body is None:
            return
        task = asyncio.create_task(self._post(decision, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, decision: Intervene, body: dict[str, Any]) -> None:
        try:
            answer = await asyncio.wait_for(
                self._api.show_toast(decision.directory, body), self._timeout
            )
        except Exception as exc:  # best effort: whatever went wrong, the loop is stopped
            log.debug(
                "toast.failed", session_id=decision.session_id, error=str(exc) or type(exc).__name__
            )
            return
        log.debug("toast.posted", session_id=decision.session_id, answer=answer)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
