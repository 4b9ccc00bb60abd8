"""The watch daemon: bytes in, `Monitor` decides, its commands carried out.

This is the asyncio shell around the pure core: it feeds every frame and every plugin
question to `Monitor` and runs the commands it returns (an intervention begun by
`Interventions`, a permission request answered, a metric, a log line, a timer), resyncs
after every reconnect, tells systemd how it is doing, and shuts down in bounded time on
SIGTERM or SIGINT. It decides nothing (tests/test_layers.py checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from monitor import __version__
from monitor.config import Settings, guard_of, public_url
from monitor.core.detection import log_fields
from monitor.core.monitor import Monitor
from monitor.core.status_view import sessions_status
from monitor.core.tracker import Tracker
from monitor.errors import ConfigError
from monitor.shell.acting import Role, poll_role, role_view, take_role
from monitor.shell.api import http_session
from monitor.shell.endpoint import PluginEndpoint, check_endpoint, plugin_endpoint, state_dir
from monitor.shell.executor import Executor
from monitor.shell.follow import Follow
from monitor.shell.logs import LoopErrors, lines_dropped, logging_off_the_loop
from monitor.shell.metrics import Metrics, wall_time
from monitor.shell.metrics_server import MetricsServer, serve_metrics
from monitor.shell.notify import Notifier, watchdog_interval, watchdog_pings
from monitor.shell.plugin_file import shipped_version
from monitor.shell.plugin_service import PluginService
from monitor.shell.record import Recorder, open_record
from monitor.shell.signals import catch_signals
from monitor.shell.timing import AllSessions, Scope, Timing
from monitor.shell.webhook import Webhook

__all__ = ["Watch", "run_watch"]

log = structlog.get_logger("monitor.shell.watch")

# After the interventions' drain (`Timing.drain`), notifications still being posted get this
# long (within the same 5 s).
WEBHOOK_DRAIN_S = 1.0


def run_watch(settings: Settings) -> int:
    with logging_off_the_loop(settings.log_format, settings.log_level):
        return asyncio.run(Watch(settings).run())


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Everything made before the run (modules, settings, the tracker) out of the collector's
    sight while it lasts: a full collection otherwise walked all of it, a pause of about 35 ms
    on the stream (`bench.throughput`), for none of it is garbage."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # a test process runs many watches: leave nothing held for ever


class Watch:
    def __init__(
        self,
        settings: Settings,
        notifier: Notifier | None = None,
        timing: Timing = Timing(),
        scope: Scope = AllSessions(),
        roles: Path | None = None,
    ) -> None:
        self.settings = settings
        # Where the monitors of this server mark which one acts (monitor.shell.acting).
        self._roles = roles
        self.timing = timing
        self.scope = scope
        self.notifier = notifier or Notifier.from_environ()
        self._detection = guard_of(settings)
        # The one place the shell names the tracker: it makes the core `Monitor` wraps.
        tracker = Tracker(
            self._detection,
            directory=settings.directory,
            only_session=scope.only_session,
            check_ids=True,
            # `attach` answers no plugin: one may refuse calls by its own rule meanwhile.
            own_refusal_wait=0.0 if scope.only_session is None else timing.own_refusal,
        )
        self.monitor = Monitor(tracker, settings.dry_run, scope.only_session)
        if scope.only_session is not None:
            self.monitor.engine_known(scope.only_session, scope.found_engine)
        self._stop = asyncio.Event()
        self._stopped_by: str | None = None  # the signal that stopped the watch, if one did
        self._fatal: BaseException | None = None
        # Whether this monitor acts or is another's standby (None: it acts, unguarded).
        self.role: Role | None = None
        self._recorder: Recorder | None = None
        self.follow: Follow | None = None  # made once watching starts
        self.metrics: Metrics | None = None
        if settings.metrics_addr is not None:
            self.metrics = Metrics(
                connected=lambda: self.follow is not None and self.follow.stream.connected,
                sessions=self.monitor.active_sessions,
                held=self.monitor.held_sessions,
                known=lambda: len(self.monitor.known()),
                last_frame_at=lambda: None if self.follow is None else self.follow.last_frame_at,
                clock=timing.clock,
                read_limit=timing.read_timeout,
                log_dropped=lines_dropped,
            )
        self.metrics_server: MetricsServer | None = None
        self.webhook: Webhook | None = None
        if settings.notify_url is not None:
            self.webhook = Webhook(settings.notify_url, timing.webhook, timing.sleep)
        self._execute = Executor(self.metrics, self.webhook, self._stop.set)
        self.plugins = PluginService(self.monitor, self._execute, self._following, timing.clock)

    async def run(self) -> int:
        catch_signals(asyncio.get_running_loop(), self.status)
        with contextlib.ExitStack() as held:
            held.enter_context(_frozen_heap())
            if self.settings.record is not None:
                record = held.enter_context(open_record(self.settings.record))
                self._recorder = Recorder(self.settings.record, record)
            address = self.settings.metrics_addr
            if self.metrics is not None and address is not None:
                self.metrics_server = await serve_metrics(self.metrics, address, self.status)
            try:
                self._take_role()
                if self.role is None or self.role.serves:
                    await self._serve_plugins()
                return await self._run()
            finally:
                if self.role is not None:
                    self.role.close()
                await self.plugins.close()
                if self.metrics_server is not None:
                    await self.metrics_server.close()

    def stop(self) -> None:
        """Make `run` return as SIGTERM does: stop reading, let in-flight actions finish."""
        self._stop.set()

    def _endpoint(self) -> PluginEndpoint | None:
        """The plugin endpoint this watch serves; None for `attach` (plugins ask the daemon)."""
        if self.scope.only_session is not None:
            return None
        return plugin_endpoint(self.settings, os.environ)

    def _take_role(self) -> None:
        """Act, or stand by for the monitor that acts for this server (monitor.shell.acting).
        A dry run acts on nothing, so it takes no part. The endpoint's settings are checked
        now, whatever role comes: a standby that cannot serve it must fail here (exit 78),
        not when it takes over."""
        if self.settings.dry_run:
            return
        endpoint = self._endpoint()
        if endpoint is not None:
            check_endpoint(endpoint)
        folder = self._roles or state_dir(os.environ)
        only = self.scope.only_session
        self.role = take_role(folder, self.settings.url, only, endpoint is not None)
        if self.role is not None:
            self._tell_role(self.role)

    async def _keep_role(self, role: Role) -> None:
        """Every poll (`poll_role`); serves the endpoint once this monitor holds its lock.
        Never returns (this task ending would end the watch)."""
        while True:
            # A real wait, not `timing.sleep`: tests record those as the reconnect backoff's.
            await asyncio.sleep(self.timing.takeover)
            poll_role(role, self.scope.only_session)
            self._tell_role(role)
            plugins = self.plugins
            if role.serves and plugins.server is None and not plugins.elsewhere:
                await self._serve_plugins()

    def _tell_role(self, role: Role) -> None:
        """What the lock says, to `Monitor`, the one that decides whether a loop is acted on
        here: whether this monitor acts, the pid the server's lock names, and the sessions
        an `attach` acts for."""
        self.monitor.role(role.acting, role.holder(), role.attached())

    async def _serve_plugins(self) -> None:
        endpoint = self._endpoint()
        if endpoint is not None:
            await self.plugins.start(endpoint, self.timing.unasked)

    def _following(self, session_id: str, directory: str | None) -> bool:
        follow = self.follow
        return follow is not None and follow.resync.following(session_id, directory)

    async def _run(self) -> int:
        settings = self.settings
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop_by, signum.name)
        loop.set_exception_handler(LoopErrors())
        log.info(
            "monitor.started",
            version=__version__,
            url=public_url(settings.url),
            directory=settings.directory,
            dry_run=settings.dry_run,
            **log_fields(self._detection),
        )
        for warning in settings.warnings:
            log.warning("config.warning", message=warning)
        async with http_session(settings) as http:
            follow = self.follow = Follow(
                http,
                settings,
                self.timing,
                self.scope,
                self.monitor,
                self._execute,
                self.notifier,
                self.metrics,
                self._recorder,
                self.plugins.elsewhere,
                self._stop.set,
                self._fail,
                self.plugins.server_pid,
            )
            await self._until_stopped(follow)
            await follow.finish()
            if self.webhook is not None:
                await self.webhook.close(WEBHOOK_DRAIN_S)
        if self._fatal is not None:
            # The stop's cause on its own line, before the command says it again on stderr.
            log.error("monitor.stopped", signal=self._stopped_by, error=str(self._fatal))
            raise self._fatal
        log.info("monitor.stopped", signal=self._stopped_by)
        return 0

    async def _until_stopped(self, follow: Follow) -> None:
        tasks = [
            asyncio.create_task(follow.stream.run()),
            asyncio.create_task(self._stop.wait()),
            asyncio.create_task(follow.every_half_silence()),
        ]
        if self.role is not None:
            tasks.append(asyncio.create_task(self._keep_role(self.role)))
        interval = watchdog_interval()
        if interval is not None:
            tasks.append(asyncio.create_task(watchdog_pings(self.notifier, interval)))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and isinstance(task.exception(), ConfigError):
                self._fatal = task.exception()

    def _stop_by(self, name: str) -> None:
        self._stopped_by = name
        self._stop.set()

    def _fail(self, exc: BaseException) -> None:
        self._fatal = exc
        self._stop.set()

    def last_frame_unix(self) -> float | None:
        """When the last frame came, as a Unix timestamp (the shell keeps monotonic time)."""
        at = None if self.follow is None else self.follow.last_frame_at
        return None if at is None else wall_time(at, self.timing.clock(), time.time())

    def status(self) -> dict[str, object]:
        """What `opencode-loop-monitor status` shows: served as JSON on /status."""
        follow = self.follow
        stream = None if follow is None else follow.stream
        if stream is not None and stream.connected:
            state = "connected"
        elif stream is not None and stream.ever_connected:
            state = "reconnecting"
        else:
            state = "connecting"
        stats, unasked = self.monitor.plugin_stats, self.monitor.unasked
        server = None if follow is None else follow.locator.server
        return {
            "version": __version__,
            "url": public_url(self.settings.url if follow is None else follow.locator.url),
            "directory": self.settings.directory,
            "dry_run": self.settings.dry_run,
            "role": role_view(self.role, self.settings.dry_run),
            "stream": {
                "state": state,
                "frames": 0 if stream is None else stream.frames,
                "last_frame_unix": self.last_frame_unix(),
                # Which server the last connect found, and so which API and stream.
                "server": None if server is None else server.describe(),
            },
            **sessions_status(self.monitor.sessions_view()),
            "plugins": {
                "endpoint": self.plugins.address(),
                "refused": stats.refused,
                "directories": stats.view(),
                "version": shipped_version(),  # what a plugin of this release says
                # Tool calls the server ran with no plugin asking (`plugin.not_asking`).
                "unasked_calls": None if unasked is None else unasked.said,
            },
        }
