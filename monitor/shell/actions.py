"""Carrying out interventions: the executor of `monitor.core.intervention`'s commands.

Each intervention's life is the core's table; here each command it asks for is run through
the API (read the record, abort, post, answer a permission request, wait, wait for the next
connect) and what came of it is fed back, and each report is logged. Nothing here looks at a
plan, a rule or an outcome (tests/test_layers.py checks it).

Each session's interventions run in order (never two aborts racing for one session), each in
its own task, so a slow or failing call for one session never delays reading the stream or
acting on another. Approvals of permission requests go at once, behind nothing (the call
waits for them). Every decision is logged as `loop.detected` once its first acting request
has been answered, at most `SAY_WITHIN_S` after it was handed over (the line waits for the
request, not the request for the line); how it was carried out ends in one
`intervention.outcome`, and feedback that was due ends in `feedback.sent`,
`feedback.deferred` or `feedback.failed`. An intervention still queued or running when
`drain` gives up is fed its shutdown: no decision goes unlogged.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import structlog

from monitor.core import intervention as life
from monitor.core.decisions import Intervene, Outcome, Reply
from monitor.core.due import DueWork
from monitor.core.intervention import Command, Happened, Intervention, Result, Sent, Turn
from monitor.errors import ConfigError, ServerAway, ServerError, SessionGone
from monitor.shell.api import OpencodeAPI

__all__ = ["STAGGER_S", "Interventions", "random_stagger"]

log = structlog.get_logger("monitor.shell.actions")

# After an abort, the feedback waits a random time up to this long and the session's record
# is read again: of two monitors that aborted one loop at once, the one that waited longer
# finds the other's feedback, unless their waits fall closer than a read-back and a post.
STAGGER_S = 0.5

# `loop.detected` waits for the loop's read and abort to be answered (`_drive`), but no
# longer than this: a server that is slow to answer must not hide the line.
SAY_WITHIN_S = 0.05


def random_stagger() -> float:
    return random.uniform(0.0, STAGGER_S)


def _read_at_once(command: Command) -> bool:
    return isinstance(command, life.ReadRecent) and not command.staggered and not command.pause


class Interventions:
    """Runs interventions per session in order; `api=None` means dry run (log only)."""

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
        self._reads = life.REFUSED_READS if plugin_elsewhere else 1
        self._forget = forget
        self._on_fatal = on_fatal
        self._on_outcome = on_outcome
        # The core's answers the commands need: what to send once a reply's grace period
        # is over, whether the run a decision was made in has ended since.
        self._expire = expire
        self._run_over = run_over
        self._sleep = sleep
        self._stagger = stagger
        self._clock = clock
        self._due: DueWork[Intervention] = DueWork()
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Every task not yet done, queued ones and approvals too: `_tails` holds only the
        # last per session, and shutdown must reach them all.
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, decision: Intervene) -> None:
        """A loop found: stopped, nudged, or (dry run) only logged, as the core plans it."""
        self._begin(*life.found(decision, dry_run=self._api is None, reads=self._reads))

    def blocked(self, decision: Intervene, call_id: str | None = None, via: str = "plugin") -> None:
        """The plugin threw (told to, or by its own rule: `via`): the loop's call did not run."""
        self._begin(*life.refused_call(decision, via, call_id, dry_run=self._api is None))

    def standby(self, decision: Intervene, acting_pid: int | None) -> None:
        """Another monitor acts for this server (monitor.shell.acting)."""
        self._report(life.standby(decision, acting_pid))

    def answer(self, reply: Reply) -> None:
        """Answer a permission request: a refusal that is an intervention is queued like one;
        any other answer goes at once."""
        found, turn = life.request(reply)
        if found is None:
            self._report(turn)
            self._track(asyncio.create_task(self._send(reply)))
            return
        self._begin(found, turn)

    def acting_on(self, session_id: str) -> bool:
        """True while an intervention for this session is queued or running."""
        return session_id in self._tails

    def resume(self) -> None:
        """The server answers again (a connect): the due work goes on, each in its session's
        order; work too old is given up."""
        fresh, stale = self._due.take(self._clock())
        for due in stale:
            self._report(due.work.feed(life.Dropped("server away too long")))
        for due in fresh:
            self._begin(due.work, due.work.feed(life.Resumed()))

    async def drain(self, timeout: float) -> None:
        """Let in-flight interventions finish, up to `timeout` seconds; cancel what is left."""
        tasks = list(self._running)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        fresh, stale = self._due.take(self._clock())
        for due in fresh + stale:
            self._report(due.work.feed(life.Cancelled()))

    def _begin(self, found: Intervention | None, turn: Turn) -> None:
        if found is None or turn.command is None:
            self._report(turn)
            return
        session_id = found.decision.session_id
        previous = self._tails.get(session_id)
        unsaid = [turn]

        def say() -> None:
            if unsaid:
                self._report(unsaid.pop())

        task = asyncio.create_task(self._drive(previous, found, turn.command, say))
        asyncio.get_running_loop().call_later(SAY_WITHIN_S, say)
        self._tails[session_id] = task
        self._track(task)

        def done(task: asyncio.Task[None]) -> None:
            say()  # however it ended, even cancelled before it began
            if self._tails.get(session_id) is task:
                del self._tails[session_id]

        task.add_done_callback(done)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _drive(
        self,
        previous: asyncio.Task[None] | None,
        found: Intervention,
        command: Command,
        say: Callable[[], None],
    ) -> None:
        """Run the intervention's commands until it is done or waits for the server.

        `say` writes the lines of the turn that began it (`loop.detected`), if not written
        yet, at the first of: the task has a line of its own, a command other than a read
        sent at once has been answered, `SAY_WITHIN_S` has passed, the task waits for the
        one before it. Not as soon as a request is written: aiohttp writes a request's
        body in a task of its own (before Python 3.14), which would come after the line.
        A loop's requests wait for no log line: on a stand-in server that answers at
        once, the line written between the read and the abort cost the abort a tenth of
        a millisecond (docs/performance.md)."""
        try:
            if previous is not None:
                say()
                await asyncio.wait([previous])
            next_command: Command | None = command
            while next_command is not None:
                happened = await self._execute(found, next_command)
                if not _read_at_once(next_command):
                    say()
                if happened is None:
                    return  # parked until the next connect
                turn = found.feed(happened)
                if turn.reports:
                    say()
                self._report(turn)
                next_command = turn.command
        except asyncio.CancelledError:
            say()
            self._report(found.feed(life.Cancelled()))
            raise
        except Exception as exc:
            say()
            # A bug of ours must not leave a loop unlogged (nor as "Task exception was never
            # retrieved"): say how far it got, then what broke, with its traceback (code
            # locations only, never a tool's arguments).
            if found.state != life.State.DONE:
                self._report(found.feed(life.Dropped(f"internal error: {type(exc).__name__}")))
            log.error("action.crashed", session_id=found.decision.session_id, exc_info=exc)

    def _report(self, turn: Turn) -> None:
        for report in turn.reports:
            if isinstance(report, life.Logged):
                getattr(log, report.level)(report.event, **report.fields)
            elif isinstance(report, life.Decided):
                log.warning("intervention.outcome", **report.fields)
                self._on_outcome(report.decision, report.outcome)
            else:
                self._forget(report.session_id)

    async def _execute(self, found: Intervention, command: Command) -> Happened | None:
        """Carry out one command; what came of it (None: parked for the next connect)."""
        api = self._api
        assert api is not None  # a dry run begins nothing that acts
        if isinstance(command, life.ReadRecent):
            pause = self._stagger() if command.staggered else command.pause
            if pause:
                await self._sleep(pause)
            decision = command.decision
            try:
                messages = await api.messages(
                    decision.session_id, decision.directory, command.last, route=decision.route
                )
            except ServerError:
                messages = None
            return life.Read(messages, run_over=self._run_over(decision))
        if isinstance(command, life.ReadBack):
            return await self._read_back(api, command)
        if isinstance(command, life.Wait):
            await self._sleep(command.reply.wait)
            return life.Expired(self._expire(command.reply))
        if isinstance(command, life.Park):
            for dropped in self._due.add(
                (command.session_id, command.part_id), found, self._clock()
            ):
                self._report(dropped.feed(life.Dropped("too much work waiting for the server")))
            return None
        return await self._send_command(api, command)

    async def _send_command(
        self, api: OpencodeAPI, command: life.Abort | life.Post | life.Answer
    ) -> Sent:
        started = time.monotonic()
        try:
            if isinstance(command, life.Abort):
                await api.abort(command.session_id, command.directory, route=command.route)
                taken = True
            elif isinstance(command, life.Post):
                await api.prompt(
                    command.session_id,
                    command.directory,
                    command.text,
                    command.no_reply,
                    command.after_part,
                    route=command.route,
                )
                taken = True
            else:
                taken = await _answer(api, command.reply)
        except SessionGone as exc:
            return Sent(Result.GONE, str(exc))
        except ConfigError as exc:
            self._on_fatal(exc)  # logged as this intervention's failure, then the monitor stops
            return Sent(Result.FAILED, str(exc))
        except ServerAway as exc:
            return Sent(Result.AWAY, str(exc))
        except ServerError as exc:
            return Sent(Result.FAILED, str(exc))
        ms = round((time.monotonic() - started) * 1000, 1)
        return Sent(Result.OK if taken else Result.NOT_TAKEN, ms=ms)

    async def _read_back(self, api: OpencodeAPI, command: life.ReadBack) -> Happened:
        decision = command.decision
        try:
            busy = command.busy and decision.session_id in (
                await api.busy_sessions(decision.directory)
            )
            messages = await api.messages(
                decision.session_id, decision.directory, route=decision.route
            )
        except ServerAway as exc:
            return Sent(Result.AWAY, str(exc))
        except ServerError as exc:
            return Sent(Result.FAILED, str(exc))
        return life.Read(messages, busy=busy)

    async def _send(self, reply: Reply) -> None:
        """Send an answer that is no intervention of its own: an approval, or the refusal of
        a call of a loop another intervention stands for (its message goes with it)."""
        assert self._api is not None
        started = time.monotonic()
        try:
            taken = await _answer(self._api, reply)
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
            answered_first=taken,
            reply_ms=round((time.monotonic() - started) * 1000, 1),
        )


async def _answer(api: OpencodeAPI, reply: Reply) -> bool:
    """Send `reply` to its permission request, by its route; False when it was answered
    first."""
    return await api.reply_permission(
        reply.request_id,
        reply.directory,
        reply.reply,
        reply.message,
        reply.session_id,
        route=reply.route,
    )
