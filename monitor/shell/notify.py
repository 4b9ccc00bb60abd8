"""Tell systemd how the daemon is doing: the sd_notify protocol, without libsystemd.

The protocol is one datagram of newline-separated ``KEY=VALUE`` lines sent to the
AF_UNIX socket named in ``$NOTIFY_SOCKET`` (see sd_notify(3)). It is small enough
that a dependency would cost more than these lines, and no maintained package
offers it.

Everything here is safe to call outside systemd: without ``$NOTIFY_SOCKET`` the
notifier does nothing, so callers never branch on how they were started. A failed
send is counted and otherwise ignored, because a lost status line must never take
down the monitor.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from typing import NoReturn

__all__ = ["Notifier", "encode", "socket_address", "watchdog_interval", "watchdog_pings"]


def encode(fields: Mapping[str, str | int]) -> bytes:
    """The datagram carrying ``fields``, one ``KEY=VALUE`` line each.

    A newline inside a value would start a new assignment on systemd's side, so an
    error message in STATUS could otherwise forge READY=1 or STOPPING=1; newlines
    become spaces instead.
    """
    lines = (f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
    return "\n".join(lines).encode()


def socket_address(notify_socket: str) -> str | None:
    """The address to send to, or None when ``$NOTIFY_SOCKET`` names no AF_UNIX socket.

    A leading ``@`` names a socket in the abstract namespace, whose kernel name
    starts with a NUL byte. Anything other than an absolute path or ``@name``
    (for instance newer systemd's ``vsock:`` addresses) is not ours to handle;
    libsystemd rejects it the same way.
    """
    if notify_socket.startswith("@") and len(notify_socket) > 1:
        return "\0" + notify_socket[1:]
    if notify_socket.startswith("/"):
        return notify_socket
    return None


class Notifier:
    """Sends state changes to the service manager, or nothing when there is none."""

    __slots__ = ("address", "failures")

    def __init__(self, address: str | None) -> None:
        self.address = address
        # Failed sends so far. The daemon may log this; it never raises.
        self.failures = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET``, or a no-op one when it is unset or unusable."""
        notify_socket = environ.get("NOTIFY_SOCKET", "")
        return cls(socket_address(notify_socket) if notify_socket else None)

    def ready(self) -> None:
        """Startup is finished: configuration read and the event stream open."""
        self.send(READY=1)

    def status(self, text: str) -> None:
        """A one-line description shown by ``systemctl status``."""
        self.send(STATUS=text)

    def watchdog(self) -> None:
        """Proof of life; systemd kills the service when these stop for WatchdogSec."""
        self.send(WATCHDOG=1)

    def stopping(self) -> None:
        """Shutdown has begun, so systemd reports "deactivating" rather than a crash."""
        self.send(STOPPING=1)

    def send(self, **fields: str | int) -> None:
        """Send ``fields`` in one datagram, e.g. ``send(READY=1, STATUS="streaming")``."""
        if self.address is None:
            return
        # A fresh socket per message, as libsystemd does: nothing to close at exit,
        # and nothing stale if systemd re-executes and recreates its socket. Non-blocking
        # so a full receive queue on systemd's side costs a message, not a stalled loop.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as sock:
                sock.sendto(encode(fields), self.address)
        except OSError:
            self.failures += 1


def watchdog_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between watchdog pings, or None when systemd expects none.

    Pinging at half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3) recommends,
    lets one ping come late without systemd giving up. ``$WATCHDOG_PID`` names
    the process the watchdog is meant for; a child that inherited the environment
    must not ping on its parent's behalf.
    """
    if "WATCHDOG_PID" in environ and _whole_number(environ["WATCHDOG_PID"]) != os.getpid():
        return None
    usec = _whole_number(environ.get("WATCHDOG_USEC", ""))
    if not usec:
        return None
    return usec / 2 / 1_000_000


def _whole_number(text: str) -> int | None:
    # isdigit() alone admits digits like "²" that int() rejects.
    return int(text) if text.isascii() and text.isdigit() else None


async def watchdog_pings(notifier: Notifier, interval: float) -> NoReturn:
    """Ping the watchdog every ``interval`` seconds until cancelled.

    This is a coroutine on the daemon's own event loop on purpose: a thread would
    keep pinging while the loop is stuck, and a stuck loop is exactly what the
    watchdog is there to catch.
    """
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval)
