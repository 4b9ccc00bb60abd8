"""`opencode-loop-monitor plugin install|uninstall|status`: the plugin file in OpenCode's
plugins folder, written with the address of the daemon's endpoint."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from monitor.config import Settings
from monitor.errors import ConfigError
from monitor.shell.decide import PluginEndpoint, plugin_endpoint, read_or_create_token

FILE_NAME = "opencode-loop-monitor.ts"
# The one line of the shipped file that install rewrites.
_ENDPOINT_LINE = (
    "const ENDPOINT: { url: string; socket: string | null; tokenFile: string | null } = "
)
# Said by the file itself, so uninstall removes only a file we wrote.
_MARK = "opencode-loop-monitor plugin install"
PROBE_TIMEOUT_S = 0.5


def plugins_dir(project: Path | None, environ: Mapping[str, str]) -> Path:
    """Where OpenCode loads plugins from: a project's, or the user's ($XDG_CONFIG_HOME)."""
    if project is not None:
        return project / ".opencode" / "plugins"
    config = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "opencode" / "plugins"


def template() -> str:
    return (resources.files("monitor") / "plugin" / "loop-guard.ts").read_text(encoding="utf-8")


def render(endpoint: PluginEndpoint) -> str:
    """The plugin's source, pointing at `endpoint`."""
    address = {
        "url": endpoint.url,
        "socket": None if endpoint.socket is None else str(endpoint.socket),
        "tokenFile": None if endpoint.token_file is None else str(endpoint.token_file),
    }
    lines = template().splitlines(keepends=True)
    [index] = [n for n, line in enumerate(lines) if line.startswith(_ENDPOINT_LINE)]
    lines[index] = _ENDPOINT_LINE + json.dumps(address) + "\n"
    return "".join(lines)


def installed_endpoint(text: str) -> dict[str, str | None] | None:
    """The address an installed plugin uses, or None when the file is not ours."""
    if _MARK not in text:
        return None
    for line in text.splitlines():
        if line.startswith(_ENDPOINT_LINE):
            try:
                address = json.loads(line.removeprefix(_ENDPOINT_LINE))
            except ValueError:
                return None
            return address if isinstance(address, dict) else None
    return None


def _endpoint(settings: Settings, environ: Mapping[str, str]) -> PluginEndpoint:
    endpoint = plugin_endpoint(settings, environ)
    if endpoint is None:
        raise ConfigError("plugin_socket is off and no plugin_addr is set: nothing to point at")
    return endpoint


def install(settings: Settings, project: Path | None, environ: Mapping[str, str]) -> str:
    endpoint = _endpoint(settings, environ)
    if endpoint.token_file is not None:
        read_or_create_token(endpoint.token_file)  # the daemon and the plugin share it
    folder = plugins_dir(project, environ)
    path = folder / FILE_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".ts.tmp")
        temporary.write_text(render(endpoint), encoding="utf-8")
        os.replace(temporary, path)  # a server starting meanwhile never loads half a file
    except OSError as exc:
        raise ConfigError(f"plugin install: cannot write {path} ({exc.strerror})") from None
    where = endpoint.socket if endpoint.socket is not None else endpoint.url
    return (
        f"wrote {path}\n"
        f"it asks the monitor at {where} before every tool call"
        + (f" (token from {endpoint.token_file})" if endpoint.token_file else "")
        + "\nrestart OpenCode (opencode serve, the TUI) to load it; run `watch` with the same "
        "plugin settings"
    )


def uninstall(project: Path | None, environ: Mapping[str, str]) -> str:
    path = plugins_dir(project, environ) / FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"not installed: no {path}"
    except OSError as exc:
        raise ConfigError(f"plugin uninstall: cannot read {path} ({exc.strerror})") from None
    if installed_endpoint(text) is None:
        raise ConfigError(f"plugin uninstall: {path} was not written by us; left alone")
    path.unlink()
    return f"removed {path}\nrestart OpenCode to unload it"


def status(settings: Settings, project: Path | None, environ: Mapping[str, str]) -> str:
    path = plugins_dir(project, environ) / FILE_NAME
    try:
        address = installed_endpoint(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"not installed ({path} does not exist)"
    if address is None:
        return f"{path} exists but was not written by `plugin install`"
    lines = [f"installed: {path}"]
    where = address.get("socket") or address.get("url")
    lines.append(f"asks: {where}" + (" (answers)" if _answers(address) else " (nothing answers)"))
    expected = render(_endpoint(settings, environ))
    if installed_endpoint(expected) != address:
        lines.append("differs from these settings: run `plugin install` again, then restart")
    return "\n".join(lines)


def _answers(address: Mapping[str, str | None]) -> bool:
    """Whether something accepts connections where the plugin asks."""
    socket_path = address.get("socket")
    try:
        if socket_path:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(PROBE_TIMEOUT_S)
                probe.connect(socket_path)
            return True
        url = address.get("url") or ""
        host_port = url.split("//", 1)[-1].split("/", 1)[0]
        host, _, port = host_port.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False
