"""A real `opencode serve`, isolated on loopback, for tests and the demo.

`OpencodeServer` (1.18.33) and `OpencodeServer2` (2.2.5) give the server its own HOME and XDG
folders, a config that points at a scripted model (see `monitor.kit.scripted_model`), and a
small git project to work in; what the two share (the folders, the process group, the wait
for the first answer, the stop) is `IsolatedServer`. `ProjectClient` drives a 1.x server's
sessions the way a user's client would, through the monitor's own REST client
(`monitor.shell.api.OpencodeAPI`); `ProjectClient2` drives 2.x's `/api` routes directly, so
that the kit shows what the server does whatever the monitor's client makes of it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

import aiohttp

from monitor.errors import MonitorError, Refused, ServerError
from monitor.kit.poll import until
from monitor.shell.api import OpencodeAPI, Retry, basic_auth_header, path_segment
from monitor.shell.endpoint import PluginEndpoint
from monitor.shell.plugin_install import FILE_NAME as PLUGIN_FILE
from monitor.shell.plugin_install import render as render_plugin

__all__ = [
    "LISTENING",
    "InstallError",
    "IsolatedServer",
    "MODEL_ID",
    "NEVER_ASK",
    "NPM_PACKAGE",
    "OPENCODE_VERSION",
    "OpencodeServer",
    "OpencodeServer2",
    "ProjectClient",
    "ProjectClient2",
    "RELEASE_1",
    "RELEASE_2",
    "Release",
    "SandboxError",
    "ServerStartError",
    "default_cache_dir",
    "find_or_install_bun",
    "find_or_install_opencode",
    "free_loopback_port",
    "opencode_config_v2",
    "tool_calls",
    "tool_parts",
]


@dataclass(frozen=True, slots=True)
class Release:
    """One OpenCode release the kit runs: which npm package, where in the cache it goes, and
    the variable that names a binary of the caller's instead."""

    version: str
    package: str  # npm package name, without the version
    folder: str  # npm's --prefix under the cache folder ("": the cache folder itself)
    variable: str  # e.g. OPENCODE_BIN

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    def install_folder(self, cache_dir: Path) -> Path:
        return cache_dir / self.folder if self.folder else cache_dir


# 1.18.33 was installed at the top of the cache before there was a second release: its
# folder stays there, so existing caches (and the demo's) keep working.
RELEASE_1 = Release("1.18.33", "opencode-ai", "", "OPENCODE_BIN")
RELEASE_2 = Release("2.2.5", "@opencode/cli", "opencode-2", "OPENCODE2_BIN")

OPENCODE_VERSION = RELEASE_1.version
NPM_PACKAGE = RELEASE_1.spec
# The Bun inside that opencode: the plugin's tests run on the runtime that runs the plugin.
BUN_VERSION = "1.3.14"
MODEL_ID = "fake/looper"

START_TIMEOUT = 60.0
# A loaded machine (2 cores, a plugin loading) can take seconds to answer the first request
# even once it answers at all: at 0.5 s a try, no try ever succeeded there.
READY_TRY_TIMEOUT = 5.0
# What opencode serve prints once it takes requests ("opencode server listening on URL").
LISTENING = b"server listening on"
LISTENING_WAIT = 20.0
# After a session has run, opencode 1.18.33 often outlives SIGTERM by seconds; its data is
# thrown away with the sandbox, so it gets little time before SIGKILL.
STOP_GRACE = 1.5
LOG_TAIL_BYTES = 4000

Process = tuple[int, int, int, str]  # pid, ppid, pgid, state letter


class SandboxError(MonitorError):
    """The sandbox could not provide a working OpenCode server."""


class InstallError(SandboxError):
    """The opencode binary is missing and could not be installed."""


class ServerStartError(SandboxError):
    """The server did not come up; the message carries the tail of its log."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opencode-loop-monitor"


def find_or_install_opencode(cache_dir: Path, release: Release = RELEASE_1) -> Path:
    """The opencode binary of `release`: its variable (``$OPENCODE_BIN``, ``$OPENCODE2_BIN``),
    a cached install, the right one on PATH, or npm."""
    if explicit := os.environ.get(release.variable):
        if not Path(explicit).is_file():
            raise InstallError(f"{release.variable}={explicit} is not a file")
        return Path(explicit)
    folder = release.install_folder(cache_dir)
    cached = folder / "node_modules" / ".bin" / "opencode"
    with _install_lock(folder):
        if cached.exists():
            return cached
        # Event shapes differ between releases: a PATH binary is only good at the pinned version.
        on_path = shutil.which("opencode")
        if on_path and _version_of(Path(on_path)) == release.version:
            return Path(on_path)
        hint = f"set {release.variable} to opencode {release.version}"
        return _npm_install(folder, release.spec, cached, hint)


def find_or_install_bun(cache_dir: Path) -> Path:
    """Bun, to test the plugin: ``$BUN_BIN``, a cached install, or the `bun` npm package
    installed into its own folder of the cache (apart from opencode's install)."""
    if explicit := os.environ.get("BUN_BIN"):
        if not Path(explicit).is_file():
            raise InstallError(f"BUN_BIN={explicit} is not a file")
        return Path(explicit)
    folder = cache_dir / "bun"
    cached = folder / "node_modules" / ".bin" / "bun"
    with _install_lock(folder):
        if cached.exists():
            return cached
        hint = f"set BUN_BIN to bun {BUN_VERSION}"
        return _npm_install(folder, f"bun@{BUN_VERSION}", cached, hint)


@contextmanager
def _install_lock(folder: Path) -> Iterator[None]:
    """Held while looking into an install folder and installing into it: test workers in
    parallel (pytest-xdist) all need it at their start, one npm installs, the others wait and
    then find its install (a bin link alone does not say that npm has finished)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = (folder / ".install.lock").open("a")
    except OSError:
        yield  # an unwritable cache: nothing could be installed there anyway
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _version_of(binary: Path) -> str | None:
    """The version a binary prints: 1.18.33 says ``1.18.33``, 2.2.5 ``opencode v2.2.5``."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = done.stdout.split()
    return words[-1].removeprefix("v") if done.returncode == 0 and words else None


def _npm_install(cache_dir: Path, package: str, expected: Path, hint: str) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError(f"npm not found: install Node.js, or {hint}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache_dir), package]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not expected.exists():
        raise InstallError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-LOG_TAIL_BYTES:]}"
        )
    return expected


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The permission config of a sandbox that never asks: a pending permission stalls a scripted
# session for good. Within the project the defaults already allow read, edit and bash; paths
# outside it would ask. Tests of the permission gate pass {"*": "ask"} instead.
NEVER_ASK: str | dict[str, str] = "allow"


def opencode_config(
    model_url: str, permission: str | Mapping[str, str] = NEVER_ASK
) -> dict[str, Any]:
    """Config for a server that only knows the scripted model; `permission` as OpenCode reads it
    (`"allow"`, or per permission name `"allow"`, `"deny"` or `"ask"`)."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": MODEL_ID,
        # Title generation uses the small model: keep it on the scripted one, and keep other
        # providers (enabled by API keys in the caller's environment) from being loaded.
        "small_model": MODEL_ID,
        "enabled_providers": ["fake"],
        "permission": permission if isinstance(permission, str) else dict(permission),
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": model_url, "apiKey": "x"},
                "models": {"looper": {"name": "Looper", "tool_call": True}},
            }
        },
    }


def opencode_config_v2(model_url: str) -> dict[str, Any]:
    """Config of a 2.x server that knows the scripted model (2.x keys: `providers`, `package`,
    `settings`; V2-REAL-NOTES.md section 2). The package is built into the binary: nothing is
    downloaded."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": MODEL_ID,
        "providers": {
            "fake": {
                "name": "Scripted model",
                "package": "@ai-sdk/openai-compatible",
                "settings": {"baseURL": model_url, "apiKey": "x"},
                "models": {"looper": {"name": "Looper", "capabilities": {"tools": True}}},
            }
        },
    }


# What opencode installs into a config folder that has plugins before it answers (its plugin
# SDK, about 64 MB from the registry: 35-60 s on a busy machine). Kept once per binary in the
# cache and copied into each sandbox with a plugin, whose start then takes seconds.
_DEPENDENCIES = ("package.json", "package-lock.json", "node_modules")


def _dependencies_cache(binary: Path) -> Path:
    info = binary.resolve().stat()
    return default_cache_dir() / "plugin-dependencies" / f"{info.st_size}-{int(info.st_mtime)}"


def _copy_dependencies(source: Path, target: Path) -> None:
    for name in _DEPENDENCIES:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name, symlinks=True)
        elif (source / name).exists():
            shutil.copy2(source / name, target / name)


def _seed_plugin_dependencies(binary: Path, config_dir: Path) -> None:
    kept = _dependencies_cache(binary)
    if kept.is_dir():
        _copy_dependencies(kept, config_dir)


def _keep_plugin_dependencies(binary: Path, config_dir: Path) -> None:
    """Keep what this server installed, once: made aside, then renamed into place (another
    server may keep them first; then this copy is dropped)."""
    kept = _dependencies_cache(binary)
    if kept.exists() or not (config_dir / "node_modules").is_dir():
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix="new-", dir=kept.parent))
    try:
        with suppress(OSError):  # a full disk: the next start installs them again
            _copy_dependencies(config_dir, aside)
            aside.rename(kept)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


class IsolatedServer:
    """``opencode serve`` in a throwaway HOME; an async context manager. What a server of
    either release does the same way: its folders, its process group, the wait until it
    answers, the stop; each release's class says its config, its first answer and its client.

    `stop` and `start` may be repeated: the port and the data folders stay, so a restart
    looks to clients like the same server coming back.
    """

    release: ClassVar[Release]
    # Each XDG variable and the sandbox folder it names (HOME is always "home").
    XDG: ClassVar[Mapping[str, str]] = {
        "XDG_CONFIG_HOME": "config",
        "XDG_DATA_HOME": "data",
        "XDG_CACHE_HOME": "cache",
        "XDG_STATE_HOME": "state",
    }
    # Flags after `serve --hostname 127.0.0.1 --port N`.
    SERVE_FLAGS: ClassVar[tuple[str, ...]] = ()
    # Whether the server always has a password (2.x prints a generated one when none is set):
    # then one is set unless `env_extra` does, so that clients know it.
    ALWAYS_PASSWORD: ClassVar[bool] = False

    def __init__(
        self,
        binary: Path,
        model_url: str,
        port: int | None = None,
        env_extra: Mapping[str, str] | None = None,
        plugin: PluginEndpoint | None = None,
        config: Mapping[str, Any] | None = None,
        plugin_text: Callable[[PluginEndpoint], str] = render_plugin,
    ) -> None:
        self.binary = binary
        # Top-level keys of opencode.json that replace the sandbox's own: a provider block of
        # the person's, as `opencode-loop-monitor model` prints it, and the model it names.
        self.config = dict(config or {})
        # With an endpoint, the monitor's plugin is installed user-wide in the sandbox and
        # asks there before every call; `plugin_text` writes the file (a test installs the
        # file of an earlier release with it).
        self.plugin = plugin
        self.plugin_text = plugin_text
        self.model_url = model_url
        self.port = port
        self.env_extra = dict(env_extra or {})
        if self.ALWAYS_PASSWORD:  # kept across restarts
            self.env_extra.setdefault("OPENCODE_SERVER_PASSWORD", secrets.token_urlsafe(18))
        # What the server said of itself when it first answered (2.x: `GET /api/info`).
        self.info: dict[str, Any] = {}
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._directory: str | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise SandboxError("server was never started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def root(self) -> Path:
        if self._root is None:
            raise SandboxError("server was never started")
        return self._root

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def directory(self) -> str:
        """The project folder as the server reports it (the ``directory`` of its sessions)."""
        if self._directory is None:
            raise SandboxError("server was never started")
        return self._directory

    @property
    def log_path(self) -> Path:
        return self.root / "opencode.log"

    @property
    def pid(self) -> int | None:
        """Process id of the server, also its process group id; None when stopped."""
        return self._process.pid if self._process is not None else None

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header clients need when the server has a password."""
        password = self.env_extra.get("OPENCODE_SERVER_PASSWORD")
        if password is None:
            return {}
        return basic_auth_header(
            self.env_extra.get("OPENCODE_SERVER_USERNAME", "opencode"), password
        )

    async def start(self) -> None:
        if self._process is not None:
            return
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="opencode-sandbox-"))
            self._prepare_root()
        if self.port is None:
            self.port = free_loopback_port()
        begun = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._process = self._spawn()
        try:
            await self._wait_ready(begun)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        await _end_process_tree(process)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            self._remove_root()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.stop()
        finally:
            self._remove_root()

    def _remove_root(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    @property
    def _config_dir(self) -> Path:
        return self.root / self.XDG["XDG_CONFIG_HOME"] / "opencode"

    def _opencode_config(self) -> dict[str, Any]:
        """This release's opencode.json, before `config` replaces keys of it."""
        raise NotImplementedError

    def _prepare_root(self) -> None:
        for name in ("home", *self.XDG.values()):
            # 0700: what a runtime folder must be, and no harm to the others.
            (self.root / name).mkdir(mode=0o700)
        config_dir = self._config_dir
        config_dir.mkdir()
        config = self._opencode_config() | self.config
        (config_dir / "opencode.json").write_text(json.dumps(config, indent=2))
        if self.plugin is not None:
            plugins = config_dir / "plugins"
            plugins.mkdir()
            (plugins / PLUGIN_FILE).write_text(self.plugin_text(self.plugin), encoding="utf-8")
        _make_project(self.project, self._environment())

    def client_environment(self) -> dict[str, str]:
        """The environment for an OpenCode client of this sandbox (`opencode run --attach`):
        its HOME and XDG folders, none of the caller's OPENCODE_* settings."""
        return self._environment()

    def _environment(self) -> dict[str, str]:
        # Drop the caller's OPENCODE_* settings (a password, another config) so that only
        # what this sandbox sets applies.
        env = {key: value for key, value in os.environ.items() if not key.startswith("OPENCODE_")}
        env.update({variable: str(self.root / name) for variable, name in self.XDG.items()})
        env.update(
            HOME=str(self.root / "home"),
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_SHARE="1",
        )
        env.update(self.env_extra)
        return env

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [str(self.binary), "serve", "--hostname", "127.0.0.1", "--port", str(self.port)]
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [*command, *self.SERVE_FLAGS],
                cwd=self.project,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def _answers(self, http: aiohttp.ClientSession) -> bool:
        """One try of this release's first request, with a short timeout and no retry."""
        raise NotImplementedError

    async def _server_directory(self, http: aiohttp.ClientSession) -> str:
        """The project folder as the server names it, once it answers."""
        raise NotImplementedError

    async def _wait_ready(self, begun: int) -> None:
        """Until the server answers; `begun`: where this start's lines begin in its log."""
        # A request sent while the server is still starting may never be answered, so each
        # try gets a short timeout of its own and no retries: the next poll is the retry. The
        # first try waits for the line that says the server listens (about 1.5 s on a quiet
        # machine): one sent before it sat out its whole timeout, and every start took 7 s
        # instead of 2. A server that never prints it is asked all the same after a while.
        loop = asyncio.get_running_loop()
        ask_anyway = loop.time() + LISTENING_WAIT
        async with aiohttp.ClientSession() as http:

            async def answers() -> bool:
                self._raise_if_exited()
                if not self._said_listening(begun) and loop.time() < ask_anyway:
                    return False
                return await self._answers(http)

            try:
                await until(answers, START_TIMEOUT, what="opencode serve to answer")
            except TimeoutError as error:
                raise ServerStartError(f"{error}\n{self._log_tail()}") from None
            self._directory = await self._server_directory(http)

    def _said_listening(self, begun: int) -> bool:
        try:
            with self.log_path.open("rb") as log:
                log.seek(begun)
                return LISTENING in log.read()
        except OSError:
            return False

    def _raise_if_exited(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise ServerStartError(
                f"opencode serve exited with {self._process.returncode}\n{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no server log)"
        return data[-LOG_TAIL_BYTES:].decode(errors="replace")


class OpencodeServer(IsolatedServer):
    """OpenCode 1.18.33 (`RELEASE_1`): the 1.x config, a password only when `env_extra` sets
    one, ready when `/session` answers; `client` drives it through `OpencodeAPI`."""

    release = RELEASE_1

    def __init__(
        self,
        binary: Path,
        model_url: str,
        port: int | None = None,
        env_extra: Mapping[str, str] | None = None,
        permission: str | Mapping[str, str] = NEVER_ASK,
        plugin: PluginEndpoint | None = None,
        config: Mapping[str, Any] | None = None,
        plugin_text: Callable[[PluginEndpoint], str] = render_plugin,
    ) -> None:
        super().__init__(binary, model_url, port, env_extra, plugin, config, plugin_text)
        self.permission = permission

    def client(self, http: aiohttp.ClientSession) -> ProjectClient:
        """A REST client for this server's project, with its credentials."""
        return ProjectClient(OpencodeAPI(http, self.url, headers=self.headers), self.directory)

    async def start(self) -> None:
        await super().start()
        if self.plugin is not None:
            _keep_plugin_dependencies(self.binary, self._config_dir)

    def _opencode_config(self) -> dict[str, Any]:
        return opencode_config(self.model_url, self.permission)

    def _prepare_root(self) -> None:
        super()._prepare_root()
        if self.plugin is not None:
            _seed_plugin_dependencies(self.binary, self._config_dir)

    async def _answers(self, http: aiohttp.ClientSession) -> bool:
        once = Retry(attempts=1, timeout=READY_TRY_TIMEOUT)
        try:
            await OpencodeAPI(http, self.url, retry=once, headers=self.headers).sessions(None)
        except ServerError:
            return False
        return True

    async def _server_directory(self, http: aiohttp.ClientSession) -> str:
        # Up now: the usual timeout and retries, a busy machine may answer slowly.
        return await OpencodeAPI(http, self.url, headers=self.headers).server_directory()


class OpencodeServer2(IsolatedServer):
    """OpenCode 2.2.5 (`RELEASE_2`, V2-REAL-NOTES.md sections 1-2): the 2.x config, always a
    password (generated unless `env_extra` sets OPENCODE_SERVER_PASSWORD), its runtime folder
    in the sandbox too, ready when `GET /api/info` answers JSON; `client` speaks `/api`.

    Its plugin folder is the same as 1.x's and 2.2.5 needs no installed SDK for it, so there
    are no plugin dependencies to seed.
    """

    release = RELEASE_2
    XDG = {**IsolatedServer.XDG, "XDG_RUNTIME_DIR": "runtime"}
    # The server's own log on stderr, which goes to `log_path`: a start that fails says why.
    SERVE_FLAGS = ("--print-logs",)
    ALWAYS_PASSWORD = True

    @property
    def password(self) -> str:
        return self.env_extra["OPENCODE_SERVER_PASSWORD"]

    def client(self, http: aiohttp.ClientSession) -> ProjectClient2:
        """A client of this server's `/api` for its project, with its credentials."""
        return ProjectClient2(http, self.url, self.headers, self.directory)

    def _opencode_config(self) -> dict[str, Any]:
        return opencode_config_v2(self.model_url)

    async def _answers(self, http: aiohttp.ClientSession) -> bool:
        # Every path outside /api answers 200 with the web app's page, so only /api/info's
        # JSON says the API is up.
        timeout = aiohttp.ClientTimeout(total=READY_TRY_TIMEOUT)
        try:
            async with http.get(
                f"{self.url}/api/info", headers=self.headers, timeout=timeout
            ) as response:
                info = await response.json() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        if not isinstance(info, dict) or "version" not in info:
            return False
        self.info = info
        return True

    async def _server_directory(self, http: aiohttp.ClientSession) -> str:
        # 2.x has no route that names the server's folder; a session's location is the
        # directory its client gives, and the server keeps it as given.
        return str(self.project.resolve())


def _make_project(project: Path, env: Mapping[str, str]) -> None:
    project.mkdir()
    (project / "README.md").write_text(
        "# Sandbox project\n\nA small project for scripted OpenCode sessions.\n"
    )
    git = [
        "git",
        "-c",
        "user.name=sandbox",
        "-c",
        "user.email=sandbox@localhost",
        "-c",
        "init.defaultBranch=main",
    ]
    for args in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "initial"]):
        subprocess.run([*git, *args], cwd=project, env=env, check=True, capture_output=True)


async def _end_process_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server and everything it spawned, SIGKILL what outlives the grace time.

    Its own process group is not enough: the bash tool starts each command in a session of
    its own, which would outlive the server (and keep its output files open).
    """
    table = _processes()
    spawned = _descendants(process.pid, table)
    groups = {process.pid} | {pgid for pid, _, pgid, _ in table if pid in spawned}

    def ended() -> bool:
        # The server is our child: until it is reaped it lingers as a zombie in its group.
        return process.poll() is not None and not _live_groups(groups)

    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            _signal_group(pgid, signum)
        with suppress(TimeoutError):
            await until(ended, STOP_GRACE, what=f"the server to end on {signum.name}")
            return
    raise SandboxError(f"processes survived SIGKILL in groups {sorted(_live_groups(groups))}")


def _descendants(root: int, table: list[Process]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid, _, _ in table:
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _live_groups(groups: set[int]) -> set[int]:
    # Zombies are dead: orphans are reaped by init, which in a container may never happen.
    return {
        pgid for _, _, pgid, state in _processes() if pgid in groups and state not in ("Z", "X")
    }


def _processes() -> list[Process]:
    """Every process: from /proc, else from ps (macOS)."""
    return _processes_from_proc() if Path("/proc/self/stat").exists() else _processes_from_ps()


def _processes_from_proc() -> list[Process]:
    table = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        # The command name may hold spaces and parentheses; the fields after the last ")" do not.
        state, ppid, pgid = stat.rsplit(")", 1)[1].split()[:3]
        table.append((int(entry.name), int(ppid), int(pgid), state))
    return table


def _processes_from_ps() -> list[Process]:
    out = subprocess.run(
        ["ps", "-A", "-o", "pid=,ppid=,pgid=,stat="], capture_output=True, text=True, check=True
    )
    table = []
    for line in out.stdout.splitlines():
        pid, ppid, pgid, stat = line.split()[:4]
        table.append((int(pid), int(ppid), int(pgid), stat[0]))
    return table


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


@dataclass(frozen=True, slots=True)
class ProjectClient:
    """`OpencodeAPI` bound to one project, with the calls and waits of a user's client.

    `directory` selects the project instance on the server, as it does for the monitor.
    """

    api: OpencodeAPI
    directory: str | None = None

    async def create_session(self, title: str | None = None) -> dict[str, Any]:
        return await self.api.create_session(self.directory, title)

    async def prompt_async(self, session_id: str, text: str) -> None:
        """Post a user message and return at once; the model answers in the background.

        The server answers before it has stored the message: right after this call the
        session can still look idle and unchanged.
        """
        await self.api.prompt(session_id, self.directory, text, route=1)

    async def messages(self, session_id: str) -> list[dict[str, Any]]:
        """Every message of the session as ``{"info": ..., "parts": [...]}``, oldest first."""
        return await self.api.messages(session_id, self.directory, route=1)

    async def status(self) -> dict[str, dict[str, Any]]:
        """Status by session id of the busy (or retrying) sessions; idle ones are left out."""
        return await self.api.statuses(self.directory)

    async def wait_idle(
        self, session_id: str, timeout: float, *, user_messages: int = 1
    ) -> list[dict[str, Any]]:
        """Wait until the session has answered its `user_messages`-th user message; its messages.

        Counting user messages is what tells a finished second run from the finished first
        one while the second prompt is not stored yet (see `prompt_async`).
        """

        async def finished() -> list[dict[str, Any]] | None:
            if (await self.status()).get(session_id, {"type": "idle"})["type"] != "idle":
                return None
            messages = await self.messages(session_id)
            return messages if run_finished(messages, user_messages) else None

        what = f"session {session_id} to answer user message {user_messages}"
        return await until(finished, timeout, interval=0.1, what=what)


def run_finished(messages: list[dict[str, Any]], user_messages: int = 1) -> bool:
    """True when the answer to the `user_messages`-th user message has completed."""
    users = sum(1 for message in messages if message["info"].get("role") == "user")
    if users < user_messages or not messages:
        return False
    last = messages[-1]["info"]
    return last.get("role") == "assistant" and "completed" in last.get("time", {})


def tool_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool parts of all messages, in the order they ran."""
    return [part for message in messages for part in message["parts"] if part.get("type") == "tool"]


# The scripted model as 2.x names it in a session (`providerID`, `id`).
MODEL_REF = {"providerID": MODEL_ID.split("/")[0], "id": MODEL_ID.split("/")[1]}


@dataclass(frozen=True, slots=True)
class ProjectClient2:
    """A user's client of a 2.x server's `/api`, for one project (V2-REAL-NOTES.md section 4).

    Plain requests, not the monitor's `EngineAPI`: the kit shows what the server does, also
    where the monitor's client is wrong about it. Every answer's ``data`` is returned; an
    error status raises `Refused` with the server's body.
    """

    http: aiohttp.ClientSession
    url: str
    headers: Mapping[str, str]
    directory: str

    async def info(self) -> dict[str, Any]:
        """`GET /api/info`: version, pid, urls (not wrapped in ``data``)."""
        answer: dict[str, Any] = await self._call("GET", "/api/info")
        return answer

    async def create_session(
        self, title: str | None = None, permissions: Sequence[Mapping[str, str]] | None = None
    ) -> dict[str, Any]:
        """A session of the project on the scripted model; `permissions`: rules such as
        ``{"action": "*", "resource": "*", "effect": "ask"}``, in order."""
        body: dict[str, Any] = {"location": {"directory": self.directory}, "model": MODEL_REF}
        if title is not None:
            body["title"] = title
        if permissions is not None:
            body["permissions"] = [dict(rule) for rule in permissions]
        return await self._data("POST", "/api/session", body)

    async def prompt(
        self, session_id: str, text: str, *, resume: bool | None = None
    ) -> dict[str, Any]:
        """Post a user message; the run goes on in the background (`resume=False`: the
        message waits in the session's inbox and no run starts). The stored message."""
        body: dict[str, Any] = {"text": text}
        if resume is not None:
            body["resume"] = resume
        return await self._data("POST", f"{_session(session_id)}/prompt", body)

    async def interrupt(self, session_id: str) -> bool:
        """Stop the session's run; whether one was running."""
        answer = await self._call("POST", f"{_session(session_id)}/interrupt")
        return bool(answer.get("interrupted")) if isinstance(answer, dict) else False

    async def messages(self, session_id: str) -> list[dict[str, Any]]:
        """Every item of the session's record (`user`, `assistant`, `idle`, ...), oldest
        first, page after page."""
        path = f"{_session(session_id)}/message"
        items: list[dict[str, Any]] = []
        query = {"order": "asc"}
        while True:
            page = await self._call("GET", path, query=query)
            items += page["data"]
            after = (page.get("cursor") or {}).get("next")
            if not page["data"] or not after:
                return items
            query = {"cursor": after}  # a cursor goes without `order` (the server's rule)

    async def inbox(self, session_id: str) -> list[dict[str, Any]]:
        """The user messages waiting for the session's next run (a ``resume: false`` post),
        which `/message` does not hold yet: ``{id, type: "user", payload: {text}, ...}``."""
        path = f"{_session(session_id)}/inbox"
        items: list[dict[str, Any]] = (await self._call("GET", path))["data"]
        return items

    async def delete_session(self, session_id: str) -> None:
        """Delete the session (`DELETE /api/session/{id}`)."""
        await self._call("DELETE", _session(session_id))

    async def active(self) -> dict[str, dict[str, Any]]:
        """The sessions with a run going on, by id (``{"type": "running"}``)."""
        return await self._data("GET", "/api/session/active")

    async def wait_idle(
        self, session_id: str, timeout: float, *, runs: int = 1
    ) -> list[dict[str, Any]]:
        """Wait until the session's `runs`-th run is over; its record.

        A run's end leaves an ``idle`` item in the record; counting them tells the end of a
        second run from the first while the second has not started yet. The session must
        also be gone from `active`: the item may be written before the run lets go.
        """

        async def finished() -> list[dict[str, Any]] | None:
            if session_id in await self.active():
                return None
            record = await self.messages(session_id)
            ends = sum(1 for item in record if item.get("type") == "idle")
            return record if ends >= runs else None

        what = f"session {session_id} to end run {runs}"
        return await until(finished, timeout, interval=0.1, what=what)

    async def _data(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = (await self._call(method, path, body))["data"]
        return data

    async def _call(
        self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None
    ) -> Any:
        async with self.http.request(
            method, self.url + path, json=body, params=query, headers=dict(self.headers)
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise Refused(f"{method} {path}: {response.status} {text[:500]}", response.status)
            return json.loads(text) if text else None


def _session(session_id: str) -> str:
    return f"/api/session/{path_segment(session_id)}"


def tool_calls(record: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of a 2.x record (the ``tool`` entries of its assistant items' content:
    ``{id, name, state: {status, input, content, metadata}}``), in the order they ran."""
    return [
        entry
        for item in record
        if item.get("type") == "assistant"
        for entry in item.get("content", [])
        if entry.get("type") == "tool"
    ]
