"""Carrying out interventions: the I/O of `monitor.core.intervention`'s commands.

Each intervention's life is the core's table, and `Monitor` keeps the live ones (their
order per session, the work parked while the server is away). Here each command it hands
over (`Do`: read the record, abort, post, answer a permission request, wait) is run through
the API and what came of it is fed back (`Monitor.happened`), and the commands that returns
(its lines, counts, the next `Do`) are carried out. Nothing here looks at a plan, a rule or
an outcome (tests/test_layers.py checks it).

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
from collections.abc import Awaitable, Callable, Sequence

import structlog

from monitor.core import intervention as life
from monitor.core.commands import Command, Do
from monitor.core.decisions import Reply
from monitor.core.intervention import Result, Sent
from monitor.core.monitor import Monitor
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


def _read_at_once(command: life.Command) -> bool:
    return isinstance(command, life.ReadRecent) and command.at_once


class Interventions:
    """Carries out the interventions `monitor` begins (`Do`), each session's in order; what
    comes of each command goes back to `monitor.happened`, its commands to `execute`."""

    def __init__(
        self,
        api: OpencodeAPI | None,
        monitor: Monitor,
        execute: Callable[[Sequence[Command]], None],
        on_fatal: Callable[[BaseException], None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        stagger: Callable[[], float] = random_stagger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._monitor = monitor
        self._execute = execute
        self._on_fatal = on_fatal
        self._sleep = sleep
        self._stagger = stagger
        self._clock = clock
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Every task not yet done, queued ones and approvals too: `_tails` holds only the
        # last per session, and shutdown must reach them all.
        self._running: set[asyncio.Task[None]] = set()

    def begin(self, do: Do) -> None:
        """An intervention's first command, behind the session's interventions begun
        before (never two aborts racing for one session)."""
        session_id = do.session_id
        previous = self._tails.get(session_id)
        unsaid = [do.said]

        def say() -> None:
            if unsaid:
                self._execute(unsaid.pop())

        task = asyncio.create_task(self._drive(previous, do, say))
        asyncio.get_running_loop().call_later(SAY_WITHIN_S, say)
        self._tails[session_id] = task
        self._track(task)

        def done(task: asyncio.Task[None]) -> None:
            say()  # however it ended, even cancelled before it began
            if self._tails.get(session_id) is task:
                del self._tails[session_id]

        task.add_done_callback(done)

    def send(self, reply: Reply) -> None:
        """An answer that is no intervention of its own: at once, behind nothing."""
        self._track(asyncio.create_task(self._send(reply)))

    def resume(self) -> None:
        """The server answers again (a connect): the due work goes on."""
        self._execute(self._monitor.resume(self._clock()))

    async def drain(self, timeout: float) -> None:
        """Let in-flight interventions finish, up to `timeout` seconds; cancel what is left."""
        tasks = list(self._running)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._execute(self._monitor.shutdown(self._clock()))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _drive(
        self,
        previous: asyncio.Task[None] | None,
        do: Do,
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
        monitor, number = self._monitor, do.number
        try:
            if previous is not None:
                say()
                await asyncio.wait([previous])
            next_command: life.Command | None = do.command
            while next_command is not None:
                happened = await self._carry_out(next_command)
                if not _read_at_once(next_command):
                    say()
                commands = monitor.happened(number, happened, self._clock())
                next_command = None
                if commands and isinstance(last := commands[-1], Do) and last.number == number:
                    next_command = last.command
                    commands = commands[:-1]
                if commands:
                    say()
                self._execute(commands)
        except asyncio.CancelledError:
            say()
            self._execute(monitor.happened(number, life.Cancelled(), self._clock()))
            raise
        except Exception as exc:
            say()
            # A bug of ours must not leave a loop unlogged (nor as "Task exception was never
            # retrieved"): say how far it got, then what broke, with its traceback (code
            # locations only, never a tool's arguments).
            dropped = life.Dropped(f"internal error: {type(exc).__name__}")
            self._execute(monitor.happened(number, dropped, self._clock()))
            log.error("action.crashed", session_id=do.session_id, exc_info=exc)

    async def _carry_out(self, command: life.Command) -> life.Happened:
        """Carry out one command: what came of it."""
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
            return life.Read(messages)
        if isinstance(command, life.ReadBack):
            return await self._read_back(api, command)
        if isinstance(command, life.Wait):
            await self._sleep(command.reply.wait)
            return life.Expired(command.reply)
        assert not isinstance(command, life.Park)  # the core parks its own work
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

    async def _read_back(self, api: OpencodeAPI, command: life.ReadBack) -> life.Happened:
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
