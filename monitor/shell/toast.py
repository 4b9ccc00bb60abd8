"""A toast at the TUI when a loop's call is refused, its run stopped or its session held
(`POST /tui/show-toast`).

Best effort and after the fact: the intervention is already carried out when the toast is
posted, in a task of its own with a short timeout, and a failure (no TUI attached, an old
server) is logged at debug and changes nothing else.

A refusal in band (the plugin's, a permission request's) shows only as a red tool entry
otherwise, so it is toasted too; but a model may repeat a refused call many times in a row,
so at most one refusal toast per session every REFUSAL_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from monitor.core.decisions import Intervene, Outcome
from monitor.core.feedback import earlier_by_name
from monitor.shell.api import OpencodeAPI
from monitor.shell.webhook import notification

__all__ = ["REFUSAL_INTERVAL_S", "Toasts", "toast_body"]

log = structlog.get_logger("monitor.shell.toast")

# The outcomes a person at the TUI should hear of, and how loud.
VARIANTS = {
    Outcome.ABORTED: "warning",
    Outcome.REJECTED: "warning",
    Outcome.BLOCKED: "warning",
    Outcome.HELD: "error",
}
# The call did not run and the run goes on: paced per session.
REFUSALS = frozenset({Outcome.REJECTED, Outcome.BLOCKED})
REFUSAL_INTERVAL_S = 30.0
TIMEOUT_S = 2.0
TITLE = "opencode-loop-monitor"


def toast_body(decision: Intervene, outcome: Outcome) -> dict[str, Any] | None:
    """The request body for this outcome (the schema's title, message, variant), or None."""
    variant = VARIANTS.get(outcome)
    if variant is None:
        return None
    # The webhook's sentence (ids, names and counts only, written for a person), the rule
    # (the name docs/detection.md and the log use), the call (its place in the run, as
    # `intervention.outcome` logs it), and what the session's earlier interventions were,
    # by name: a hold after two refusals is not a third stop.
    earlier = earlier_by_name(decision.prior_interventions + 1, decision.prior_outcomes)
    before = f"; before: {', '.join(earlier)}" if earlier else ""
    message = (
        f"{notification(decision, outcome)['text']} "
        f"(rule: {decision.rule}, call {decision.position}{before})"
    )
    return {"title": TITLE, "message": message, "variant": variant}


class Toasts:
    """Posts toasts apart from the interventions; `close` ends those still in flight."""

    def __init__(
        self,
        api: OpencodeAPI,
        timeout: float = TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._timeout = timeout
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        # Per session, when its last refusal was toasted; only those within the interval.
        self._refusal_toasted: dict[str, float] = {}

    def show(self, decision: Intervene, outcome: Outcome) -> None:
        body = toast_body(decision, outcome)
        if body is None or not self._api.shows_toasts:
            return
        if outcome in REFUSALS and not self._refusal_due(decision.session_id):
            log.debug("toast.skipped", session_id=decision.session_id, outcome=str(outcome))
            return
        task = asyncio.create_task(self._post(decision, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refusal_due(self, session_id: str) -> bool:
        """Whether a refusal in this session may be toasted now (and if so, it will be)."""
        now = self._clock()
        # Forget what is past the interval: the table holds only sessions refused lately.
        self._refusal_toasted = {
            session: at
            for session, at in self._refusal_toasted.items()
            if now - at < REFUSAL_INTERVAL_S
        }
        if session_id in self._refusal_toasted:
            return False
        self._refusal_toasted[session_id] = now
        return True

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
