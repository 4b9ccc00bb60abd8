"""The watch daemon: stream in, tracker decides, interventions act.

This is the asyncio shell around the pure core. It moves frames from the stream into the
tracker, hands decisions to `Interventions`, resyncs after every reconnect, tells systemd
how it is doing, and shuts down in bounded time on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import os
import signal
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO, TypeVar

import aiohttp
import structlog

from monitor import __version__
from monitor.config import Settings, guard_of, public_url
from monitor.core.budget import Budget
from monitor.core.decisions import Deadline, Intervene, Outcome, Plan
from monitor.core.frames import encode_sse
from monitor.core.plugin_protocol import ALLOW, PluginCall, PluginVerdict, RequestRefused
from monitor.core.profile import transparent_tools
from monitor.core.resync import (
    directories_to_ask,
    finished_calls,
    missed_by_stream,
)
from monitor.core.status_view import sessions_status
from monitor.core.tracker import Detection, Fed, Tracker
from monitor.errors import ConfigError, ServerError, SessionGone
from monitor.shell.acting import POLL_S as TAKEOVER_POLL_S
from monitor.shell.acting import Role
from monitor.shell.actions import Interventions, random_stagger
from monitor.shell.api import OpencodeAPI, Retry, basic_auth_header
from monitor.shell.api_v2 import EngineAPI, ServerKind
from monitor.shell.backoff import Backoff
from monitor.shell.decide import (
    UNASKED_AFTER_S,
    UNASKED_CHECK_S,
    DecideServer,
    EndpointTaken,
    PluginStats,
    Unasked,
    check_endpoint,
    plugin_endpoint,
    private_dir,
    state_dir,
)
from monitor.shell.diagnosis import directory_known
from monitor.shell.logs import LoopErrors, Throttle, lines_dropped, logging_off_the_loop
from monitor.shell.metrics import Metrics, MetricsServer, start_metrics_server, wall_time
from monitor.shell.notify import Notifier, watchdog_interval, watchdog_pings
from monitor.shell.resync import Resync, bounded
from monitor.shell.stream import (
    READ_BUFSIZE,
    READ_TIMEOUT_S,
    RECONNECT,
    EventStream,
    stream_url,
)
from monitor.shell.toast import Toasts
from monitor.shell.webhook import Delivery, Webhook

__all__ = ["Timing", "Watch", "http_session", "run_watch"]

log = structlog.get_logger("monitor.shell.watch")

# SIGTERM to exit must stay under 5 s: in-flight aborts get this long to finish.
DRAIN_S = 3.0
# Then notifications still being posted get this long (within the same 5 s).
WEBHOOK_DRAIN_S = 1.0
MALFORMED_LOG_EVERY_S = 10.0
REFUSED_LOG_EVERY_S = 10.0
# While runs are under way, a stream that brought no event but heartbeats for SILENCE_S is
# checked against the server (its busy sessions, their finished calls) every SILENCE_S / 2,
# and dropped, so resynced, when the server has what the stream did not bring. At most
# CHECK_SESSIONS_MAX sessions' messages are read per check.
SILENCE_S = 30.0
# How long a loop `attach` finds at a call's start waits for that call's end: a plugin that
# asks no monitor refuses the call by its own rule within milliseconds of its start.
OWN_REFUSAL_WAIT_S = 1.0
CHECK_SESSIONS_MAX = 64
QUIET_EVENTS = frozenset({"server.heartbeat", "server.connected"})
# Signals that must not end the daemon (their default action kills it silently, socket left
# behind): SIGHUP, what a closed terminal and many operators' "reload" send, is ignored with
# a line saying so (the settings are read once: a reload would rebuild every session's
# tracking); SIGUSR1 logs what /status says (`monitor.status`); SIGUSR2 is ignored.
HUP_IGNORED = "reloading is not offered: restart the monitor to apply changed settings"
USR2_IGNORED = "SIGUSR2 has no meaning here"
# Sessions a `monitor.status` line lists (held first, then busy): a log line stays short.
STATUS_LINE_SESSIONS = 10
# The plugin's 503 while the session's run is not known: its own rule judges the call.
NOT_FOLLOWED = "the monitor is (re)connecting and has not read this session's run yet"
# A standby refuses nothing on its own account: the plugin's own rule judges the call, the
# acting monitor sees it on the stream (monitor.shell.acting). It serves the endpoint for at
# most a poll: while a monitor without one gives it the role.
STANDBY = "the monitor is another's standby and acts on nothing; the plugin's own rule judges"


def log_fields(detection: Detection) -> dict[str, object]:
    """The detection settings as JSON-friendly log fields (names and numbers only)."""
    fields: dict[str, object] = {}
    for field in dataclasses.fields(detection):
        value = getattr(detection, field.name)
        if isinstance(value, frozenset):
            value = sorted(value)
        elif field.name == "ignore_args":
            value = {tool: sorted(keys) for tool, keys in (value or {}).items()}
        elif isinstance(value, Budget):
            value = str(value)  # `off`, or as the setting is written: `steps=200,cost=5`
        fields[field.name] = value
    return fields


T = TypeVar("T")


def http_session(settings: Settings) -> aiohttp.ClientSession:
    headers = {}
    if settings.password is not None:
        headers = basic_auth_header(settings.username, settings.password)
    return aiohttp.ClientSession(headers=headers, read_bufsize=READ_BUFSIZE)


def open_record(path: Path) -> TextIO:
    """Open the recording for appending: it holds raw tool arguments and outputs, so it is
    created readable by its owner only, and a symlink at `path` is refused rather than
    followed (it could point anywhere the monitor may write)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        reason = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"record {path}: cannot append ({reason})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"record {path}: cannot append (not a regular file)")
    return open(fd, "a", encoding="utf-8", newline="\n")


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


@dataclass(frozen=True, slots=True)
class Timing:
    """The waits and the clock of the shell; tests shorten or replace them, the defaults suit
    a real server."""

    read_timeout: float = READ_TIMEOUT_S
    reconnect: Backoff = RECONNECT
    retry: Retry = Retry()
    drain: float = DRAIN_S
    # No event (heartbeats aside) for this long while runs are under way: ask the server.
    silence: float = SILENCE_S
    webhook: Delivery = Delivery()
    # Tool calls with no plugin asking for this long: say so (`plugin.not_asking`).
    unasked: float = UNASKED_AFTER_S
    # How long `attach` waits to see whether a plugin refused a loop's call (OWN_REFUSAL_WAIT_S).
    own_refusal: float = OWN_REFUSAL_WAIT_S
    # How often a standby tries to take over from the acting monitor (monitor.shell.acting).
    takeover: float = TAKEOVER_POLL_S
    # How long the feedback waits after an abort (see monitor.shell.actions.STAGGER_S).
    stagger: Callable[[], float] = random_stagger
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic


class Scope(Protocol):
    """Which sessions a watch follows, and when following them is over."""

    @property
    def only_session(self) -> str | None:
        """The one session followed, or None for all; read once, when the watch starts."""
        ...

    async def still_there(self, api: OpencodeAPI) -> bool:
        """On every (re)connect: False when there is nothing left to follow."""
        ...

    def ended(self, fed: Fed) -> bool:
        """After a frame that deleted a session: True when there is nothing left to follow."""
        ...

    def engine(self, session_id: str) -> int:
        """The engine a session is known to run on before the stream shows it (2: the new
        one, whose actions and read-backs take the `/api` routes), else 1."""
        ...


class AllSessions:
    """The daemon's scope: every session, for ever."""

    only_session = None

    async def still_there(self, api: OpencodeAPI) -> bool:
        return True

    def ended(self, fed: Fed) -> bool:
        return False

    def engine(self, session_id: str) -> int:
        return 1


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
        self.tracker = Tracker(
            guard_of(settings),
            directory=settings.directory,
            only_session=scope.only_session,
            check_ids=True,
            # `attach` answers no plugin: one may refuse calls by its own rule meanwhile.
            own_refusal_wait=0.0 if scope.only_session is None else timing.own_refusal,
        )
        if scope.only_session is not None and scope.engine(scope.only_session) == 2:
            # `attach`'s session, looked up as the new engine's: read back and acted on by
            # its routes before its next frame says so.
            self.tracker.engine_sessions((scope.only_session,))
        self._stop = asyncio.Event()
        self._stopped_by: str | None = None  # the signal that stopped the watch, if one did
        # Calls' time bounds being waited for (`_deadline`), cancelled when watching stops.
        self._deadlines: set[asyncio.Task[None]] = set()
        self._fatal: BaseException | None = None
        self._malformed_logged_at = float("-inf")
        self._refusals = Throttle(REFUSED_LOG_EVERY_S, timing.clock)
        self._plugin_elsewhere = False
        # Whether this monitor acts or is another's standby (None: it acts, unguarded).
        self.role: Role | None = None
        self._ready_sent = False
        self._record: TextIO | None = None
        self._stream: EventStream | None = None
        self.server: ServerKind | None = None  # what the last stream that answered speaks
        self._locating: ServerKind | None = None  # what the connect under way speaks
        self._last_frame_at: float | None = None
        self._last_event_at = timing.clock()
        self.metrics: Metrics | None = None
        if settings.metrics_addr is not None:
            self.metrics = Metrics(
                connected=lambda: self._stream is not None and self._stream.connected,
                sessions=lambda: self.tracker.active_sessions,
                held=lambda: self.tracker.held_sessions,
                known=lambda: len(self.tracker.known()),
                last_frame_at=lambda: self._last_frame_at,
                clock=timing.clock,
                read_limit=timing.read_timeout,
                log_dropped=lines_dropped,
            )
        self.metrics_server: MetricsServer | None = None
        self.plugin_stats = PluginStats()
        self.plugin_server: DecideServer | None = None
        # While the endpoint is served and no plugin has asked yet.
        self._unasked: Unasked | None = None
        self.webhook: Webhook | None = None
        if settings.notify_url is not None:
            self.webhook = Webhook(settings.notify_url, timing.webhook, timing.sleep)

    async def run(self) -> int:
        self._on_signals(asyncio.get_running_loop())
        with contextlib.ExitStack() as held:
            held.enter_context(_frozen_heap())
            if self.settings.record is not None:
                self._record = held.enter_context(open_record(self.settings.record))
            if self.metrics is not None:
                self.metrics_server = await self._serve_metrics(self.metrics)
            try:
                self.role = self._take_role()
                if self.role is None or self.role.serves:
                    await self._serve_plugins()
                return await self._run()
            finally:
                if self.role is not None:
                    self.role.close()
                if self.plugin_server is not None:
                    await self.plugin_server.close()
                if self.metrics_server is not None:
                    await self.metrics_server.close()

    def stop(self) -> None:
        """Make `run` return as SIGTERM does: stop reading, let in-flight actions finish."""
        self._stop.set()

    def _on_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """SIGHUP, SIGUSR1 and SIGUSR2 logged, never fatal (see HUP_IGNORED); SIGTERM and
        SIGINT stop the watch, from `_run` on."""
        loop.add_signal_handler(signal.SIGHUP, self._ignore, "SIGHUP", HUP_IGNORED)
        loop.add_signal_handler(signal.SIGUSR2, self._ignore, "SIGUSR2", USR2_IGNORED)
        loop.add_signal_handler(signal.SIGUSR1, self.log_status)

    @staticmethod
    def _ignore(name: str, reason: str) -> None:
        log.warning("signal.ignored", signal=name, reason=reason)

    def log_status(self) -> None:
        """What /status says, as one `monitor.status` line (SIGUSR1): ids, names, counts and
        states, never an argument or a password; at most STATUS_LINE_SESSIONS sessions."""
        status = self.status()
        sessions = status["sessions"]
        assert isinstance(sessions, list)
        omitted = status["sessions_omitted"]
        assert isinstance(omitted, int)
        status["sessions"] = sessions[:STATUS_LINE_SESSIONS]
        status["sessions_omitted"] = omitted + len(sessions[STATUS_LINE_SESSIONS:])
        log.info("monitor.status", **status)

    async def _serve_metrics(self, metrics: Metrics) -> MetricsServer:
        address = self.settings.metrics_addr
        assert address is not None
        try:
            server = await start_metrics_server(
                metrics, address.host, address.port, status=self.status
            )
        except OSError as exc:
            raise ConfigError(
                f"metrics_addr {address.host}:{address.port}: cannot listen ({exc.strerror})"
            ) from None
        log.info("metrics.listening", host=address.host, port=server.port)
        return server

    def _take_role(self) -> Role | None:
        """Act, or stand by for the monitor that acts for this server (monitor.shell.acting).
        A dry run acts on nothing, so it takes no part."""
        if self.settings.dry_run:
            return None
        endpoint = self._check_endpoint()
        folder = self._roles or state_dir(os.environ)
        try:
            private_dir(folder)
        except (ConfigError, OSError) as exc:
            log.warning("monitor.unguarded", folder=str(folder), reason=str(exc))
            return None
        role = Role(folder, self.settings.url, self.scope.only_session, endpoint)
        if role.try_acting():
            log.info("monitor.acting", session_id=self.scope.only_session)
        else:
            log.warning(
                "monitor.standby",
                acting_pid=role.holder(),
                session_id=self.scope.only_session,
                message="another monitor acts for this server: this one logs the loops it "
                "finds and takes over when that one stops",
            )
        return role

    def _check_endpoint(self) -> bool:
        """Whether this watch serves the plugin endpoint; its settings are checked now, as it
        starts, whatever role it gets: a standby that cannot serve it must fail here (exit
        78), not when it takes over."""
        if self.scope.only_session is not None:
            return False  # `attach` follows one session; plugins ask the daemon
        endpoint = plugin_endpoint(self.settings, os.environ)
        if endpoint is None:
            return False
        check_endpoint(endpoint)
        return True

    async def _keep_role(self, role: Role) -> None:
        """Every poll: a standby tries to take over from the acting monitor; an acting one
        without the plugin endpoint gives the role to one with it (monitor.shell.acting).
        Serves the endpoint once this monitor holds its lock. Never returns (this task
        ending would end the watch)."""
        while True:
            # A real wait, not `timing.sleep`: tests record those as the reconnect backoff's.
            await asyncio.sleep(self.timing.takeover)
            was_acting = role.acting
            if role.give_way():
                log.warning(
                    "monitor.gave_way",
                    message="a monitor serving the plugin endpoint watches this server: it acts "
                    "from its next poll, this one stands by",
                )
            elif role.try_acting() and not was_acting:
                log.warning("monitor.took_over", session_id=self.scope.only_session)
            if role.serves and self.plugin_server is None and not self._plugin_elsewhere:
                await self._serve_plugins()

    def _role_view(self) -> dict[str, object]:
        """Whether this monitor acts (`status`): `standby` names the one that does."""
        role = self.role
        if role is None:
            return {"state": "dry run" if self.settings.dry_run else "unguarded"}
        if role.acting:
            return {"state": "acting"}
        return {"state": "standby", "acting_pid": role.holder()}

    def _acts_for(self, session_id: str) -> bool:
        return self.role is None or self.role.acts_for(session_id)

    def _acting_pid(self) -> int | None:
        return None if self.role is None else self.role.holder()

    async def _serve_plugins(self) -> None:
        endpoint = plugin_endpoint(self.settings, os.environ)
        if endpoint is None or self.scope.only_session is not None:
            return  # `attach` follows one session; plugins ask the daemon
        server = DecideServer(
            endpoint, self.judge, self._on_plugin_asked, self._on_refused, self._on_plugin_late
        )
        try:
            await server.start()
        except EndpointTaken as exc:
            # A second monitor of the same server: the first answers its plugins.
            log.warning("plugin.endpoint_taken", reason=str(exc))
            self._plugin_elsewhere = True
            return
        self.plugin_server = server
        after = self.timing.unasked
        self._unasked = Unasked(after, min(UNASKED_CHECK_S, after / 5))

    def judge(self, call: PluginCall) -> PluginVerdict | RequestRefused:
        """The plugin's question about one call: the daemon's `judge` callback."""
        if self.role is not None and not self.role.acting:
            return RequestRefused(503, STANDBY)
        resync: Resync | None = getattr(self, "resync", None)  # made once watching starts
        if resync is None or not resync.following(call.session_id, call.directory):
            # Before the first connect, or while its run may be being read back after one:
            # judged on part of its history, the loop's call was let through (a daemon
            # restarted mid-run). The plugin's own rule, which saw every call, judges it.
            return RequestRefused(503, NOT_FOLLOWED)
        judged = self.tracker.judge(call)
        decision = judged.decision
        if decision is None:
            return judged.verdict
        if self.metrics is not None and decision.plan != Plan.DEFER:
            self.metrics.loop(decision.finding.shape()[0], decision.rule)
        if judged.verdict == ALLOW or self.settings.dry_run:
            self.interventions.submit(decision)  # a nudge, or what a dry run logs
            return ALLOW
        self.interventions.blocked(decision, call.call_id)
        return judged.verdict

    def _on_plugin_asked(
        self, call: PluginCall, verdict: PluginVerdict, answered: bool = True
    ) -> None:
        label, fell_open = self.plugin_stats.asked(call, verdict, answered)
        if self.metrics is not None:
            self.metrics.plugin_asked(label, verdict.verdict, fell_open)

    def _on_plugin_late(self, call: PluginCall) -> None:
        """A request the plugin gave up on before we read it: the call ran unasked (the
        plugin counts it, and reports it with its next request); not judged."""
        log.info("plugin.late", session_id=call.session_id, tool=call.tool)
        self._on_plugin_asked(call, ALLOW, answered=False)

    def _on_refused(self, refused: RequestRefused) -> None:
        self.plugin_stats.refused += 1
        if self.metrics is not None:
            self.metrics.plugin_refused(refused.status)
        # Anyone who can connect can be refused as often as they like: one line per status
        # per interval, or they would fill the journal and push loop.detected out with it.
        count = self._refusals.due(str(refused.status))
        if count is not None:
            log.warning(
                "plugin.refused", status=refused.status, reason=refused.message, count=count
            )

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
            **log_fields(self.tracker.detection),
        )
        for warning in settings.warnings:
            log.warning("config.warning", message=warning)
        async with http_session(settings) as http:
            self.api = EngineAPI(
                http,
                settings.url,
                self.timing.retry,
                self.timing.sleep,
                engine_of=self.tracker.route,
                choice=settings.api,
            )
            self.toasts = Toasts(self.api)
            self.interventions = Interventions(
                None if settings.dry_run else self.api,
                forget=self.tracker.forget,
                on_fatal=self._fail,
                on_outcome=self._on_outcome,
                expire=self.tracker.expire,
                run_over=self.tracker.run_over,
                sleep=self.timing.sleep,
                stagger=self.timing.stagger,
                clock=self.timing.clock,
                plugin_elsewhere=self._plugin_elsewhere,
            )
            self.resync = Resync(
                self.api,
                self.tracker,
                settings,
                self.scope.only_session,
                self.interventions,
                self._carry_out,
                self._take,
                self._deadline,
            )
            stream = self._stream = EventStream(
                http,
                stream_url(settings.url, settings.directory),
                on_frame=self._on_frame,
                on_connect=self._on_connect,
                on_disconnect=self._on_disconnect,
                backoff=self.timing.reconnect,
                read_timeout=self.timing.read_timeout,
                sleep=self.timing.sleep,
                clock=self.timing.clock,
                locate=self._locate,
            )
            await self._until_stopped(stream)
            for task in self._deadlines:
                task.cancel()
            self.notifier.stopping()
            await self.interventions.drain(self.timing.drain)
            await self.toasts.close()
            if self.webhook is not None:
                await self.webhook.close(WEBHOOK_DRAIN_S)
        log.info("monitor.stopped", signal=self._stopped_by)
        if self._fatal is not None:
            raise self._fatal
        return 0

    async def _until_stopped(self, stream: EventStream) -> None:
        tasks = [
            asyncio.create_task(stream.run()),
            asyncio.create_task(self._stop.wait()),
            asyncio.create_task(self._check_silence(stream)),
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

    def _on_frame(self, data: str) -> bool:
        """Feed one frame to the tracker; True when it handed work to the executor."""
        if self._record is not None:
            self._write_record(self._record, data)
        waiting = self.resync.waiting
        if waiting is None:
            return self._take(self.tracker.feed_data(data))
        if (frame := waiting.admit(data)) is not None:
            return self._take(self.tracker.feed(frame))
        return False

    def _take(self, fed: Fed) -> bool:
        """Carry out and count what one frame fed to the tracker did; True when it handed
        work on."""
        acts = bool(fed.decisions or fed.replies)  # most frames decide nothing
        if acts:
            self._carry_out(fed)
        for deadline in fed.deadlines:
            self._deadline(deadline)
        now = self.timing.clock()
        if fed.event_type not in QUIET_EVENTS:
            self._last_event_at = now
        metrics = self.metrics
        if metrics is not None:
            self._last_frame_at = now
            metrics.frame(fed.event_type)
            if fed.malformed is not None:
                metrics.malformed()
            if fed.spent is not None:
                metrics.spent(*fed.spent)
        if fed.malformed is not None:
            self._log_malformed(fed.malformed)
        if fed.deleted is not None and self.scope.ended(fed):
            self._stop.set()
        unasked = self._unasked
        if unasked is not None and unasked.due(now):
            self._say_if_unasked(unasked, now)
        return acts

    def _say_if_unasked(self, unasked: Unasked, now: float) -> None:
        """Say once when the server runs calls and no plugin asks: the plugin silently misses
        this monitor (not installed where the server looks, or pointing elsewhere)."""
        calls = unasked.check(
            # Not the calls of new-engine sessions: 1.18 does not call a 1.x plugin for those.
            lambda: sum(
                view.calls
                for view in self.tracker.sessions_view()
                if self.tracker.adapter.engine(view.session_id) == 1
            ),
            bool(self.plugin_stats.by_directory),
            now,
        )
        if calls is not None:
            log.warning(
                "plugin.not_asking",
                endpoint=self._plugin_address(),
                calls=calls,
                hint="the server runs tool calls and no plugin asks this monitor: install the "
                "plugin where the server looks (`opencode-loop-monitor plugin install`, then "
                "restart OpenCode) with this monitor's --url; `plugin status` checks it",
            )

    def _deadline(self, deadline: Deadline) -> None:
        """Wait out a call's time bound, then ask the tracker whether the call still runs
        (`Tracker.overdue`): the core keeps no clock, the time comes from here."""
        task = asyncio.get_running_loop().create_task(self._overdue(deadline))
        self._deadlines.add(task)
        task.add_done_callback(self._deadlines.discard)

    async def _overdue(self, deadline: Deadline) -> None:
        await self.timing.sleep(deadline.wait)
        decision = self.tracker.overdue(deadline)
        if decision is not None:
            self._carry_out(Fed((decision,)))

    def _carry_out(self, fed: Fed) -> None:
        """Hand the decisions and permission answers of one frame, or of one session read
        back, to `Interventions`: every decision takes this one path (logged, counted,
        carried out)."""
        for decision in fed.decisions:
            if self._acts_for(decision.session_id):
                self.interventions.submit(decision)
                self._count_loop(decision)
            else:
                self.interventions.standby(decision, self._acting_pid())
        for reply in fed.replies:
            if self._acts_for(reply.session_id):
                self.interventions.answer(reply)
                if reply.loop is not None:
                    self._count_loop(reply.loop)
            elif reply.loop is not None:
                self.interventions.standby(reply.loop, self._acting_pid())

    def _count_loop(self, loop: Intervene) -> None:
        """A loop this monitor acts on, in `loops_detected_total`: a standby's is counted by
        the acting monitor (and here only as an `interventions_total` outcome `standby`)."""
        if self.metrics is not None and loop.plan != Plan.DEFER:  # counted once, as it is again
            self.metrics.loop(loop.finding.shape()[0], loop.rule)

    def _write_record(self, record: TextIO, data: str) -> None:
        try:
            record.write(encode_sse(data))
            # Flushed per frame: a recording that stops short of the crash it should explain
            # is worthless, and a write per frame is cheap next to the network read.
            record.flush()
        except OSError as exc:
            # A full disk must not stop the guard: recording stops, watching goes on.
            log.error("record.failed", path=str(self.settings.record), error=exc.strerror)
            self._record = None

    def _on_outcome(self, decision: Intervene, outcome: Outcome) -> None:
        self.tracker.outcome(decision, outcome)  # the core decides what a hold means
        if self.metrics is not None:
            self.metrics.intervention(outcome)
        self.toasts.show(decision, outcome)  # returns at once: posting runs apart
        # A deferred loop is the other monitor's to tell of: one notification per loop.
        if self.webhook is not None and outcome not in (Outcome.DEFERRED, Outcome.STANDBY):
            self.webhook.send(decision, outcome)  # returns at once: posting runs apart

    def last_frame_unix(self) -> float | None:
        """When the last frame came, as a Unix timestamp (the shell keeps monotonic time)."""
        if self._last_frame_at is None:
            return None
        return wall_time(self._last_frame_at, self.timing.clock(), time.time())

    def status(self) -> dict[str, object]:
        """What `opencode-loop-monitor status` shows: served as JSON on /status."""
        stream = self._stream
        if stream is not None and stream.connected:
            state = "connected"
        elif stream is not None and stream.ever_connected:
            state = "reconnecting"
        else:
            state = "connecting"
        return {
            "version": __version__,
            "url": public_url(self.settings.url),
            "directory": self.settings.directory,
            "dry_run": self.settings.dry_run,
            "role": self._role_view(),
            "stream": {
                "state": state,
                "frames": 0 if stream is None else stream.frames,
                "last_frame_unix": self.last_frame_unix(),
                # Which server the last connect found, and so which API and stream.
                "server": None if self.server is None else self.server.describe(),
            },
            **sessions_status(self.tracker.sessions_view()),
            "plugins": {
                "endpoint": None if self.plugin_server is None else self._plugin_address(),
                "refused": self.plugin_stats.refused,
                "directories": self.plugin_stats.view(),
                # Tool calls the server ran with no plugin asking (`plugin.not_asking`).
                "unasked_calls": None if self._unasked is None else self._unasked.said,
            },
        }

    def _plugin_address(self) -> str:
        assert self.plugin_server is not None
        endpoint = self.plugin_server.endpoint
        if endpoint.socket is not None:
            return f"unix:{endpoint.socket}"
        return f"http://{endpoint.host}:{self.plugin_server.port}"

    def _log_malformed(self, reason: str) -> None:
        now = self.timing.clock()
        # A broken proxy can send thousands of bad frames a second: one line per interval.
        if now - self._malformed_logged_at >= MALFORMED_LOG_EVERY_S:
            self._malformed_logged_at = now
            log.warning("frame.malformed", reason=reason, count=self.tracker.malformed_total)

    async def _locate(self) -> str:
        """Before every connect: which server this is (`--api`), and so which stream."""
        try:
            kind = await self.api.detect()
        except ServerError:
            # Down, starting or failing: the stream's own connect says so, with its hint.
            kind = self.server or self.api.server
        self._locating = kind
        self.tracker.server_routes(kind.classic)
        return stream_url(self.settings.url, self.settings.directory, api=not kind.classic)

    def _say_server(self) -> None:
        """`server.detected` once the stream of what `_locate` found has answered. Before,
        nothing shows that an OpenCode server is there: a dead port or a failed TLS handshake
        fails the health routes, and another web server answers them as a 1.x old enough to
        have none would."""
        kind, before = self._locating, self.server
        if kind is None or kind == before:
            return
        self.server = kind
        url = stream_url(self.settings.url, self.settings.directory, api=not kind.classic)
        log.info(
            "server.detected",
            server=kind.describe(),
            version=kind.version,
            classic=kind.classic,
            engine=kind.engine,
            stream=public_url(url),
            changed=before is not None,
        )

    async def _on_connect(self) -> None:
        # Before anything awaits: frames of the sessions the resync rebuilds wait for it.
        self.resync.hold()
        try:
            await self._connected()
        finally:
            self.resync.release()

    async def _connected(self) -> None:
        self._say_server()
        self._last_event_at = self.timing.clock()
        self.notifier.status("streaming events")
        if self._ready_sent and self.metrics is not None:
            self.metrics.reconnect()  # every connection after the first is a reconnect
        first = not self._ready_sent
        if first:
            self._ready_sent = True
            self.notifier.ready()
            await self._check_directory()
        # Work the server's absence left undone goes first; the resync leaves its sessions
        # to it (they are being acted on).
        self.interventions.resume()
        await self._resync(first)

    async def _check_silence(self, stream: EventStream) -> None:
        """Bound the unwatched time of a stream that stalls but stays connected (see
        SILENCE_S): the server's state says whether the silence is real."""
        timing = self.timing
        while True:
            # A real wait, not `timing.sleep`: tests record those as the reconnect backoff's.
            await asyncio.sleep(timing.silence / 2)
            if stream.connected:
                self.interventions.resume()  # due work left by a server away meanwhile
            if self._unasked is not None and not self._unasked.done:
                self._say_if_unasked(self._unasked, timing.clock())  # also when no frame comes
            running = self.tracker.running()
            silent_s = timing.clock() - self._last_event_at
            if not stream.connected or not running or silent_s < timing.silence:
                continue
            try:
                missed = await self._missed(running)
            except ServerError as exc:
                log.warning("stream.check_failed", error=str(exc))
                continue
            self._last_event_at = timing.clock()  # the next check comes a silence later
            if missed:
                log.warning("stream.stalled", sessions=missed, silent_s=round(silent_s, 1))
                stream.reconnect("stalled: the server ran what the stream did not show")

    async def _missed(self, running: dict[str, str | None]) -> list[str]:
        directories = list(directories_to_ask(running, self.settings.directory))
        busy = set().union(*await bounded(self.api.busy_sessions(d) for d in directories))
        ours = {
            view.session_id: view.run_calls
            for view in self.tracker.sessions_view()
            if view.session_id in running
        }
        ours = dict(list(ours.items())[:CHECK_SESSIONS_MAX])
        asked = [session_id for session_id in ours if session_id in busy]
        detection = self.tracker.detection
        skip = transparent_tools(detection.profile, detection.ignore_tools)

        async def finished(session_id: str) -> int:
            try:
                return finished_calls(
                    await self.api.messages(session_id, running[session_id]), skip
                )
            except SessionGone:
                return 0

        counts = await bounded(finished(session_id) for session_id in asked)
        return missed_by_stream(ours, busy, dict(zip(asked, counts, strict=True)))

    async def _check_directory(self) -> None:
        """Warn once, at the first connect, when --directory names no project the server has.

        A warning, not an exit: a project appears when someone first opens it, which may be
        after the monitor starts (at boot, under systemd).
        """
        directory = self.settings.directory
        if directory is None or self.scope.only_session is not None:
            return
        try:
            known = await self.api.project_directories()
        except ServerError as exc:
            log.warning("stream.directory_unchecked", directory=directory, error=str(exc))
            return
        if not directory_known(directory, known):
            log.warning("stream.directory_unknown", directory=directory, known=known)

    def _on_disconnect(self, reason: str) -> None:
        self.notifier.status(f"reconnecting: {reason}")

    async def _resync(self, first: bool) -> None:
        """Events missed while away are gone: rebuild every run from the server's record
        (`monitor.shell.resync`), unless the followed session is gone."""
        if not await self.scope.still_there(self.api):
            self._stop.set()
            return
        await self.resync.run(first)
