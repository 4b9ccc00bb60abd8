"""Carrying out `Intervene` decisions: abort the run, then give the model the feedback.

And the permission answers (`Reply`): refuse the request of a call that completes a loop (the
call never runs; a refusal that comes second falls back to the abort), approve the others
under `approve`. Each session's actions run in order (never two aborts racing for one
session), and each in its own task, so a slow or failing call for one session never delays
reading the stream or acting on another.
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
        self._approvals: set[asyncio.Task[None]] = set()

    def submit(self, decision: Intervene) -> None:
        self._queue(decision.session_id, lambda: self._act(decision))

    def answer(self, reply: Reply) -> None:
        """Answer a permission request: a refusal is an intervention, queued like one; an
        approval goes at once, behind nothing (the call waits for it)."""
        if reply.loop is not None:
            self._queue(reply.session_id, lambda: self._refuse(reply))
            return
        task = asyncio.create_task(self._approve(reply))
        self._approvals.add(task)
        task.add_done_callback(self._approvals.discard)

    def _queue(self, session_id: str, act: Callable[[], Awaitable[None]]) -> None:
        previous = self._tails.get(session_id)
        task = asyncio.create_task(self._after(previous, act))
        self._tails[session_id] = task

        def done(task: asyncio.Task[None]) -> None:
            if self._tails.get(session_id) is task:
                del self._tails[session_id]

        task.add_done_callback(done)

    def acting_on(self, session_id: str) -> bool:
        """True while an action for this session is queued or running."""
        return session_id in self._tails

    async def drain(self, timeout: float) -> None:
        """Let in-flight actions finish, up to `timeout` seconds; cancel what is left."""
        tasks = [*self._tails.values(), *self._approvals]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _after(
        self, previous: asyncio.Task[None] | None, act: Callable[[], Awaitable[None]]
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            await act()
        except ConfigError as exc:
            self._on_fatal(exc)

    async def _act(self, decision: Intervene, **extra: object) -> None:
        started = time.monotonic()
        outcome, error = await self._abort(decision)
        fields = _loop_fields(decision, outcome)
        fields["abort_ms"] = round((time.monotonic() - started) * 1000, 1)
        fields.update(extra)
        if error is not None:
            fields["error"] = error
        log.warning("loop.detected", **fields)
        self._on_outcome(decision, outcome)
        if outcome in ("aborted", "held"):
            await self._give_feedback(decision)

    async def _refuse(self, reply: Reply) -> None:
        """Refuse the request of a loop's call; the model reads `reply.message` as its result.

        A hold still needs the run stopped, and a refused `doom_loop` request ends the run
        (see ../shared/opencode/NOTES.md): then the run is aborted and the feedback follows
        as a new message.
        """
        decision = reply.loop
        assert decision is not None and self._api is not None
        if reply.wait:
            await self._sleep(reply.wait)
            if not self._pending(reply.request_id):
                # Somebody (a person at the TUI) answered within the grace period.
                fields = _loop_fields(decision, "answered")
                log.warning("loop.detected", request_id=reply.request_id, **fields)
                self._on_outcome(decision, "answered")
                return
        started = time.monotonic()
        try:
            refused = await self._api.reply_permission(
                reply.request_id, reply.directory, "reject", reply.message
            )
        except ServerError as exc:
            await self._act(decision, request_id=reply.request_id, fallback=str(exc))
            return
        if not refused:
            # Answered first by someone else (`opencode run` answers at once): the call may
            # be running, so stop it as without the gate.
            await self._act(decision, request_id=reply.request_id, fallback="answered first")
            return
        reply_ms = round((time.monotonic() - started) * 1000, 1)
        outcome, error = "rejected", None
        if decision.hold or decision.rule == DOOM_LOOP:
            # The run must end before the feedback starts a new one; a refused doom_loop
            # request ends it only seconds later, and a message posted meanwhile is lost.
            stopped, error = await self._abort(decision)
            if decision.hold or error is not None:
                outcome = stopped
        fields = _loop_fields(decision, outcome)
        fields.update(request_id=reply.request_id, reply_ms=reply_ms)
        if error is not None:
            fields["error"] = error
        log.warning("loop.detected", **fields)
        self._on_outcome(decision, outcome)
        if outcome == "held" or (outcome == "rejected" and decision.rule == DOOM_LOOP):
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
        except ServerError as exc:
            return "abort_failed", str(exc)
        return ("held" if decision.hold else "aborted"), None

    async def _give_feedback(self, decision: Intervene) -> None:
        assert self._api is not None
        try:
            await self._api.prompt(
                decision.session_id, decision.directory, decision.feedback, no_reply=decision.hold
            )
        except ServerError as exc:
            log.error("feedback.failed", session_id=decision.session_id, error=str(exc))
            return
        log.info("feedback.sent", session_id=decision.session_id, hold=decision.hold)


def _loop_fields(decision: Intervene, outcome: str) -> dict[str, object]:
    """The fields of `loop.detected`, however the loop was stopped."""
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
        outcome=outcome,
    )
