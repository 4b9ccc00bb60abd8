"""OpenCode 2's background service, found where OpenCode registers it.

Every `opencode` command given neither `--server` nor `--standalone` (the TUI, `run`, even
`opencode models`) starts one shared server, `opencode serve --service`, on loopback with a
generated password, and registers it in `$XDG_STATE_HOME/opencode/service.json`
(`{id, version, url, pid, password}`, removed by `opencode service stop`; seen on the real
2.2.5, ../shared/opencode/V2-REAL-NOTES.md). A 2.x user never types its URL nor its password:
a monitor given no `--url` reads them here at every connect, so it follows the service when it
restarts on a new port with a new password. The password is kept out of every `repr`, log
line and error.

A registration is followed only when it is surely the user's own and names this machine: a
file that another user owns, that others may write, or that is a symbolic link could have been
put there to send the monitor (and a password) elsewhere, and a service off loopback is one
the user never started with the default command. Each is refused with a sentence that says why
(`Refusal`); a remote one is followed only when the user asks (the setting `remote_service`).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "Refusal",
    "Registry",
    "Service",
    "is_loopback",
    "parse_service",
    "read_service",
    "service_file",
]

# Larger than any registration OpenCode writes (about 200 bytes): a file past it is not one.
MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Service:
    """A registered background service: where it listens and the password it takes."""

    url: str
    password: str | None = field(default=None, repr=False)
    pid: int | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A registration that is not followed, and why, in a sentence for the user."""

    reason: str


@dataclass(frozen=True, slots=True)
class Registry:
    """Where a watch given no `--url` looks for the service before every connect. `remote`:
    a service off loopback is followed (`remote_service`). `refused`: why the registration was
    refused at start (said then as `config.warning`; `service.refused` says a new reason).
    Only a registration followed moves the watch; none, or one refused, leaves it where it is,
    with the password that goes there."""

    path: Path
    remote: bool = False
    refused: str | None = None


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


def read_service(
    path: Path | None, *, remote: bool = False, uid: int | None = None
) -> Service | Refusal | None:
    """The service registered at `path`; None when there is none (no such file: no service
    runs) or it cannot be read or names none (`parse_service`); a `Refusal` when it is not
    surely this user's (`uid`, by default this process's), or names a host off loopback and
    `remote` is not set. The file is opened without following a link and judged by what was
    opened, so it cannot be swapped between the check and the read."""
    if path is None:
        return None
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return Refusal(f"{path} is a symbolic link, not OpenCode's own file: not followed")
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return None
        refusal = _untrusted(path, info, os.geteuid() if uid is None else uid)
        if refusal is not None:
            return refusal
        data = _read(descriptor)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    if len(data) > MAX_BYTES:
        return None
    try:
        service = parse_service(data.decode("utf-8"))
    except UnicodeDecodeError:
        return None
    host = None if service is None else urlsplit(service.url).hostname
    if host is not None and not remote and not is_loopback(host):
        return Refusal(
            f"{path} names a service at {host}, not on this machine's loopback: not followed, "
            "and its password not sent there (remote_service to follow it)"
        )
    return service


def _read(descriptor: int) -> bytes:
    """Up to one byte past MAX_BYTES of the open file."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BYTES:
        chunk = os.read(descriptor, MAX_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _untrusted(path: Path, info: os.stat_result, uid: int) -> Refusal | None:
    """Why a registration file someone else could have written is refused, if it is."""
    if info.st_uid != uid:
        return Refusal(f"{path} belongs to another user (uid {info.st_uid}): not followed")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Refusal(f"{path} is writable by other users (chmod go-w): not followed")
    return None


def is_loopback(host: str) -> bool:
    """Whether `host` is loopback: `localhost` or an address of 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _is_base_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    plain = not (parts.query or parts.fragment or parts.username or parts.password)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and plain and port != 0
