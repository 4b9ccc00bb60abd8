"""The decision endpoint: where the OpenCode plugin asks whether a tool call may run.

`POST /v1/decide` (monitor.core.plugin_protocol) on a Unix socket only its owner can open
(mode 0600 in a 0700 folder), or on loopback TCP with a token from a file that signs each
question and proves each answer (monitor.core.plugin_protocol). Judging
is a synchronous call of the `judge` callback, so a request never waits on the event stream
and the stream never waits on a request.

On TCP any local user can connect, token or not, so the server has the limits of
monitor.shell.listener: at most MAX_CONNECTIONS open (far below the 1,024 descriptors of a
process started by hand, and the 8,192 the units set), a head within IDLE_S of the
connection's start or of the previous answer, a body within BODY_S, an idle connection
closed after IDLE_S; a refused request's connection is closed after the answer, so a
wrong token costs a new connection each time. A connection over the cap pushes out the
oldest one that has not made an authorised request, never the plugin's once it has. What
stays possible: a neighbour opening connections fast enough pushes out (or, with the
kernel's accept queue full, delays) the plugin's new ones, and its calls fail open (they run
unjudged; the stream still catches the loop); the owner-only Unix socket has no neighbour.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from monitor.config import Settings, is_loopback
from monitor.core.findings import clean_tool_name
from monitor.core.plugin_protocol import (
    ALLOW,
    DECIDE_PATH,
    MAX_BODY,
    PROOF_HEADER,
    FellOpen,
    Nonces,
    PluginCall,
    PluginVerdict,
    RequestRefused,
    Signature,
    answer_proof,
    check_head,
    check_signature,
    read_body,
    signed,
    too_large,
)
from monitor.errors import ConfigError
from monitor.shell.listener import Limits, Listening, listen_tcp, listen_unix, trust

__all__ = [
    "DecideServer",
    "EndpointTaken",
    "MAX_CONNECTIONS",
    "PluginEndpoint",
    "PluginStats",
    "UNASKED_AFTER_S",
    "UNASKED_CHECK_S",
    "Unasked",
    "check_endpoint",
    "open_folder",
    "plugin_endpoint",
    "private_dir",
    "read_or_create_token",
    "socket_name",
    "state_dir",
]

log = structlog.get_logger("monitor.shell.decide")

# The verdict, or why the daemon cannot judge the call now (the plugin's own rule then does).
Judge = Callable[[PluginCall], PluginVerdict | RequestRefused]

# sockaddr_un holds 108 bytes with the final NUL.
MAX_SOCKET_PATH = 107
# Directories counted apart in status and metrics; more than this many projects share "other".
MAX_DIRECTORIES = 64
# How a directory is labelled in status and metrics (cut like everywhere else it leaves us).
DIRECTORY_MAX = 256
# The plugin of one server opens a connection per call under way at once (Bun's fetch pool).
MAX_CONNECTIONS = 128
IDLE_S = 5.0
BODY_S = 5.0
# A request line and each header: the path and a bearer token are short.
MAX_LINE = 4096
# What is read and dropped of a body over MAX_BODY so that its client reads the 413: the
# biggest file a model writes in one call, with room to spare. Past it, the connection is
# reset (the call runs unjudged: the plugin's own rule decides).
DRAIN_MAX = 64 * MAX_BODY


class EndpointTaken(ConfigError):
    """A live monitor serves plugins on this socket already (a second monitor of one server)."""


@dataclass(frozen=True, slots=True)
class PluginEndpoint:
    """Where the daemon serves plugins and what a plugin needs to reach it."""

    socket: Path | None
    host: str | None = None
    port: int | None = None
    token_file: Path | None = None
    # With plugin_socket auto: the folder holding one socket per server port (socket_name),
    # where a plugin finds the one of the server it runs in.
    socket_dir: Path | None = None

    @property
    def url(self) -> str:
        """What the plugin fetches (with `unix: socket` when there is one)."""
        if self.socket is not None:
            return f"http://localhost{DECIDE_PATH}"
        host = f"[{self.host}]" if self.host is not None and ":" in self.host else self.host
        return f"http://{host}:{self.port}{DECIDE_PATH}"


def state_dir(environ: Mapping[str, str]) -> Path:
    """Where the monitor keeps its sockets.

    A folder its service manager made for it comes first: a sandboxed service has no writable
    home. systemd's `RuntimeDirectory=` in a user unit is $XDG_RUNTIME_DIR/opencode-loop-monitor,
    the folder a person's shell derives next, so `plugin install` and the unit agree. Then
    $XDG_RUNTIME_DIR (private, per login), then `StateDirectory=`, else the XDG state folder.
    """
    runtime = _given(environ, "RUNTIME_DIRECTORY")
    if runtime is not None:
        return runtime
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "opencode-loop-monitor"
    state = _given(environ, "STATE_DIRECTORY")
    if state is not None:
        return state
    home = environ.get("HOME") or str(Path.home())
    home_state = environ.get("XDG_STATE_HOME") or str(Path(home) / ".local" / "state")
    return Path(home_state) / "opencode-loop-monitor"


def _given(environ: Mapping[str, str], name: str) -> Path | None:
    """The first folder systemd names in `name` (one per folder the unit lists, ":"-joined)."""
    first = environ.get(name, "").split(":")[0]
    return Path(first) if first else None


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
    folder = None
    if settings.plugin_socket == "auto":
        folder = state_dir(environ)
        path = folder / socket_name(settings.url)
    else:
        path = Path(settings.plugin_socket)
        if not path.is_absolute():
            raise ConfigError(f"plugin_socket {path}: must be an absolute path, auto or off")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"plugin_socket {path}: longer than {MAX_SOCKET_PATH} bytes, which a Unix socket "
            "cannot have; set a shorter --plugin-socket"
        )
    return PluginEndpoint(path, socket_dir=folder)


def socket_name(url: str) -> str:
    """The socket of the monitor of the server at `url`, named by its port: two monitors of
    two servers never share one, and the plugin, which knows the URL its server listens on,
    names the same one however the monitor was given the host (loop-guard.ts socketFor)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"plugin-{port}.sock"


# A token is a few dozen characters; a larger file is not one we wrote.
MAX_TOKEN_FILE = 4096


def read_or_create_token(path: Path) -> str:
    """The token in `path`; a new one, written readable by its owner only, if there is none
    or the file is empty (what a crash or a full disk left before the token was written
    whole: refusing to start over it needed a person to delete it).

    The file must be ours and closed to others, and is opened without following a link: a
    token someone else can read, write or point us to is one they know (a daemon run as root
    can read any user's file, so the mode alone does not say it is ours).
    """
    try:
        # O_NONBLOCK: a FIFO planted in its place must not hang the start.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return _new_token(path, replace=False)
    except OSError as exc:
        # ELOOP: a symbolic link, which O_NOFOLLOW refuses to open.
        raise ConfigError(f"plugin_token_file {path}: cannot read ({exc.strerror})") from None
    with open(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"plugin_token_file {path}: not a regular file")
        if info.st_uid != os.geteuid():
            raise ConfigError(
                f"plugin_token_file {path}: belongs to another user (uid {info.st_uid}), who "
                "knows the token; use a file of this user's"
            )
        if info.st_mode & 0o077:
            raise ConfigError(f"plugin_token_file {path}: open to others (chmod 600 it)")
        raw = file.read(MAX_TOKEN_FILE + 1)
    if not raw.strip():
        return _new_token(path, replace=True)
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        token = ""
    if not token or len(raw) > MAX_TOKEN_FILE:
        raise ConfigError(f"plugin_token_file {path}: is not a token (nor empty, to be replaced)")
    return token


def _new_token(path: Path, replace: bool) -> str:
    """A new token written to `path` whole or not at all: into a temporary file of ours in
    the same folder, then put in place. A new file is linked in (never over a token another
    process, the daemon or `plugin install`, wrote meanwhile: then that one is read); an
    empty one is replaced."""
    token = secrets.token_urlsafe(32)
    try:
        write_whole(path, (token + "\n").encode("ascii"), 0o600, replace=replace)
    except FileExistsError:
        return read_or_create_token(path)
    except OSError as exc:
        raise ConfigError(
            f"plugin_token_file {path}: cannot write ({exc.strerror}); nothing was left there"
        ) from None
    return token


def write_whole(path: Path, data: bytes, mode: int, replace: bool) -> None:
    """Put `data` at `path` only once all of it is on disk: a full disk or a crash leaves
    the old file (or none), never a part. Written to a temporary name created exclusively
    and never through a link, then renamed over `path` (`replace`) or hard-linked to it
    (FileExistsError when there is a file already)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            # Written is not stored: a full disk can still refuse the blocks at close.
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def private_dir(path: Path) -> None:
    """Make `path` (the socket's folder) or check it: ours, and closed to everyone else."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    refused = open_folder(path)
    if refused is not None:
        raise ConfigError(refused)


def check_endpoint(endpoint: PluginEndpoint) -> str | None:
    """What serving `endpoint` needs of the file system, checked: its socket's folder made or
    found ours and closed to others, or its token file ours and closed (read, or written).
    The token (None on a socket); raises ConfigError. Run by every `watch` with an endpoint
    as it starts, also a standby, which serves it only later: a setting it cannot serve
    with ends it then (exit 78), not when the acting monitor stops."""
    if endpoint.socket is None:
        assert endpoint.token_file is not None
        return read_or_create_token(endpoint.token_file)
    try:
        private_dir(endpoint.socket.parent)
    except OSError as exc:
        raise ConfigError(f"plugin endpoint: cannot listen ({exc.strerror})") from None
    return None


def open_folder(path: Path) -> str | None:
    """Why the socket folder `path` cannot be trusted, or None: another user who can write
    there can put a socket of theirs in place of the monitor's, and the plugin would ask it
    (and show the model whatever it answers). Checked by the daemon before it listens and by
    `plugin install` before it points the plugin there (loop-guard.ts checks it too)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"plugin_socket folder {path}: cannot check it ({exc.strerror})"
    advice = "use a folder of this user's closed to others (chmod 700), or plugin_socket auto"
    if not stat.S_ISDIR(info.st_mode):
        return f"plugin_socket folder {path}: not a folder; {advice}"
    if info.st_uid != os.getuid():
        return (
            f"plugin_socket folder {path}: belongs to another user (uid {info.st_uid}), who "
            f"could put a socket there that the plugin would ask; {advice}"
        )
    if info.st_mode & 0o077:
        return (
            f"plugin_socket folder {path}: others can open it (mode {stat.S_IMODE(info.st_mode):o})"
            f", and whoever can write there could put a socket that the plugin would ask; {advice}"
        )
    return None


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

    def label(self, directory: str | None) -> str:
        # Cleaned: a label Prometheus cannot encode (a lone surrogate) would break /metrics.
        # Not a path: no project's directory is called so.
        label = "unknown" if directory is None else clean_tool_name(directory, DIRECTORY_MAX)
        if label in self.by_directory or len(self.by_directory) < MAX_DIRECTORIES:
            return label
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


# How long the server may run tool calls with no plugin asking before `watch` says so. The
# plugin asks before each call, or lets it run after at most 200 ms: seconds are no race.
UNASKED_AFTER_S = 5.0
# How often, at most, the calls are counted while waiting for a plugin's first request.
UNASKED_CHECK_S = 1.0


class Unasked:
    """Whether the server runs tool calls while no plugin asks this monitor: the plugin not
    installed where the server looks, or asking another endpoint. `check` says it once.

    Only calls that come after the first check count: the calls read back from the server's
    record at connect ran before this monitor could be asked.

    | state    | input                                   | next     | says |
    |----------|-----------------------------------------|----------|------|
    | any      | a plugin asked                          | done     | no   |
    | start    | first check: the calls so far           | waiting  | no   |
    | waiting  | more calls than at the first check      | counting | no   |
    | counting | `after` s since those calls were seen   | done     | yes  |
    """

    def __init__(self, after: float = UNASKED_AFTER_S, every: float = UNASKED_CHECK_S) -> None:
        self._after = after
        self._every = every
        self._checked_at = float("-inf")
        self._baseline: int | None = None
        self._calls_since: float | None = None
        self.done = False
        # The calls it said ran with no plugin asking; None until it says so.
        self.said: int | None = None

    def due(self, now: float) -> bool:
        """Whether `check` has anything to do at `now`: asked on every frame, so it is
        cheap, and `check` (which counts every call) runs at most once per `every`."""
        return not self.done and now - self._checked_at >= self._every

    def check(self, calls: Callable[[], int], asked: bool, now: float) -> int | None:
        """The calls seen since the first check, once, when it is time to say no plugin
        asks; else None. `calls` counts every call known (it walks every session)."""
        if self.done:
            return None
        if asked:
            self.done = True
            return None
        if now - self._checked_at < self._every:
            return None
        self._checked_at = now
        if self._baseline is None:
            self._baseline = calls()
            return None
        seen = calls() - self._baseline
        if seen <= 0:
            return None
        if self._calls_since is None:
            self._calls_since = now
        if now - self._calls_since < self._after:
            return None
        self.done = True
        self.said = seen
        return seen


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
        self._nonces = Nonces()
        self._unusable_said: set[str] = set()  # the fields `plugin.report_unusable` named
        self._runner: web.AppRunner | None = None
        self._listening: Listening | None = None
        self.port: int | None = None

    async def start(self) -> None:
        endpoint = self.endpoint
        # aiohttp refuses bodies over client_max_size itself; the handler turns that into
        # our JSON 413.
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        limits = Limits(MAX_CONNECTIONS, IDLE_S, MAX_LINE, self._over_the_cap)
        try:
            self._token = check_endpoint(endpoint)
            if endpoint.socket is not None:
                clear_stale_socket(endpoint.socket)
                self._listening = await listen_unix(runner, limits, endpoint.socket)
            else:
                assert endpoint.host is not None and endpoint.port is not None
                self._listening = await listen_tcp(runner, limits, endpoint.host, endpoint.port)
                self.port = self._listening.server.sockets[0].getsockname()[1]
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"plugin endpoint: cannot listen ({exc.strerror})") from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("plugin.listening", socket=str(endpoint.socket), port=self.port)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._listening is not None:
            self._listening.close()
        await runner.cleanup()
        if self.endpoint.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.endpoint.socket.unlink()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        refused = check_head(request.method, request.path, request.headers, self._token)
        if refused is None:
            if request.content_length is not None and request.content_length > MAX_BODY:
                return await self._too_large(request)
            try:
                async with asyncio.timeout(BODY_S):
                    body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return await self._too_large(request)
            except TimeoutError:
                refused = RequestRefused(408, f"request body not received within {BODY_S:g} s")
            else:
                signature = self._signature(request)
                parsed = self._authentic(signature, body) or read_body(body)
                if isinstance(parsed, PluginCall) and _gone(request):
                    # The plugin gave up waiting (we were stalled): the call ran, and
                    # judging it now would act on a run that went on without us.
                    self._on_late(parsed)
                    return self._proven(web.json_response(ALLOW.to_json()), signature)
                if isinstance(parsed, PluginCall):
                    self._say_unusable(parsed)
                    trust(request)
                    return self._proven(self._answer(parsed), signature)
                refused = parsed
        self._on_refused(refused)
        answer = web.json_response(refused.to_json(), status=refused.status)
        # Closed after the answer: a client that is refused cannot go on asking for free on
        # a kept-alive connection (another user's flood of wrong tokens, say).
        answer.force_close()
        return answer

    def _say_unusable(self, call: PluginCall) -> None:
        """Log once per field that a plugin sends one it cannot use (taken as unknown, the
        call judged all the same): a plugin of another version, or a bug of its, to be
        fixed there; every question would repeat it."""
        new = [name for name in call.unusable if name not in self._unusable_said]
        if new:
            self._unusable_said.update(new)
            log.warning("plugin.report_unusable", fields=new, session_id=call.session_id)

    def _signature(self, request: web.Request) -> Signature | None:
        if self._token is None:
            return None
        return signed(request.headers.get("Authorization", ""))

    def _authentic(self, signature: Signature | None, body: bytes) -> RequestRefused | None:
        """Why a signed question is not taken (its body is not the one signed, or it was
        asked before); None for one that is, and for a bearer token (checked with the head)."""
        if signature is None or self._token is None:
            return None
        refused = check_signature(signature, self._token, body)
        if refused is None and not self._nonces.fresh(signature.nonce):
            refused = RequestRefused(401, "question asked before (a replay)")
        return refused

    def _proven(self, answer: web.Response, signature: Signature | None) -> web.Response:
        """`answer`, with the proof that a holder of the token wrote it, for a signed question."""
        if signature is not None and self._token is not None and isinstance(answer.body, bytes):
            proof = answer_proof(self._token, signature.nonce, answer.body)
            answer.headers[PROOF_HEADER] = proof
        return answer

    async def _too_large(self, request: web.Request) -> web.StreamResponse:
        """The 413 for a body over MAX_BODY, sent at once, then the rest of the body read
        and dropped (at most DRAIN_MAX bytes, within BODY_S) before the close: closed with
        its body unread, the connection is reset, and a client that sends its whole body
        before reading (Bun's fetch, aiohttp's) loses the answer to the reset."""
        refused = too_large()
        self._on_refused(refused)
        answer = web.json_response(refused.to_json(), status=refused.status)
        answer.force_close()
        await answer.prepare(request)
        await answer.write_eof()
        left = DRAIN_MAX
        with contextlib.suppress(TimeoutError, ConnectionError, web.HTTPException):
            async with asyncio.timeout(BODY_S):
                while left > 0 and not request.content.at_eof():
                    chunk = await request.content.readany()
                    if not chunk:
                        break
                    left -= len(chunk)
        return answer

    def _over_the_cap(self) -> None:
        self._on_refused(RequestRefused(503, f"over {MAX_CONNECTIONS} connections"))

    def _answer(self, call: PluginCall) -> web.Response:
        try:
            verdict = self._judge(call)
            if isinstance(verdict, RequestRefused):
                self._on_refused(verdict)
                return web.json_response(verdict.to_json(), status=verdict.status)
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
