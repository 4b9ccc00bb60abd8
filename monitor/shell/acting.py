"""One acting monitor per server: any other monitor of it is a standby.

Two monitors of one server that both act intervene twice on one loop: the first refuses the
loop's call in band, the second, which only sees the stream, aborts the run as well. So the
monitor that acts holds an advisory lock (`flock`) on a file named for the server, in the
folder of the plugin sockets (`decide.state_dir`); a monitor that finds it held is a
standby: it follows the stream and logs what it finds, acts on nothing, and tries the lock
again every poll. The kernel releases a lock when its holder exits, also on SIGKILL, so a
standby takes over within one poll of the acting monitor's end.

`attach` acts for its one session: it acts only while no daemon holds the server's lock (it
is then the daemon's standby), and it holds a lock named for its session, which a daemon
checks before it acts on that session. It takes that lock while it holds the server's, so no
`attach` begins to act while a daemon holds it: the sessions a daemon must check are those
with a file when it took the lock, and it asks the file system about no other.

Monitors see each other only through these files: two users, two machines, or one server
reached by two spellings of its URL (`localhost`, `127.0.0.1`) are not seen as one server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

__all__ = ["POLL_S", "Role"]

# How often a standby tries to take over (the `--help` of `watch` says "within a second or two").
POLL_S = 1.0

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _server_key(url: str) -> str:
    """The server, as a file name: its host and port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _UNSAFE.sub("_", f"{parts.hostname or 'localhost'}-{port}")


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
    """Whether this monitor acts, for which sessions, and who acts when it does not."""

    def __init__(self, folder: Path, url: str, session_id: str | None = None) -> None:
        key = _server_key(url)
        self._server = folder / f"acting-{key}.lock"
        self._attach_prefix = f"{folder}{os.sep}attach-{key}-"
        self._session_id = session_id
        self._held: IO[str] | None = None
        # A daemon's: the files of the `attach`es that may act, from when it took the lock.
        self._attaches: set[str] = set()

    @property
    def acting(self) -> bool:
        return self._held is not None

    def try_acting(self) -> bool:
        """Take the lock that makes this monitor the acting one, if it is free: True when
        this monitor acts (now or already)."""
        if self._held is not None:
            return True
        if self._session_id is None:
            held = _try_lock(self._server, create=True)
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

    def acts_for(self, session_id: str) -> bool:
        """Whether this monitor carries out decisions on `session_id`: a daemon leaves a
        session to the `attach` that acts for it."""
        if self._held is None:
            return False
        if self._session_id is not None:
            return session_id == self._session_id
        # Asked before every intervention, ahead of its first request: no system call for a
        # session no `attach` may act for (one costs 0.1 ms on a CPU idle a moment before).
        path = self._attached(session_id)
        if path not in self._attaches:
            return True
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            self._attaches.discard(path)  # that attach ended
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # an `attach` holds it
        finally:
            os.close(fd)  # our lock, if taken, goes with it
        return True

    def holder(self) -> int | None:
        """The process id the daemon acting for this server wrote, as far as it can be read
        (None from an `attach` of another session too: only the daemon's file is read)."""
        try:
            text = self._server.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def close(self) -> None:
        if self._held is None:
            return
        if self._session_id is not None:
            # One file per attached session would pile up; the daemon reads a missing one
            # as nobody's.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._attached(self._session_id))
        self._held.close()
        self._held = None

    def _attach_files(self) -> set[str]:
        folder, _, prefix = self._attach_prefix.rpartition(os.sep)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return set()
        return {f"{folder}{os.sep}{name}" for name in names if name.startswith(prefix)}

    def _attached(self, session_id: str) -> str:
        return f"{self._attach_prefix}{_UNSAFE.sub('_', session_id)}.lock"
