"""One acting monitor per server, and it is the one the plugin asks: any other is a standby.

Two monitors of one server that both act intervene twice on one loop: the first refuses the
loop's call in band, the second, which only sees the stream, aborts the run as well. So the
monitor that acts holds an advisory lock (`flock`) on a file named for the server, in the
folder of the plugin sockets (`decide.state_dir`); a monitor that finds it held is a
standby: it follows the stream and logs what it finds, acts on nothing, and tries the lock
again every poll. The kernel releases a lock when its holder exits, also on SIGKILL, so a
standby takes over within one poll of the acting monitor's end.

The file is named for the server, not for the URL's text (`server_key`): a host that
resolves to a loopback address (`localhost`, `127.0.0.1`, any of 127/8, `[::1]`) is this
machine's server on that port, whatever the spelling; another host is named by its address
(the lowest its name resolves to), or by its name when it does not resolve.

The monitor the plugin asks must be the acting one, or a loop gets two interventions: the
plugin's question refused by the one, the run aborted by the other. So a watch that serves
the plugin endpoint first holds a second lock, the server's endpoint lock, and then tries
the acting one; a watch without an endpoint does not take the acting lock while another
process holds the endpoint lock, checks again right after it took it (the two may start
together), and, acting, gives the role up at its next poll when an endpoint monitor has come
(`give_way`): the endpoint monitor, its standby for that moment, takes it within one poll.
Whoever starts first, the one the plugin asks acts.

`attach` acts for its one session: it acts only while no daemon holds the server's lock (it
is then the daemon's standby), and it holds a lock named for its session, which a daemon
checks at each poll (`Role.attached`) and, while it is held, leaves that session to it
(`Monitor.role` hears which: the shell decides nothing). It takes that lock while it holds
the server's, so no `attach` begins to act while a daemon holds it: the sessions a daemon
must check are those with a file when it took the lock, and it asks the file system about no
other.

Monitors see each other only through these files: two users or two machines are not seen as
one server, nor are one server's loopback and network addresses (`127.0.0.1` and the
machine's LAN address).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import structlog

from monitor.errors import ConfigError
from monitor.shell.endpoint import private_dir

__all__ = ["POLL_S", "Role", "poll_role", "role_view", "server_key", "take_role"]

log = structlog.get_logger("monitor.shell.watch")

# How often a standby tries to take over (the `--help` of `watch` says "within a second or two").
POLL_S = 1.0

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def server_key(url: str) -> str:
    """The server at `url`, as a file name: `loopback-PORT` for this machine's server on that
    port however it is spelled, else its address (or, unresolved, its name) and port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or "localhost"
    addresses = _addresses(host, port)
    if any(_is_loopback(address) for address in addresses):
        return f"loopback-{port}"
    # Sorted: a name with several addresses gives one key whatever order the resolver says.
    return _UNSAFE.sub("_", f"{min(addresses, default=host)}-{port}")


def _addresses(host: str, port: int) -> list[str]:
    """The addresses `host` stands for: itself when it is one, `localhost` without asking
    (RFC 6761: always this machine), else what the resolver says (none when it cannot)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    if host.lower().rstrip(".") == "localhost" or host.lower().endswith(".localhost"):
        return ["127.0.0.1"]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    # The scope of a link-local IPv6 address (`%eth0`) is not the server's.
    return sorted({str(info[4][0]).partition("%")[0] for info in found})


def _is_loopback(address: str) -> bool:
    """127/8, ::1, an IPv4 loopback written as IPv6, or the unspecified address (a connect to
    0.0.0.0 reaches this machine)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _try_lock(path: str | Path, create: bool) -> IO[str] | None:
    """The file at `path`, locked by us, or None when someone else holds it (or, without
    `create`, there is no such file: nobody ever locked it)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    file = os.fdopen(fd, "r+", encoding="utf-8")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    return file


class Role:
    """Whether this monitor acts, for which sessions, and who acts when it does not.
    `endpoint`: this monitor serves the plugin endpoint (a `watch`'s socket or TCP port), so
    it is the one to act (see the module)."""

    def __init__(
        self, folder: Path, url: str, session_id: str | None = None, endpoint: bool = False
    ) -> None:
        key = server_key(url)
        self._server = folder / f"acting-{key}.lock"
        self._endpoint_file = folder / f"endpoint-{key}.lock"
        self._attach_prefix = f"{folder}{os.sep}attach-{key}-"
        self._session_id = session_id
        self._wants_endpoint = endpoint and session_id is None
        self._held: IO[str] | None = None
        self._endpoint: IO[str] | None = None
        # A daemon's: the files of the `attach`es that may act, from when it took the lock.
        self._attaches: set[str] = set()

    @property
    def acting(self) -> bool:
        return self._held is not None

    @property
    def serves(self) -> bool:
        """Whether this monitor holds the server's endpoint lock: it is the one to serve
        the plugin endpoint (acting, or for a poll the standby of one without an endpoint)."""
        return self._endpoint is not None

    def try_acting(self) -> bool:
        """Take the lock that makes this monitor the acting one, if it is free and no other
        monitor serves the plugin endpoint: True when this monitor acts (now or already).
        A monitor with an endpoint takes the endpoint lock first (also while it acts: a
        moment's probe by another monitor may have kept it from it)."""
        if self._wants_endpoint and self._endpoint is None:
            self._endpoint = _try_lock(self._endpoint_file, create=True)
        if self._held is not None:
            return True
        if self._endpoint is None and self._endpoint_elsewhere():
            return False  # the monitor the plugin asks is to act
        if self._session_id is None:
            held = _try_lock(self._server, create=True)
            if held is not None and self._endpoint is None and self._endpoint_elsewhere():
                # An endpoint monitor started as this one took the lock: its role.
                held.close()
                return False
            if held is not None:
                self._attaches = self._attach_files()
        else:
            daemon = _try_lock(self._server, create=True)
            if daemon is None:
                return False  # a daemon acts for every session, this one too
            # Taken before the server's lock is let go: see the module.
            held = _try_lock(self._attached(self._session_id), create=True)
            daemon.close()
        if held is not None:
            # The lock is the flock, not the text: the pid is only for `status`, so a full
            # disk that refuses it costs the holder's name (read as unknown), never the role.
            # Written past the text layer, which would keep what it could not write and
            # raise again at close.
            with contextlib.suppress(OSError):
                os.ftruncate(held.fileno(), 0)
                os.pwrite(held.fileno(), f"{os.getpid()}\n".encode("ascii"), 0)
        self._held = held
        return held is not None

    def give_way(self) -> bool:
        """At each poll of an acting daemon without the endpoint: when another process holds
        the endpoint lock, let the acting lock go (True) for that monitor to take it."""
        if self._held is None or self._endpoint is not None or self._session_id is not None:
            return False
        if not self._endpoint_elsewhere():
            return False
        with contextlib.suppress(OSError):
            os.ftruncate(self._held.fileno(), 0)  # no longer the pid of who acts (`status`)
        self._held.close()
        self._held = None
        self._attaches = set()
        return True

    def attached(self) -> frozenset[str]:
        """The sessions an `attach` acts for now, which a daemon that acts leaves to it: of
        those with a file when it took the lock, the ones whose lock is held. Asked at each
        poll (`Monitor.role`): no system call when no `attach` had a file then."""
        if self._held is None or self._session_id is not None:
            return frozenset()
        prefix = self._attach_prefix
        return frozenset(
            path[len(prefix) : -len(".lock")]
            for path in sorted(self._attaches)
            if self._attach_holds(path)
        )

    def _attach_holds(self, path: str) -> bool:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            self._attaches.discard(path)  # that attach ended
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # an `attach` holds it
        finally:
            os.close(fd)  # our lock, if taken, goes with it
        return False

    def holder(self) -> int | None:
        """The process id the daemon acting for this server wrote, as far as it can be read
        (None from an `attach` of another session too: only the daemon's file is read)."""
        try:
            text = self._server.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        if self._held is None:
            return
        if self._session_id is not None:
            # One file per attached session would pile up; the daemon reads a missing one
            # as nobody's.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._attached(self._session_id))
        self._held.close()
        self._held = None

    def _endpoint_elsewhere(self) -> bool:
        """Whether another process holds the server's endpoint lock. Probed with a shared
        lock, let go at once: probes of several monitors do not see each other as holders.
        A file never made: nobody ever held it."""
        try:
            fd = os.open(self._endpoint_file, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def _attach_files(self) -> set[str]:
        folder, _, prefix = self._attach_prefix.rpartition(os.sep)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return set()
        return {f"{folder}{os.sep}{name}" for name in names if name.startswith(prefix)}

    def _attached(self, session_id: str) -> str:
        return f"{self._attach_prefix}{_UNSAFE.sub('_', session_id)}.lock"


def _session_field(session_id: str | None) -> dict[str, str]:
    """`attach`'s session, for the role's lines; `watch` acts for every session: none."""
    return {} if session_id is None else {"session_id": session_id}


def take_role(folder: Path, url: str, session_id: str | None, endpoint: bool) -> Role | None:
    """Act, or stand by for the monitor that acts for this server; None (unguarded) when the
    folder of the locks cannot be made private."""
    try:
        private_dir(folder)
    except (ConfigError, OSError) as exc:
        log.warning("monitor.unguarded", folder=str(folder), reason=str(exc))
        return None
    role = Role(folder, url, session_id, endpoint)
    if role.try_acting():
        log.info("monitor.acting", **_session_field(session_id))
    else:
        log.warning(
            "monitor.standby",
            acting_pid=role.holder(),
            **_session_field(session_id),
            message="another monitor acts for this server: this one logs the loops it "
            "finds and takes over when that one stops",
        )
    return role


def poll_role(role: Role, session_id: str | None) -> None:
    """One poll: a standby tries to take over from the acting monitor; an acting one without
    the plugin endpoint gives the role to one with it."""
    was_acting = role.acting
    if role.give_way():
        log.warning(
            "monitor.gave_way",
            message="a monitor serving the plugin endpoint watches this server: it acts "
            "from its next poll, this one stands by",
        )
    elif role.try_acting() and not was_acting:
        log.warning("monitor.took_over", **_session_field(session_id))


def role_view(role: Role | None, dry_run: bool) -> dict[str, object]:
    """Whether this monitor acts (`status`): `standby` names the one that does."""
    if role is None:
        return {"state": "dry run" if dry_run else "unguarded"}
    if role.acting:
        return {"state": "acting"}
    return {"state": "standby", "acting_pid": role.holder()}
