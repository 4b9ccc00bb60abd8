"""Carrying out `Intervene` decisions: abort the run, then give the model the feedback.

Each session's actions run in order (never two aborts racing for one session), and each in
its own task, so a slow or failing call for one session never delays reading the stream or
acting on another.

Every decision is logged as `loop.detected` when it is submitted, before any request; its
abort ends in one `intervention.outcome`, and feedback that was due ends in `feedback.sent`
or `feedback.failed`. An action still queued or running when `drain` gives up ends with
outcome `cancelled` (or `feedback.failed`, if the abort was done): no decision goes
unlogged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from monitor.core.tracker import Intervene
from monitor.errors import ConfigError, ServerError, SessionGone
from monitor.shell.api import OpencodeAPI

log = structlog.get_logger("monitor.shell.actions")


class Interventions:
    """Runs decisions per session in order; `api=None` means dry run (log only)."""

    def __init__(
        self,
        api: OpencodeAPI | None,
        forget: Callable[[str], None],
        on_fatal: Callable[[BaseException], None],
        on_outcome: Callable[[Intervene, str], None] = lambda decision, outcome: None,
    ) -> None:
        self._api = api
        self._forget = forget
        self._on_fatal = on_fatal
        self._on_outcome = on_outcome
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Every action not yet done, the queued ones too: `_tails` holds only the last per
        # session, and shutdown must reach them all.
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, decision: Intervene) -> None:
        log.warning("loop.detected", **_decision_fields(decision))
        session_id = decision.session_id
        previous = self._tails.get(session_id)
        task = asyncio.create_task(self._after(previous, decision))
        self._tails[session_id] = task
        self._running.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._running.discard(task)
            if self._tails.get(session_id) is task:
                del self._tails[session_id]

        task.add_done_callback(done)

    def acting_on(self, session_id: str) -> bool:
        """True while an action for this session is queued or running."""
        return session_id in self._tails

    async def drain(self, timeout: float) -> None:
        """Let in-flight actions finish, up to `timeout` seconds; cancel what is left."""
        tasks = list(self._running)
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _after(self, previous: asyncio.Task[None] | None, decision: Intervene) -> None:
        feedback_due = False
        try:
            if previous is not None:
                await asyncio.wait([previous])
            started = time.monotonic()
            outcome, error = await self._abort(decision)
            _outcome(decision, outcome, round((time.monotonic() - started) * 1000, 1), error)
            self._on_outcome(decision, outcome)
            feedback_due = outcome in ("aborted", "held")
            if feedback_due:
                await self._give_feedback(decision)
        except asyncio.CancelledError:
            # Shutdown gave up on this action: say so, for the abort or for the feedback.
            if feedback_due:
                _feedback_failed(decision, "cancelled at shutdown")
            else:
                _outcome(decision, "cancelled", None, None)
                self._on_outcome(decision, "cancelled")
            raise

    async def _abort(self, decision: Intervene) -> tuple[str, str | None]:
        if self._api is None:
            return "dry_run", None
        try:
            await self._api.abort(decision.session_id, decision.directory)
        except SessionGone as exc:
            self._forget(decision.session_id)
            return "abort_failed", str(exc)
        except ConfigError as exc:
            self._on_fatal(exc)  # logged as this decision's outcome, then the monitor stops
            return "abort_failed", str(exc)
        except ServerError as exc:
            return "abort_failed", str(exc)
        return ("held" if decision.hold else "aborted"), None

    async def _give_feedback(self, decision: Intervene) -> None:
        assert self._api is not None
        try:
            await self._api.prompt(
                decision.session_id,
                decision.directory,
                decision.feedback,
                no_reply=decision.hold,
                after_part=decision.part_id,
            )
        except ConfigError as exc:
            _feedback_failed(decision, str(exc))
            self._on_fatal(exc)
            return
        except ServerError as exc:
            _feedback_failed(decision, str(exc))
            return
        log.info("feedback.sent", session_id=decision.session_id, hold=decision.hold)


def _decision_fields(decision: Intervene) -> dict[str, object]:
    return dict(
        session_id=decision.session_id,
        directory=decision.directory,
        part_id=decision.part_id,
        call_index=decision.call_index,
        cycle_length=decision.cycle.length,
        repetitions=decision.cycle.repetitions,
        tools=list(decision.tools),
        interventions=decision.prior_interventions + 1,
        escalated=decision.escalated,
    )


def _outcome(decision: Intervene, outcome: str, abort_ms: float | None, error: str | None) -> None:
    # The decision's fields again: one record tells the whole intervention.
    fields = _decision_fields(decision)
    fields["outcome"] = outcome
    if abort_ms is not None:
        fields["abort_ms"] = abort_ms
    if error is not None:
        fields["error"] = error
    log.warning("intervention.outcome", **fields)


def _feedback_failed(decision: Intervene, error: str) -> None:
    log.error("feedback.failed", session_id=decision.session_id, error=error)
