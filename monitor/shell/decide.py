"""The decision endpoint: where the OpenCode plugin asks whether a tool call may run.

`POST /v1/decide` (monitor.core.plugin_protocol) on a Unix socket only its owner can open
(mode 0600 in a 0700 folder), or on loopback TCP with a bearer token from a file. Judging
is a synchronous call of the `judge` callback, so a request never waits on the event stream
and the stream never waits on a request.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from monitor.config import Settings, is_loopback
from monitor.core.plugin_protocol import (
    ALLOW,
    DECIDE_PATH,
    MAX_BODY,
    FellOpen,
    PluginCall,
    PluginVerdict,
    RequestRefused,
    check_head,
    read_body,
    too_large,
)
from monitor.errors import ConfigError

log = structlog.get_logger("monitor.shell.decide")

Judge = Callable[[PluginCall], PluginVerdict]

# sockaddr_un holds 108 bytes with the final NUL.
MAX_SOCKET_PATH = 107
# Directories counted apart in status and metrics; more than this many projects share "other".
MAX_DIRECTORIES = 64


class EndpointTaken(ConfigError):
    """A live monitor serves plugins on this socket already (a second monitor of one server)."""


@dataclass(frozen=True, slots=True)
class PluginEndpoint:
    """Where the daemon serves plugins and what a plugin needs to reach it."""

    socket: Path | None
    host: str | None = None
    port: int | None = None
    token_file: Path | None = None

    @property
    def url(self) -> str:
        """What the plugin fetches (with `unix: socket` when there is one)."""
        if self.socket is not None:
            return f"http://localhost{DECIDE_PATH}"
        host = f"[{self.host}]" if self.host is not None and ":" in self.host else self.host
        return f"http://{host}:{self.port}{DECIDE_PATH}"


def state_dir(environ: Mapping[str, str]) -> Path:
    """Where the monitor keeps its sockets: $XDG_RUNTIME_DIR (private, per login) when set,
    else the XDG state folder."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "opencode-loop-monitor"
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "opencode-loop-monitor"


def plugin_endpoint(settings: Settings, environ: Mapping[str, str]) -> PluginEndpoint | None:
    """The endpoint the settings ask for; None when it is off. Raises ConfigError."""
    address = settings.plugin_addr
    if address is not None:
        if not is_loopback(address.host):
            raise ConfigError(
                f"plugin_addr {address.host}:{address.port}: only loopback addresses are served"
            )
        if settings.plugin_token_file is None:
            raise ConfigError("plugin_addr needs plugin_token_file (the token plugins send)")
        return PluginEndpoint(None, address.host, address.port, settings.plugin_token_file)
    if settings.plugin_socket == "off":
        return None
    if settings.plugin_socket == "auto":
        # One socket per server watched: two monitors of two servers must not share one.
        digest = hashlib.sha256(settings.url.encode()).hexdigest()[:12]
        path = state_dir(environ) / f"plugin-{digest}.sock"
    else:
        path = Path(settings.plugin_socket)
        if not path.is_absolute():
            raise ConfigError(f"plugin_socket {path}: must be an absolute path, auto or off")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"plugin_socket {path}: longer than {MAX_SOCKET_PATH} bytes, which a Unix socket "
            "cannot have; set a shorter --plugin-socket"
        )
    return PluginEndpoint(path)


def read_or_create_token(path: Path) -> str:
    """The token in `path`; a new one, written readable by its owner only, if there is none."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(f"plugin_token_file {path}: cannot create ({exc.strerror})") from None
        with open(fd, "w", encoding="utf-8") as file:
            file.write(token + "\n")
        return token
    except OSError as exc:
        raise ConfigError(f"plugin_token_file {path}: cannot read ({exc.strerror})") from None
    if not token:
        raise ConfigError(f"plugin_token_file {path}: is empty")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"plugin_token_file {path}: readable by others (chmod 600 it)")
    return token


def private_dir(path: Path) -> None:
    """Make `path` (the socket's folder) or check it: ours, and closed to everyone else."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ConfigError(
            f"plugin_socket folder {path}: must belong to this user and be closed to others "
            "(chmod 700)"
        )


def clear_stale_socket(path: Path) -> None:
    """Remove a socket a crashed monitor left; refuse one a live monitor serves."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConfigError(f"plugin_socket {path}: exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise EndpointTaken(f"plugin_socket {path}: another monitor serves plugins there")


class PluginStats:
    """What plugins asked, per server directory: for `status` and the metrics."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.by_directory: dict[str, dict[str, float]] = {}
        self.refused = 0
        self._fell_open = FellOpen(MAX_DIRECTORIES)

    def label(self, directory: str) -> str:
        if directory in self.by_directory or len(self.by_directory) < MAX_DIRECTORIES:
            return directory
        return "other"

    def asked(
        self, call: PluginCall, verdict: PluginVerdict, answered: bool = True
    ) -> tuple[str, int]:
        """Count one request (`answered`: the plugin still waits for the answer); the
        directory label it was counted under, and the calls newly fallen open it reported."""
        label = self.label(call.directory)
        fell_open = self._fell_open.count(label, call.fell_open, answered)
        entry = self.by_directory.setdefault(
            label, {"requests": 0, "blocked": 0, "fell_open": 0, "last_request_unix": 0.0}
        )
        entry["requests"] += 1
        entry["blocked"] += verdict.verdict == "block"
        entry["fell_open"] += fell_open
        entry["last_request_unix"] = self._clock()
        return label, fell_open

    def view(self) -> list[dict[str, object]]:
        return [{"directory": name, **entry} for name, entry in self.by_directory.items()]


class DecideServer:
    """Serves `POST /v1/decide`; `judge` answers, `on_asked` counts (both synchronous)."""

    def __init__(
        self,
        endpoint: PluginEndpoint,
        judge: Judge,
        on_asked: Callable[[PluginCall, PluginVerdict], None],
        on_refused: Callable[[RequestRefused], None],
        on_late: Callable[[PluginCall], None] = lambda call: None,
    ) -> None:
        self.endpoint = endpoint
        self._judge = judge
        self._on_asked = on_asked
        self._on_refused = on_refused
        self._on_late = on_late
        self._token: str | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        endpoint = self.endpoint
        # aiohttp refuses bodies over client_max_size itself; the handler turns that into
        # our JSON 413.
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            if endpoint.socket is not None:
                await self._start_unix(runner, endpoint.socket)
            else:
                assert endpoint.token_file is not None and endpoint.host is not None
                self._token = read_or_create_token(endpoint.token_file)
                site = web.TCPSite(runner, endpoint.host, endpoint.port, reuse_address=True)
                await site.start()
                self.port = runner.addresses[0][1]
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"plugin endpoint: cannot listen ({exc.strerror})") from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("plugin.listening", socket=str(endpoint.socket), port=self.port)

    async def _start_unix(self, runner: web.AppRunner, path: Path) -> None:
        private_dir(path.parent)
        clear_stale_socket(path)
        # Created 0600 from the start: a chmod after bind leaves a moment open to others.
        old = os.umask(0o177)
        try:
            await web.UnixSite(runner, str(path)).start()
        finally:
            os.umask(old)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await runner.cleanup()
        if self.endpoint.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.endpoint.socket.unlink()

    async def _handle(self, request: web.Request) -> web.Response:
        refused = check_head(request.method, request.path, request.headers, self._token)
        if refused is None:
            if request.content_length is not None and request.content_length > MAX_BODY:
                refused = too_large()
            else:
                try:
                    body = await request.read()
                except web.HTTPRequestEntityTooLarge:
                    refused = too_large()
                else:
                    parsed = read_body(body)
                    if isinstance(parsed, PluginCall) and _gone(request):
                        # The plugin gave up waiting (we were stalled): the call ran, and
                        # judging it now would act on a run that went on without us.
                        self._on_late(parsed)
                        return web.json_response(ALLOW.to_json())
                    if isinstance(parsed, PluginCall):
                        return self._answer(parsed)
                    refused = parsed
        self._on_refused(refused)
        return web.json_response(refused.to_json(), status=refused.status)

    def _answer(self, call: PluginCall) -> web.Response:
        try:
            verdict = self._judge(call)
        except Exception:
            # A bug of ours must not stop the server's calls: the plugin lets this one run.
            log.exception("plugin.judge_failed", session_id=call.session_id, tool=call.tool)
            refused = RequestRefused(500, "the monitor failed to judge this call")
            return web.json_response(refused.to_json(), status=500)
        self._on_asked(call, verdict)
        return web.json_response(verdict.to_json())


def _gone(request: web.Request) -> bool:
    """Whether the client closed its connection before we answered: the plugin waits at
    most its WAIT_MS, then lets the call run and drops the request."""
    transport = request.transport
    return transport is None or transport.is_closing()
