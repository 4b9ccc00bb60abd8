"""Where the daemon serves the plugin and what the plugin needs to reach it: the endpoint's
address (a Unix socket per server in a private folder, or loopback TCP with a token file),
the token, and the checks a folder or a token file must pass before either is used.

Every check here runs at start, whatever role the monitor gets (a standby that could not
serve the endpoint must fail at once with exit 78, not when it takes over).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from monitor.config import Settings, is_loopback
from monitor.core.plugin_protocol import DECIDE_PATH
from monitor.errors import ConfigError

__all__ = [
    "EndpointTaken",
    "PluginEndpoint",
    "check_endpoint",
    "clear_stale_socket",
    "link_server_pid",
    "open_folder",
    "pid_link_name",
    "plugin_endpoint",
    "private_dir",
    "read_or_create_token",
    "socket_name",
    "state_dir",
    "unlink_server_pid",
    "write_whole",
]

# sockaddr_un holds 108 bytes with the final NUL.
MAX_SOCKET_PATH = 107


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


def pid_link_name(pid: int) -> str:
    """The link naming the socket of the monitor of the server whose process is `pid`
    (loop-guard.ts pidLink). OpenCode 2 gives a plugin no URL, and a server's port may not be
    what its monitor was given (a mapped port, `--port 0`), but the plugin runs in the server's
    process and knows its pid, which the server's `/api/info` tells the monitor."""
    return f"server-{pid}.sock"


def link_server_pid(endpoint: PluginEndpoint, pid: int) -> Path | None:
    """Name `endpoint`'s socket after the pid of the server it serves (from `/api/info`): a
    link in the folder of sockets, put in place whole (a plugin never finds half a link).
    The link, or None when there is no folder of sockets (a fixed socket, TCP: the plugin
    asks there whatever its server). Raises OSError: the caller says so and goes on, the
    plugin still finds the socket of its server's port.

    Links to this socket from before are removed first: an earlier monitor of this socket
    made them (it crashed, or its server restarted with another pid), and a new server given
    that pid would ask this monitor, which watches another. So is any link whose socket is
    gone, which no plugin can use."""
    folder, socket_path = endpoint.socket_dir, endpoint.socket
    if folder is None or socket_path is None:
        return None
    link = folder / pid_link_name(pid)
    with os.scandir(folder) as entries:
        # This pid's own link is replaced below, never missing meanwhile.
        links = [e.path for e in entries if e.name.startswith("server-") and e.name != link.name]
    for path in links:
        # Gone meanwhile, or not a link (nothing of ours): left alone.
        with contextlib.suppress(OSError):
            target = os.readlink(path)
            if target == socket_path.name or not (folder / target).exists():
                os.unlink(path)
    temporary = folder / f".{link.name}.{secrets.token_hex(8)}.tmp"
    # Relative: the link leads into its own folder, which the plugin checks (untrustedSocket).
    os.symlink(socket_path.name, temporary)
    try:
        os.replace(temporary, link)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return link


def unlink_server_pid(endpoint: PluginEndpoint, pid: int) -> None:
    """Remove the link `link_server_pid` made, when it still leads to this monitor's socket
    (another monitor may have named its own since); as the monitor stops serving plugins."""
    if endpoint.socket_dir is None or endpoint.socket is None:
        return
    link = endpoint.socket_dir / pid_link_name(pid)
    with contextlib.suppress(OSError):
        if os.readlink(link) == endpoint.socket.name:
            link.unlink()


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
