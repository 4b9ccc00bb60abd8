"""OpenCode 2's background service, found where OpenCode registers it.

Every `opencode` command given neither `--server` nor `--standalone` (the TUI, `run`, even
`opencode models`) starts one shared server, `opencode serve --service`, on loopback with a
generated password, and registers it in `$XDG_STATE_HOME/opencode/service.json`
(`{id, version, url, pid, password}`, removed by `opencode service stop`; seen on the real
2.2.5, ../shared/opencode/V2-REAL-NOTES.md). A 2.x user never types its URL nor its password:
a monitor given no `--url` reads them here at every connect, so it follows the service when it
restarts on a new port with a new password. The password is kept out of every `repr`, log
line and error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["Service", "parse_service", "read_service", "service_file"]

# Larger than any registration OpenCode writes (about 200 bytes): a file past it is not one.
MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Service:
    """A registered background service: where it listens and the password it takes."""

    url: str
    password: str | None = field(default=None, repr=False)
    pid: int | None = None
    version: str | None = None


def service_file(environ: Mapping[str, str]) -> Path | None:
    """Where OpenCode registers its background service for this user (XDG's state folder,
    `~/.local/state` by default); None when neither the variable nor a home is known."""
    state = environ.get("XDG_STATE_HOME", "").strip()
    if state:
        return Path(state) / "opencode" / "service.json"
    home = environ.get("HOME", "").strip()
    return Path(home) / ".local" / "state" / "opencode" / "service.json" if home else None


def parse_service(text: str) -> Service | None:
    """The service a registration names, or None when it names none usable: not JSON, no
    loopback or other http(s) URL. A password that is not text is taken as none."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    url = data.get("url")
    if not isinstance(url, str) or not _is_base_url(url):
        return None
    password, pid, version = data.get("password"), data.get("pid"), data.get("version")
    return Service(
        url.rstrip("/"),
        password if isinstance(password, str) and password else None,
        pid if type(pid) is int and pid > 0 else None,
        version if isinstance(version, str) else None,
    )


def read_service(path: Path | None) -> Service | None:
    """The service registered at `path`, or None: no such file (no service runs), or one
    that cannot be read or names none (`parse_service`)."""
    if path is None:
        return None
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    try:
        return parse_service(data.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def _is_base_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    plain = not (parts.query or parts.fragment or parts.username or parts.password)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and plain and port != 0
