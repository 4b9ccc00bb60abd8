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

from monitor.core.decisions import Action, Intervene, Outcome, Reply
from monitor.core.findings import Rule
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
        on_outcome: Callable[[Intervene, Outcome], None] = lambda decision, outcome: None,
        expire: Callable[[Reply], Reply | None] = lambda reply: reply,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._forget = forget
        self._on_fatal = on_fatal
        self._on_outcome = on_outcome
        # A reply's deadline passed: the core says what to send now (None: nothing, somebody
        # answered meanwhile). The shell only runs the timer.
        self._expire = expire
        self._sleep = sleep
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Every task not yet done, queued ones and approvals too: `_tails` holds only the
        # last per session, and shutdown must reach them all.
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, decision: Intervene) -> None:
        log.warning("loop.detected", **decision.fields())
        self._queue(decision, lambda progress: self._act(decision, progress))

    def blocked(self, decision: Intervene, call_id: str) -> None:
        """The plugin was told to throw: the loop's call does not run. A `stop` (or a hold)
        also stops the run, then gives the feedback; a block lets the run go on."""
        log.warning("loop.detected", via="plugin", call_id=call_id, **decision.fields())
        if decision.hold or decision.action == Action.STOP:
            self._queue(decision, lambda progress: self._act(decision, progress, via="plugin"))
            return
        self._decided(decision, Outcome.BLOCKED, via="plugin", call_id=call_id)

    def answer(self, reply: Reply) -> None:
        """Answer a permission request: a refusal is an intervention, queued like one; an
        approval goes at once, behind nothing (the call waits for it)."""
        decision = reply.loop
        if decision is not None:
            log.warning("loop.detected", request_id=reply.request_id, **decision.fields())
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
                self._decided(decision, Outcome.CANCELLED)
            elif progress.feedback_due:
                _feedback_failed(decision, "cancelled at shutdown")
            raise

    def _decided(self, decision: Intervene, outcome: Outcome, **fields: object) -> None:
        log.warning(
            "intervention.outcome",
            **decision.fields(),
            outcome=str(outcome),
            **{key: value for key, value in fields.items() if value is not None},
        )
        self._on_outcome(decision, outcome)

    async def _act(self, decision: Intervene, progress: _Progress, **extra: object) -> None:
        if decision.action == Action.NUDGE and self._api is not None:
            # The run goes on: the feedback is read at its next step.
            progress.decided = True
            self._decided(decision, Outcome.NUDGED, **extra)
            progress.feedback_due = True
            await self._give_feedback(decision)
            return
        started = time.monotonic()
        outcome, error = await self._abort(decision)
        abort_ms = round((time.monotonic() - started) * 1000, 1)
        progress.decided = True
        self._decided(decision, outcome, abort_ms=abort_ms, error=error, **extra)
        if outcome in (Outcome.ABORTED, Outcome.HELD):
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
            now = self._expire(reply)
            if now is None:
                # Somebody (a person at the TUI) answered within the grace period.
                progress.decided = True
                self._decided(decision, Outcome.ANSWERED, request_id=request_id)
                return
            reply = now
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
        outcome: Outcome = Outcome.REJECTED
        error = None
        stop = decision.hold or decision.action == Action.STOP  # or a ladder of `stop`
        if stop or decision.rule == Rule.DOOM_LOOP:
            # The run must end before the feedback starts a new one; a refused doom_loop
            # request ends it only seconds later, and a message posted meanwhile is lost.
            stopped, error = await self._abort(decision)
            if stop or error is not None:
                outcome = stopped
        progress.decided = True
        self._decided(decision, outcome, request_id=request_id, reply_ms=reply_ms, error=error)
        if outcome in (Outcome.HELD, Outcome.ABORTED) or (
            outcome == Outcome.REJECTED and decision.rule == Rule.DOOM_LOOP
        ):
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

    async def _abort(self, decision: Intervene) -> tuple[Outcome, str | None]:
        if self._api is None:
            return Outcome.DRY_RUN, None
        try:
            await self._api.abort(decision.session_id, decision.directory)
        except SessionGone as exc:
            self._forget(decision.session_id)
            return Outcome.ABORT_FAILED, str(exc)
        except ConfigError as exc:
            self._on_fatal(exc)  # logged as this decision's outcome, then the monitor stops
            return Outcome.ABORT_FAILED, str(exc)
        except ServerError as exc:
            return Outcome.ABORT_FAILED, str(exc)
        return (Outcome.HELD if decision.hold else Outcome.ABORTED), None

    async def _give_feedback(self, decision: Intervene) -> None:
        assert self._api is not None
        try:
            await self._api.prompt(
                decision.session_id,
                decision.directory,
                decision.feedback,
                no_reply=decision.hold or decision.action == Action.NUDGE,
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


def _feedback_failed(decision: Intervene, error: str) -> None:
    log.error("feedback.failed", session_id=decision.session_id, error=error)
