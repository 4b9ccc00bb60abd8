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

Two checks keep one intervention per loop across monitors of one server (two `watch`, a
`watch` and an `attach`): before acting, the session's record is read back, and a loop some
monitor already refused, aborted or gave feedback on is left alone (outcome `deferred`);
after the abort, each monitor waits a random stagger and reads the record again, so that of
two monitors that aborted at once only the first posts the feedback (`feedback.deferred`).
And one record of due work: an abort or feedback that met no server at all waits for the
next connect, where a read-back of the session says what is left to do (`monitor.core.due`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from monitor.core.decisions import Intervene, Outcome, Plan, Reply
from monitor.core.due import Due, DueWork, Step, next_step
from monitor.core.export import answered, intervened
from monitor.core.findings import Rule
from monitor.errors import ConfigError, ServerError, SessionGone
from monitor.shell.api import OpencodeAPI, ServerAway

log = structlog.get_logger("monitor.shell.actions")

# After an abort, the feedback waits a random time up to this long and the session's record
# is read again: of two monitors that aborted one loop at once, the one that waited longer
# finds the other's feedback, unless their waits fall closer than a read-back and a post.
STAGGER_S = 0.5
# A 404 on our refusal, or a loop caught while another monitor answers the plugin: the record
# is read this many times, this far apart, for the call ending refused by another monitor (it
# ends in `error` a moment after the answer).
REFUSED_READS = 3
REFUSED_READ_EVERY_S = 0.1
# The check before acting reads only the newest messages: the loop's call is in the run's
# last steps, and another monitor's answer to it comes right after. A session's whole
# record can be megabytes, and this read delays the abort.
RECENT_MESSAGES = 20


def random_stagger() -> float:
    return random.uniform(0.0, STAGGER_S)


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
        run_over: Callable[[Intervene], bool] = lambda decision: False,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        stagger: Callable[[], float] = random_stagger,
        clock: Callable[[], float] = time.monotonic,
        plugin_elsewhere: bool = False,
    ) -> None:
        self._api = api
        # Another monitor of this server answers its plugin: a loop's call we catch on the
        # stream may be one its plugin blocks a moment later (the hook runs before the
        # stream shows the call), so the record is read a few times before we act.
        self._plugin_elsewhere = plugin_elsewhere
        self._forget = forget
        self._on_fatal = on_fatal
        self._on_outcome = on_outcome
        # A reply's deadline passed: the core says what to send now (None: nothing, somebody
        # answered meanwhile). The shell only runs the timer.
        self._expire = expire
        # Whether the run a decision was made in has ended since (the core knows).
        self._run_over = run_over
        self._sleep = sleep
        self._stagger = stagger
        self._clock = clock
        self._due = DueWork()
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Every task not yet done, queued ones and approvals too: `_tails` holds only the
        # last per session, and shutdown must reach them all.
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, decision: Intervene) -> None:
        if decision.refused:
            # The plugin's own rule refused the loop's call (no monitor answered it): that is
            # this intervention's block, the run went on.
            self.blocked(decision, via="plugin_rule")
            return
        if decision.plan == Plan.DEFER:
            _again(decision)  # the intervention that stands for this loop does it all
            return
        log.warning("loop.detected", **decision.fields())
        self._queue(decision, lambda progress: self._act(decision, progress))

    def blocked(self, decision: Intervene, call_id: str | None = None, via: str = "plugin") -> None:
        """The plugin threw (told to, or by its own rule: `via`): the loop's call does not
        run. A `stop` (or a hold) also stops the run, then gives the feedback; a block lets
        the run go on."""
        fields: dict[str, object] = {"via": via}
        if call_id is not None:
            fields["call_id"] = call_id
        if decision.plan == Plan.DEFER:
            _again(decision, **fields)
            return
        log.warning("loop.detected", **fields, **decision.fields())
        if decision.plan in _STOPS:
            self._queue(
                decision,
                lambda progress: self._act(decision, progress, ours=True, via=via),
            )
            return
        self._decided(decision, Outcome.BLOCKED, **fields)

    def standby(self, decision: Intervene, acting_pid: int | None) -> None:
        """Another monitor acts for this server (monitor.shell.acting): the loop found here
        is logged, and left to it."""
        if decision.plan == Plan.DEFER:
            _again(decision, standby=True)
            return
        log.warning("loop.detected", standby=True, **decision.fields())
        self._decided(decision, Outcome.STANDBY, acting_pid=acting_pid)

    def answer(self, reply: Reply) -> None:
        """Answer a permission request: a refusal is an intervention, queued like one; an
        approval goes at once, behind nothing (the call waits for it)."""
        decision = reply.loop
        if decision is not None and decision.plan == Plan.DEFER:
            # Refused, as the loop's other calls were; nothing else to do.
            _again(decision, request_id=reply.request_id)
            self._track(asyncio.create_task(self._approve(reply)))
            return
        if decision is not None:
            log.warning("loop.detected", request_id=reply.request_id, **decision.fields())
            self._queue(decision, lambda progress: self._refuse(reply, decision, progress))
            return
        self._track(asyncio.create_task(self._approve(reply)))

    def acting_on(self, session_id: str) -> bool:
        """True while an action for this session is queued or running."""
        return session_id in self._tails

    def resume(self) -> None:
        """The server answers again (a connect): finish the due work, each in its session's
        order; work too old is given up and logged."""
        fresh, stale = self._due.take(self._clock())
        for due in stale:
            self._give_up(due, "server away too long")
        for due in fresh:
            self._queue(due.decision, self._finishing(due))

    def _finishing(self, due: Due) -> Callable[[_Progress], Awaitable[None]]:
        return lambda progress: self._finish(due, progress)

    async def drain(self, timeout: float) -> None:
        """Let in-flight actions finish, up to `timeout` seconds; cancel what is left."""
        tasks = list(self._running)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        fresh, stale = self._due.take(self._clock())
        for due in fresh + stale:
            self._give_up(due, "cancelled at shutdown")

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
        except Exception as exc:
            # A bug of ours must not leave a loop unlogged (nor as "Task exception was never
            # retrieved"): say how far the action got, then what broke, with its traceback
            # (code locations only, never a tool's arguments).
            error = f"internal error: {type(exc).__name__}"
            if not progress.decided:
                self._decided(decision, Outcome.ABORT_FAILED, error=error)
            elif progress.feedback_due:
                _feedback_failed(decision, error)
            log.error("action.crashed", session_id=decision.session_id, exc_info=exc)

    def _decided(self, decision: Intervene, outcome: Outcome, **fields: object) -> None:
        log.warning(
            "intervention.outcome",
            **decision.fields(),
            outcome=str(outcome),
            **{key: value for key, value in fields.items() if value is not None},
        )
        self._on_outcome(decision, outcome)

    async def _act(
        self, decision: Intervene, progress: _Progress, ours: bool = False, **extra: object
    ) -> None:
        """Stop the run (or nudge it), then give the feedback. `ours`: we refused the loop's
        call already (the plugin threw our feedback), so that refusal in the record is ours,
        not another monitor's."""
        recent: list[Any] | None = None
        if self._api is not None:
            # Before acting, check: another monitor may have stopped this loop already.
            reads = REFUSED_READS if self._plugin_elsewhere and not ours else 1
            other, recent = await self._intervened(decision, aborted=True, reads=reads, ours=ours)
            if self._deferred(decision, progress, other, extra):
                return
        if decision.plan == Plan.NUDGE and self._api is not None:
            # The run goes on: the feedback is read at its next step.
            progress.decided = True
            self._decided(decision, Outcome.NUDGED, **extra)
            progress.feedback_due = True
            await self._give_feedback(decision, stagger=True, ours=ours)
            return
        if self._api is not None and (
            self._run_over(decision) or (recent is not None and answered(recent))
        ):
            # The run is over. Stopped by another monitor between our read and its end (the
            # read came too early to show it): that monitor's feedback starts the next turn.
            other = await self._stopped_by_another(decision, ours)
            if self._deferred(decision, progress, other, extra):
                return
            # Found late (a monitor that stalled reads a run's calls after they ran): the
            # run ended by itself meanwhile. Stopping it stops nothing, or the next run; the
            # model is told once, for the next time it is asked.
            progress.decided = True
            self._decided(decision, Outcome.NUDGED, late="run ended before the abort", **extra)
            progress.feedback_due = True
            await self._give_feedback(decision, stagger=True, ours=ours, no_reply=True)
            return
        started = time.monotonic()
        outcome, error = await self._abort(decision)
        if outcome is None:
            self._keep(decision, Step.ABORT, error, ours)
            return
        abort_ms = round((time.monotonic() - started) * 1000, 1)
        progress.decided = True
        self._decided(decision, outcome, abort_ms=abort_ms, error=error, **extra)
        if outcome in (Outcome.ABORTED, Outcome.HELD):
            progress.feedback_due = True
            await self._give_feedback(decision, stagger=True, ours=ours)

    async def _stopped_by_another(self, decision: Intervene, ours: bool) -> str | None:
        """Why a run found over did not end by itself, or None when it did (its record ends
        with the model's answer) or cannot be read. Stopped by another monitor, its record
        shows the abort, but on the real server a moment after the run's end: read a few
        times; a run that ended without an answer and without a mark was stopped all the
        same (by a person, or a monitor whose mark is late)."""
        for read in range(REFUSED_READS):
            if read:
                await self._sleep(REFUSED_READ_EVERY_S)
            messages = await self._recent(decision)
            if messages is None or answered(messages):
                return None
            other = intervened(messages, decision.part_id, aborted=True, refused=not ours)
            if other is not None:
                return other
        return "run ended without an answer"

    def _deferred(
        self,
        decision: Intervene,
        progress: _Progress,
        other: str | None,
        extra: dict[str, object],
    ) -> bool:
        """Leave the loop to the monitor that intervened on it already (`other`: what it
        did), if one did."""
        if other is None:
            return False
        progress.decided = True
        self._decided(decision, Outcome.DEFERRED, reason=other, **extra)
        return True

    async def _finish(self, due: Due, progress: _Progress) -> None:
        """Due work after a connect: what the session's record shows is done is logged as
        done, the rest is done now (once: the record is read first)."""
        assert self._api is not None
        decision = due.decision
        try:
            busy = due.step == Step.ABORT and decision.session_id in (
                await self._api.busy_sessions(decision.directory)
            )
            messages = await self._api.messages(decision.session_id, decision.directory)
        except ServerAway as exc:
            self._keep(decision, due.step, str(exc), due.ours)
            return
        except ServerError as exc:
            self._give_up(due, str(exc))
            return
        step, found = next_step(due, busy, messages)
        if step == Step.ABORT:
            await self._act(decision, progress, ours=due.ours)
            return
        if due.step == Step.ABORT:
            # The run stopped: the abort arrived, or the server's restart ended the run.
            progress.decided = True
            outcome = Outcome.HELD if decision.plan == Plan.HOLD else Outcome.ABORTED
            self._decided(decision, outcome, confirmed="run stopped, read back after reconnect")
        progress.feedback_due = True
        if step is None:
            _feedback_found(decision, found)
            return
        await self._give_feedback(decision, stagger=False, checked=True, ours=due.ours)

    async def _intervened(
        self, decision: Intervene, aborted: bool, reads: int = 1, ours: bool = False
    ) -> tuple[str | None, list[Any] | None]:
        """What another monitor did about this loop, read back from the session's record
        (None when nothing, or the record cannot be read: better act twice than never), and
        the newest messages read. `aborted`: whether an aborted run counts as its doing;
        `ours`: the loop's call was refused by us, so its refusal does not."""
        messages = None
        for read in range(reads):
            if read:
                await self._sleep(REFUSED_READ_EVERY_S)
            messages = await self._recent(decision)
            if messages is None:
                return None, None
            other = intervened(messages, decision.part_id, aborted, refused=not ours)
            if other is not None:
                return other, messages
        return None, messages

    async def _recent(self, decision: Intervene) -> list[Any] | None:
        """The session's newest messages, or None when they cannot be read."""
        assert self._api is not None
        try:
            return await self._api.messages(
                decision.session_id, decision.directory, last=RECENT_MESSAGES
            )
        except ServerError:
            return None

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
                request_id, reply.directory, reply.reply, reply.message, reply.session_id
            )
        except ServerError as exc:
            await self._act(decision, progress, request_id=request_id, fallback=str(exc))
            return
        if not refused:
            # Answered first: by another monitor, whose refusal the call's record shows a
            # moment later, or by someone else (`opencode run` answers at once), and the
            # call may be running: stop it as without the gate.
            other, _ = await self._intervened(decision, aborted=True, reads=REFUSED_READS)
            if self._deferred(decision, progress, other, {"request_id": request_id}):
                return
            await self._act(decision, progress, request_id=request_id, fallback="answered first")
            return
        reply_ms = round((time.monotonic() - started) * 1000, 1)
        outcome: Outcome = Outcome.REJECTED
        error = None
        stop = decision.plan in _STOPS
        if stop or decision.rule == Rule.DOOM_LOOP:
            # The run must end before the feedback starts a new one; a refused doom_loop
            # request ends it only seconds later, and a message posted meanwhile is lost.
            stopped, error = await self._abort(decision)
            if stopped is None and stop:
                # The server went away (a restart at the abort): the rest waits for the
                # next connect, and the refusal in the record is ours.
                self._keep(decision, Step.ABORT, error, ours=True)
                return
            if stop or error is not None:
                outcome = Outcome.ABORT_FAILED if stopped is None else stopped
        progress.decided = True
        self._decided(decision, outcome, request_id=request_id, reply_ms=reply_ms, error=error)
        if outcome in (Outcome.HELD, Outcome.ABORTED) or (
            outcome == Outcome.REJECTED and decision.rule == Rule.DOOM_LOOP
        ):
            progress.feedback_due = True
            await self._give_feedback(decision, stagger=False, ours=True)

    async def _approve(self, reply: Reply) -> None:
        """Send an answer that is no intervention of its own: an approval, or the refusal of
        a call of a loop another intervention stands for (its message goes with it)."""
        assert self._api is not None
        started = time.monotonic()
        try:
            answered = await self._api.reply_permission(
                reply.request_id,
                reply.directory,
                reply.reply,
                reply.message,
                session_id=reply.session_id,
            )
        except ConfigError as exc:
            self._on_fatal(exc)
            return
        except ServerError as exc:
            log.error("permission.reply_failed", request_id=reply.request_id, error=str(exc))
            return
        log.debug(
            "permission.approved" if reply.loop is None else "permission.refused_again",
            session_id=reply.session_id,
            request_id=reply.request_id,
            answered_first=answered,
            reply_ms=round((time.monotonic() - started) * 1000, 1),
        )

    async def _abort(self, decision: Intervene) -> tuple[Outcome | None, str | None]:
        """How the abort ended; None when the server never answered (work for later)."""
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
        except ServerAway as exc:
            return None, str(exc)
        except ServerError as exc:
            return Outcome.ABORT_FAILED, str(exc)
        return (Outcome.HELD if decision.plan == Plan.HOLD else Outcome.ABORTED), None

    async def _give_feedback(
        self,
        decision: Intervene,
        stagger: bool,
        checked: bool = False,
        ours: bool = False,
        no_reply: bool = False,
    ) -> None:
        """Post the feedback, unless another monitor's is in the session by then (`stagger`:
        after a random wait, see STAGGER_S; `checked`: the record was just read; `ours`: the
        loop's call was refused by us; `no_reply`: the model reads it at its next run)."""
        assert self._api is not None
        if stagger:
            await self._sleep(self._stagger())
        if not checked:
            other, _ = await self._intervened(decision, aborted=False, ours=ours)
            if other is not None:
                _feedback_found(decision, other)
                return
        try:
            await self._api.prompt(
                decision.session_id,
                decision.directory,
                decision.feedback,
                no_reply=no_reply or decision.plan in (Plan.HOLD, Plan.NUDGE),
                after_part=decision.part_id,
            )
        except ConfigError as exc:
            _feedback_failed(decision, str(exc))
            self._on_fatal(exc)
            return
        except ServerAway as exc:
            self._keep(decision, Step.FEEDBACK, str(exc), ours)
            return
        except ServerError as exc:
            _feedback_failed(decision, str(exc))
            return
        log.info("feedback.sent", session_id=decision.session_id, hold=decision.hold)

    def _keep(self, decision: Intervene, step: Step, error: str | None, ours: bool = False) -> None:
        """The server is away: `step` waits for the next connect (`ours`: the loop's call
        was refused by us)."""
        log.warning("intervention.due", session_id=decision.session_id, step=str(step), error=error)
        for dropped in self._due.add(decision, step, self._clock(), ours):
            self._give_up(dropped, "too much work waiting for the server")

    def _give_up(self, due: Due, error: str) -> None:
        if due.step == Step.ABORT:
            self._decided(due.decision, Outcome.ABORT_FAILED, error=error)
        else:
            _feedback_failed(due.decision, error)


# The plans that stop the run after the call is refused.
_STOPS = (Plan.STOP, Plan.HOLD)


def _again(decision: Intervene, **fields: object) -> None:
    """A loop's call refused again within the intervention that stands for it (`DEFER`)."""
    log.info(
        "loop.again",
        session_id=decision.session_id,
        part_id=decision.part_id,
        rule=str(decision.rule),
        call_index=decision.position,
        **fields,
    )


def _feedback_failed(decision: Intervene, error: str) -> None:
    log.error("feedback.failed", session_id=decision.session_id, error=error)


def _feedback_found(decision: Intervene, found: str | None) -> None:
    """The feedback is in the session already: posted by us before the server went away, or
    by another monitor (then this one defers)."""
    if found == "feedback found in the session":
        log.info("feedback.sent", session_id=decision.session_id, hold=decision.hold, found=True)
    else:
        log.info("feedback.deferred", session_id=decision.session_id, reason=found)
