"""`opencode-loop-monitor plugin install|uninstall|status`: the plugin file in OpenCode's
plugins folder, written with the address of the daemon's endpoint (with plugin_socket auto,
the folder of the sockets: the plugin picks its own server's)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from monitor.config import Settings, public_url
from monitor.core.plugin_protocol import skew_advice
from monitor.errors import ConfigError
from monitor.exits import (
    EX_NOT_INSTALLED,
    EX_OK,
    EX_OTHER_RELEASE,
    EX_OTHER_SERVER,
    EX_UNAVAILABLE,
)
from monitor.shell.endpoint import (
    PluginEndpoint,
    open_folder,
    pid_link_name,
    plugin_endpoint,
    read_or_create_token,
    socket_name,
)
from monitor.shell.plugin_file import shipped_version, template
from monitor.shell.plugin_probe import Probed, probe

__all__ = [
    "FILE_NAME",
    "asked_at",
    "finds_own_server",
    "install",
    "installed_endpoint",
    "installed_version",
    "plugins_dir",
    "render",
    "status",
    "uninstall",
]

FILE_NAME = "opencode-loop-monitor.ts"
# The one line of the shipped file that install rewrites (earlier releases spelled out its
# type: a file of theirs is read too, so it can be uninstalled).
_ENDPOINT_LINE = "const ENDPOINT: Endpoint = "
_ENDPOINT_START, _VALUE_START = "const ENDPOINT:", " = {"
# The line carrying the release that wrote the file (none in files before issue 46).
_VERSION_LINE = "export const VERSION = "
# In the files that find their own server's socket under OpenCode 2 (loop-guard.ts setup).
_OWN_SERVER = "ownSocket(ENDPOINT.socketDir, process)"
# Said by the file itself, so uninstall removes only a file we wrote.
_MARK = "opencode-loop-monitor plugin install"
PROBE_TIMEOUT_S = 0.5
# How long the monitor may take to answer the plugin's question asked by `status`: a person
# waits, not a tool call, and a busy machine must not read as a monitor that cannot answer.
ANSWER_TIMEOUT_S = 5.0
# Written mode 0644, as an editor would: OpenCode, maybe run as another user, reads it.
FILE_MODE = 0o644


def plugins_dir(project: Path | None, environ: Mapping[str, str]) -> Path:
    """Where OpenCode loads plugins from: a project's, or the user's ($XDG_CONFIG_HOME)."""
    if project is not None:
        return project / ".opencode" / "plugins"
    config = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "opencode" / "plugins"


def _address(endpoint: PluginEndpoint) -> dict[str, str | None]:
    def text(path: Path | None) -> str | None:
        return None if path is None else str(path)

    return {
        "url": endpoint.url,
        "socket": text(endpoint.socket),
        "socketDir": text(endpoint.socket_dir),
        "tokenFile": text(endpoint.token_file),
    }


def render(endpoint: PluginEndpoint) -> str:
    """The plugin's source, pointing at `endpoint`, carrying this release's version."""
    lines = template().splitlines(keepends=True)
    [index] = [n for n, line in enumerate(lines) if line.startswith(_ENDPOINT_LINE)]
    lines[index] = _ENDPOINT_LINE + json.dumps(_address(endpoint)) + "\n"
    [index] = [n for n, line in enumerate(lines) if line.startswith(_VERSION_LINE)]
    lines[index] = _VERSION_LINE + json.dumps(shipped_version()) + "\n"
    return "".join(lines)


def installed_version(text: str) -> str | None:
    """The version an installed plugin says; None for a file from before versions."""
    for line in text.splitlines():
        if line.startswith(_VERSION_LINE):
            try:
                version = json.loads(line[len(_VERSION_LINE) :])
            except ValueError:
                return None
            return version if isinstance(version, str) else None
    return None


def installed_endpoint(text: str) -> dict[str, str | None] | None:
    """The address an installed plugin uses, or None when the file is not ours."""
    if _MARK not in text:
        return None
    for line in text.splitlines():
        if line.startswith(_ENDPOINT_START) and _VALUE_START in line:
            value = line[line.index(_VALUE_START) + len(_VALUE_START) - 1 :]
            try:
                address = json.loads(value)
            except ValueError:
                return None
            return address if isinstance(address, dict) else None
    return None


def asked_at(address: Mapping[str, str | None], url: str, pid: int | None = None) -> str:
    """Where an installed plugin running in the server at `url` asks (loop-guard.ts): with
    `pid` (the server's, from its `/api/info`), the socket a monitor named after it first
    (endpoint.link_server_pid, what a 2.x plugin asks first), else its port's socket."""
    folder = address.get("socketDir")
    if folder:
        if pid is not None:
            with contextlib.suppress(OSError):
                return os.path.realpath(Path(folder) / pid_link_name(pid), strict=True)
        return str(Path(folder) / socket_name(url))
    return address.get("socket") or address.get("url") or ""


def finds_own_server(text: str) -> bool:
    """Whether an installed plugin finds its own server's socket under OpenCode 2; one written
    before it could asks the socket install wrote (`socket`) in every 2.x server."""
    return _OWN_SERVER in text


def _endpoint(settings: Settings, environ: Mapping[str, str]) -> PluginEndpoint:
    endpoint = plugin_endpoint(settings, environ)
    if endpoint is None:
        raise ConfigError("plugin_socket is off and no plugin_addr is set: nothing to point at")
    return endpoint


def _write(folder: Path, text: str) -> Path:
    """Write `folder`/FILE_NAME through a new file of ours: created exclusively and never
    through a link (a link planted at the temporary name makes the open fail), then renamed
    over the old one, which replaces a link there rather than writing where it points. A
    server starting meanwhile never loads half a file."""
    path = folder / FILE_NAME
    temporary = folder / f".{FILE_NAME}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, FILE_MODE)
    try:
        with open(fd, "w", encoding="utf-8", closefd=True) as file:
            file.write(text)
        os.chmod(temporary, FILE_MODE, follow_symlinks=False)  # whatever the umask
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return path


def install(settings: Settings, project: Path | None, environ: Mapping[str, str]) -> str:
    endpoint = _endpoint(settings, environ)
    folder_of_sockets = endpoint.socket_dir or (
        endpoint.socket.parent if endpoint.socket is not None else None
    )
    if folder_of_sockets is not None:
        refused = open_folder(folder_of_sockets)
        if refused is not None:
            raise ConfigError(f"plugin install: {refused}")
    if endpoint.token_file is not None:
        read_or_create_token(endpoint.token_file)  # the daemon and the plugin share it
    folder = plugins_dir(project, environ)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = _write(folder, render(endpoint))
    except OSError as exc:
        raise ConfigError(
            f"plugin install: cannot write {folder / FILE_NAME} ({exc.strerror})"
        ) from None
    if endpoint.socket_dir is not None:
        where = (
            f"the monitor of its own server, at {endpoint.socket_dir}/plugin-PORT.sock "
            "(PORT: the port that server listens on; under OpenCode 2 the one its command "
            "line or its service registration says, or the socket its monitor named "
            "server-PID.sock after the server's pid)"
        )
    else:
        where = f"the monitor at {endpoint.socket or endpoint.url}" + (
            f" (token from {endpoint.token_file})" if endpoint.token_file else ""
        )
    return (
        f"wrote {path}\n"
        f"before every tool call it asks {where}; when none answers, it applies its own "
        "loop rule\nrestart OpenCode (opencode serve, the TUI) to load it"
    )


def _read_ours(path: Path) -> str:
    """The text of `path`, never through a link; FileNotFoundError when there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with open(fd, encoding="utf-8", closefd=True) as file:
        return file.read()


def uninstall(project: Path | None, environ: Mapping[str, str]) -> str:
    folder = plugins_dir(project, environ)
    path = folder / FILE_NAME
    try:
        text = _read_ours(path)
    except FileNotFoundError:
        return f"not installed: no {path}"
    except OSError as exc:
        # ELOOP: a link at our file's name; we never wrote one, so it is not ours to remove.
        raise ConfigError(f"plugin uninstall: cannot read {path} ({exc.strerror})") from None
    except ValueError:
        text = ""  # not UTF-8: not ours
    if installed_endpoint(text) is None:
        raise ConfigError(f"plugin uninstall: {path} was not written by us; left alone")
    path.unlink()
    removed = [path]
    if project is not None:
        # The folders install made for the project, if nothing else is in them now.
        for made in (folder, folder.parent):
            try:
                made.rmdir()
            except OSError:
                break
            removed.append(made)
    return "\n".join(f"removed {p}" for p in removed) + "\nrestart OpenCode to unload it"


class PluginStatus(NamedTuple):
    text: str
    code: int


def status(settings: Settings, project: Path | None, environ: Mapping[str, str]) -> PluginStatus:
    """Where the plugin is and whether the monitor of the server at --url answers it."""
    path = plugins_dir(project, environ) / FILE_NAME
    try:
        text = _read_ours(path)
    except FileNotFoundError:
        return PluginStatus(f"not installed ({path} does not exist)", EX_NOT_INSTALLED)
    except (OSError, ValueError):
        text = ""
    address = installed_endpoint(text)
    if address is None:
        return PluginStatus(
            f"not installed: {path} exists but was not written by this release's `plugin install`",
            EX_NOT_INSTALLED,
        )
    server = public_url(settings.url)
    asked = asked_at(address, settings.url)
    expected = _endpoint(settings, environ)
    watch_at = str(expected.socket) if expected.socket is not None else expected.url
    lines = [f"installed: {path}", f"in the server at {server} it asks: {asked}"]
    pinned = address.get("socket")
    if address.get("socketDir") and not finds_own_server(text) and pinned and pinned != asked:
        # A file from before the 2.x lookup: whatever answers at `asked`, an OpenCode 2
        # server's plugin asks elsewhere, and a monitor answering here is no answer to it.
        lines[-1] += f" (OpenCode 1); in an OpenCode 2 server it asks {pinned}"
        lines.append("run `opencode-loop-monitor plugin install` again, then restart OpenCode")
        return PluginStatus("\n".join(lines), EX_OTHER_RELEASE)
    if not _answers(asked):
        lines.append(
            "nothing answers there: start `opencode-loop-monitor watch --url "
            f"{server}` (with these plugin settings); meanwhile the plugin applies its own "
            "loop rule"
        )
        if watch_at != asked and _answers(watch_at):
            lines.append(f"a monitor answers at {watch_at}: run `plugin install` again")
        return PluginStatus("\n".join(lines), EX_UNAVAILABLE)
    if watch_at != asked:
        lines.append(
            f"a monitor answers there, but a monitor of {server} with these settings serves "
            f"{watch_at}: it watches another server, or run `plugin install` again"
        )
        return PluginStatus("\n".join(lines), EX_OTHER_SERVER)
    return _releases(lines, address, asked, installed_version(text))


def _releases(
    lines: list[str], address: Mapping[str, str | None], asked: str, version: str | None
) -> PluginStatus:
    """The end of `status` once a monitor answers where the plugin asks: whether the plugin
    file, this command and that monitor are of one release, and the monitor takes the
    plugin's questions (asked as the plugin asks: an upgrade can leave either behind)."""
    ours = shipped_version()
    answered = probe(asked, address.get("tokenFile"), version, ANSWER_TIMEOUT_S)
    if not isinstance(answered, Probed):
        lines.append(f"a monitor answers there, but not the plugin's question: {answered}")
        return PluginStatus("\n".join(lines), EX_UNAVAILABLE)
    code = EX_OK
    if version != ours:
        lines.append(skew_advice(version, None, ours))
        code = EX_OTHER_RELEASE
    if answered.refused is not None:
        refused = f"the monitor there refuses the plugin's questions ({answered.status} "
        if answered.monitor_version is None:
            refused += (
                f"{answered.refused}): it says no version, a monitor of an earlier release "
                f"than this one ({ours}): restart it"
            )
        else:
            refused += f"{answered.refused}); it is version {answered.monitor_version}"
        lines.append(refused)
        return PluginStatus("\n".join(lines), EX_OTHER_RELEASE)
    if answered.monitor_version != ours:
        monitor = (
            "of an earlier release (it says no version)"
            if answered.monitor_version is None
            else f"version {answered.monitor_version}"
        )
        lines.append(
            f"the monitor there is {monitor}, this command {ours}: restart the monitor "
            "with this release"
        )
        return PluginStatus("\n".join(lines), EX_OTHER_RELEASE)
    lines.append(f"a monitor answers there, version {answered.monitor_version}")
    return PluginStatus("\n".join(lines), code)


def _answers(where: str) -> bool:
    """Whether something accepts connections where the plugin asks (a socket or a URL)."""
    try:
        if where.startswith("/"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(PROBE_TIMEOUT_S)
                probe.connect(where)
            return True
        parts = urlsplit(where)
        if parts.hostname is None or parts.port is None:
            return False
        with socket.create_connection((parts.hostname, parts.port), PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False
