"""The shell's loop: the server's stream read, each frame fed to `Monitor`, its commands
carried out, what came of them fed back.

Bytes in (`EventStream`), `Monitor` decides (the tracker is its part: nothing here reaches
it but through `Monitor`), the executor runs the commands (`Interventions` the API calls of
an intervention), and what comes of a command is fed back (`Monitor.happened`,
`Monitor.overdue`). Around it: every connect locates the server and
resyncs from its record while the new connection's frames are read (`Resync`), and a stream
that stalls while runs are under way is checked against the server (`Silence`). It decides
nothing (tests/test_layers.py checks it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import aiohttp
import structlog

from monitor.config import Settings
from monitor.core.commands import Command
from monitor.core.decisions import Deadline
from monitor.core.fed import Fed
from monitor.core.monitor import Monitor
from monitor.errors import ServerError
from monitor.shell.actions import Interventions
from monitor.shell.api import authorize
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.diagnosis import directory_known
from monitor.shell.executor import Executor
from monitor.shell.locate import Locator
from monitor.shell.metrics import Metrics
from monitor.shell.notify import Notifier
from monitor.shell.record import Recorder
from monitor.shell.resync import Resync
from monitor.shell.silence import Silence
from monitor.shell.stream import EventStream, stream_url
from monitor.shell.timing import Scope, Timing
from monitor.shell.toast import Toasts

__all__ = ["Follow"]

log = structlog.get_logger("monitor.shell.watch")

QUIET_EVENTS = frozenset({"server.heartbeat", "server.connected"})


class Follow:
    """One watch's following of its server, over the HTTP client `http`; `stop` ends the
    watch, `fail` ends it with an error to raise."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        settings: Settings,
        timing: Timing,
        scope: Scope,
        monitor: Monitor,
        execute: Executor,
        notifier: Notifier,
        metrics: Metrics | None,
        recorder: Recorder | None,
        plugin_elsewhere: bool,
        stop: Callable[[], None],
        fail: Callable[[BaseException], None],
        server_pid: Callable[[int | None], None] = lambda pid: None,
    ) -> None:
        self._settings = settings
        self._timing = timing
        self._scope = scope
        self._monitor = monitor
        self._execute = execute
        self._notifier = notifier
        self._metrics = metrics
        self._recorder = recorder
        self._stop = stop
        self.api = EngineAPI(
            http,
            settings.url,
            timing.retry,
            timing.sleep,
            choice=settings.api,
        )
        self.toasts = Toasts(self.api)
        self.locator = Locator(
            self.api,
            monitor,
            settings.url,
            settings.directory,
            settings.service,
            lambda password: authorize(http, settings.username, password),
            server_pid,
        )
        monitor.plugin_elsewhere(plugin_elsewhere)
        self.interventions = Interventions(
            None if settings.dry_run else self.api,
            monitor,
            execute,
            on_fatal=fail,
            sleep=timing.sleep,
            stagger=timing.stagger,
            clock=timing.clock,
        )
        execute.acting_through(self.interventions, self.toasts, self._deadline)
        self.resync = Resync(
            self.api, monitor, settings, scope.only_session, execute, self._event, timing.clock
        )
        self._silence = Silence(self.api, monitor, settings.directory, timing.silence, timing.clock)
        self.stream = EventStream(
            http,
            stream_url(settings.url, settings.directory),
            on_frame=self._on_frame,
            on_connect=self._on_connect,
            on_disconnect=self._on_disconnect,
            backoff=timing.reconnect,
            read_timeout=timing.read_timeout,
            sleep=timing.sleep,
            clock=timing.clock,
            locate=self.locator.locate,
        )
        # Calls' time bounds being waited for (`_deadline`), cancelled when watching stops.
        self._deadlines: set[asyncio.Task[None]] = set()
        self._ready_sent = False
        self.last_frame_at: float | None = None

    async def every_half_silence(self) -> None:
        """Bound the unwatched time of a stream that stalls but stays connected (see
        monitor.shell.silence), go on with work a server away left, say when no plugin asks
        although no frame comes. Never returns."""
        timing, stream = self._timing, self.stream
        while True:
            # A real wait, not `timing.sleep`: tests record those as the reconnect backoff's.
            await asyncio.sleep(timing.silence / 2)
            if stream.connected:
                self.interventions.resume()  # due work left by a server away meanwhile
            self._execute(self._monitor.tick(timing.clock()))
            await self._silence.check(stream)

    async def finish(self) -> None:
        """Watching stopped: in-flight interventions get `Timing.drain` to finish."""
        for task in self._deadlines:
            task.cancel()
        self._notifier.stopping()
        await self.interventions.drain(self._timing.drain)
        await self.toasts.close()

    def _on_frame(self, data: str) -> bool:
        """Feed one frame to `Monitor`; True when it handed work to the executor."""
        if self._recorder is not None:
            self._recorder.write(data)
        waiting = self.resync.waiting
        if waiting is None:
            now = self._timing.clock()
            return self._take(*self._monitor.frame(data, now), now)
        if (frame := waiting.admit(data)) is not None:
            return self._event(frame)
        return False

    def _event(self, frame: object) -> bool:
        """Feed one decoded frame (one that waited for the resync, or read back)."""
        now = self._timing.clock()
        return self._take(*self._monitor.event(frame, now), now)

    def _take(self, fed: Fed, commands: Sequence[Command], now: float) -> bool:
        """Carry out and count what one frame fed to `Monitor` did; True when it handed
        work on."""
        if commands:
            self._execute(commands)
        if fed.event_type not in QUIET_EVENTS:
            self._silence.last_event_at = now
        metrics = self._metrics
        if metrics is not None:
            self.last_frame_at = now
            metrics.frame(fed.event_type)
        return bool(fed.decisions or fed.replies)  # most frames decide nothing

    def _deadline(self, deadline: Deadline) -> None:
        """Wait out a call's time bound, then ask whether the call still runs
        (`Monitor.overdue`): the core keeps no clock, the time comes from here."""
        task = asyncio.get_running_loop().create_task(self._overdue(deadline))
        self._deadlines.add(task)
        task.add_done_callback(self._deadlines.discard)

    async def _overdue(self, deadline: Deadline) -> None:
        await self._timing.sleep(deadline.wait)
        self._execute(self._monitor.overdue(deadline))

    async def _on_connect(self) -> None:
        # Before anything awaits: frames of the sessions the resync rebuilds wait for it.
        self.resync.hold()
        try:
            await self._connected()
        finally:
            self.resync.release()

    async def _connected(self) -> None:
        self.locator.say()
        self._silence.heard()
        self._notifier.status("streaming events")
        if self._ready_sent and self._metrics is not None:
            self._metrics.reconnect()  # every connection after the first is a reconnect
        first = not self._ready_sent
        if first:
            self._ready_sent = True
            self._notifier.ready()
            await self._check_directory()
        # Work the server's absence left undone goes first; the resync leaves its sessions
        # to it (they are being acted on).
        self.interventions.resume()
        # Asked by the one session's route, as the core names it.
        only = self._scope.only_session
        there = await self._scope.still_there(
            self.api, 1 if only is None else self._monitor.route(only)
        )
        if not there:
            self._stop()
            return
        await self.resync.run(first)

    async def _check_directory(self) -> None:
        """Warn once, at the first connect, when --directory names no project the server has.

        A warning, not an exit: a project appears when someone first opens it, which may be
        after the monitor starts (at boot, under systemd).
        """
        directory = self._settings.directory
        if directory is None or self._scope.only_session is not None:
            return
        try:
            known = await self.api.project_directories()
        except ServerError as exc:
            log.warning("stream.directory_unchecked", directory=directory, error=str(exc))
            return
        if not directory_known(directory, known):
            log.warning("stream.directory_unknown", directory=directory, known=known)

    def _on_disconnect(self, reason: str) -> None:
        self._notifier.status(f"reconnecting: {reason}")
