"""Carrying out decisions: abort the run, then give the model the feedback.

And the permission answers (`Reply`): refuse the request of a call that completes a loop (the
call never runs; a refusal that comes second falls back to the abort), approve the others
under `approve`. Each session's actions run in order (never two aborts racing for one
session), and each in its own task, so a slow or failing call for one session never delays
reading the stream or acting on another.

Every decision is logged as `loop.detected` when it is handed over, before any request; how
it was carried out ends in one `intervention.outcome`, and feedback that was due ends in
`feedback.sent` or `feedback.failed`. An action still queued or running when `drain` gives
up ends with outcome `cancelled` (or `feedback.failed`, if the loop was stopped already): no
decision goes unlogged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from monitor.core.permissions import DOOM_LOOP, Reply
from monitor.core.tracker import Intervene
from monitor.errors import ConfigError, ServerError, SessionGone
from monitor.shell.api import OpencodeAPI

log = structlog.get_logger("monitor.shell.actions")


class _Progress:
    """How far one action got, so that a shutdown in its middle is logged for what it is."""

    __slots__ = ("decided", "feedback_due")

    def __init__(self) -> None:
        self.decided = False  # its `intervention.outcome` is logged
        self.feedback_due = False


class Interventions:
    """Runs decisions per session in order; `api=None` means dry run (log only)."""

    def __init__(
        self,
        api: OpencodeAPI | None,
        forget: Callable[[str], None],
        on_fatal: Callable[[BaseException], None],
        on_outcome: Callable[[Intervene, str], None] = lambda decision, outcome: None,
        pending: Callable[[str], bool] = lambda request_id: True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._forget = forget
        self._on_fatal = on_fatal
        self._on_outcome = on_outcome
        # Whether a permission request is still unanswered (the tracker follows the replies).
        self._pending = pending
        self._sleep = sleep
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Every task not yet done, queued ones and approvals too: `_tails` holds only the
        # last per session, and shutdown must reach them all.
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, decision: Intervene) -> None:
        log.warning("loop.detected", **decision_fields(decision))
        self._queue(decision, lambda progress: self._act(decision, progress))

    def answer(self, reply: Reply) -> None:
        """Answer a permission request: a refusal is an intervention, queued like one; an
        approval goes at once, behind nothing (the call waits for it)."""
        decision = reply.loop
        if decision is not None:
            log.warning("loop.detected", request_id=reply.request_id, **decision_fields(decision))
            self._queue(decision, lambda progress: self._refuse(reply, decision, progress))
            return
        self._track(asyncio.create_task(self._approve(reply)))

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

    def _queue(self, decision: Intervene, act: Callable[[_Progress], Awaitable[None]]) -> None:
        session_id = decision.session_id
        previous = self._tails.get(session_id)
        task = asyncio.create_task(self._after(previous, decision, act))
        self._tails[session_id] = task
        self._track(task)

        def done(task: asyncio.Task[None]) -> None:
            if self._tails.get(session_id) is task:
                del self._tails[session_id]

        task.add_done_callback(done)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _after(
        self,
        previous: asyncio.Task[None] | None,
        decision: Intervene,
        act: Callable[[_Progress], Awaitable[None]],
    ) -> None:
        progress = _Progress()
        try:
            if previous is not None:
                await asyncio.wait([previous])
            await act(progress)
        except ConfigError as exc:
            self._on_fatal(exc)
        except asyncio.CancelledError:
            # Shutdown gave up on this action: say so, for the stop or for the feedback.
            if not progress.decided:
                self._decided(decision, "cancelled")
            elif progress.feedback_due:
                _feedback_failed(decision, "cancelled at shutdown")
            raise

    def _decided(self, decision: Intervene, outcome: str, **fields: object) -> None:
        log.warning(
            "intervention.outcome",
            **decision_fields(decision),
            outcome=outcome,
            **{key: value for key, value in fields.items() if value is not None},
        )
        self._on_outcome(decision, outcome)

    async def _act(self, decision: Intervene, progress: _Progress, **extra: object) -> None:
        started = time.monotonic()
        outcome, error = await self._abort(decision)
        abort_ms = round((time.monotonic() - started) * 1000, 1)
        progress.decided = True
        self._decided(decision, outcome, abort_ms=abort_ms, error=error, **extra)
        if outcome in ("aborted", "held"):
            progress.feedback_due = True
            await self._give_feedback(decision)

    async def _refuse(self, reply: Reply, decision: Intervene, progress: _Progress) -> None:
        """Refuse the request of a loop's call; the model reads `reply.message` as its result.

        A hold still needs the run stopped, and a refused `doom_loop` request ends the run
        (see ../shared/opencode/NOTES.md): then the run is aborted and the feedback follows
        as a new message.
        """
        assert self._api is not None
        request_id = reply.request_id
        if reply.wait:
            await self._sleep(reply.wait)
            if not self._pending(request_id):
                # Somebody (a person at the TUI) answered within the grace period.
                progress.decided = True
                self._decided(decision, "answered", request_id=request_id)
                return
        started = time.monotonic()
        try:
            refused = await self._api.reply_permission(
                request_id, reply.directory, reply.reply, reply.message
            )
        except ServerError as exc:
            await self._act(decision, progress, request_id=request_id, fallback=str(exc))
            return
        if not refused:
            # Answered first by someone else (`opencode run` answers at once): the call may
            # be running, so stop it as without the gate.
            await self._act(decision, progress, request_id=request_id, fallback="answered first")
            return
        reply_ms = round((time.monotonic() - started) * 1000, 1)
        outcome, error = "rejected", None
        if decision.hold or decision.rule == DOOM_LOOP:
            # The run must end before the feedback starts a new one; a refused doom_loop
            # request ends it only seconds later, and a message posted meanwhile is lost.
            stopped, error = await self._abort(decision)
            if decision.hold or error is not None:
                outcome = stopped
        progress.decided = True
        self._decided(decision, outcome, request_id=request_id, reply_ms=reply_ms, error=error)
        if outcome == "held" or (outcome == "rejected" and decision.rule == DOOM_LOOP):
            progress.feedback_due = True
            await self._give_feedback(decision)

    async def _approve(self, reply: Reply) -> None:
        assert self._api is not None
        started = time.monotonic()
        try:
            answered = await self._api.reply_permission(
                reply.request_id, reply.directory, reply.reply
            )
        except ConfigError as exc:
            self._on_fatal(exc)
            return
        except ServerError as exc:
            log.error("permission.reply_failed", request_id=reply.request_id, error=str(exc))
            return
        log.debug(
            "permission.approved",
            session_id=reply.session_id,
            request_id=reply.request_id,
            answered_first=answered,
            reply_ms=round((time.monotonic() - started) * 1000, 1),
        )

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


def decision_fields(decision: Intervene) -> dict[str, object]:
    """What `loop.detected` says of a decision; `intervention.outcome` repeats it, so one
    record tells the whole intervention."""
    return dict(
        session_id=decision.session_id,
        directory=decision.directory,
        rule=decision.rule,
        part_id=decision.part_id,
        call_index=decision.call_index,
        cycle_length=decision.cycle.length,
        repetitions=decision.cycle.repetitions,
        tools=list(decision.tools),
        interventions=decision.prior_interventions + 1,
        escalated=decision.escalated,
    )


def _feedback_failed(decision: Intervene, error: str) -> None:
    log.error("feedback.failed", session_id=decision.session_id, error=error)
