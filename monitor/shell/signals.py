"""Signals that must not end the daemon: their default action kills it silently, its socket
left behind. SIGHUP, what a closed terminal and many operators' "reload" send, is ignored with
a line saying so (the settings are read once: a reload would rebuild every session's
tracking); SIGUSR1 logs what /status says (`monitor.status`); SIGUSR2 is ignored. SIGTERM and
SIGINT stop the watch (`Watch._run`)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import structlog

__all__ = ["HUP_IGNORED", "catch_signals", "log_status"]

log = structlog.get_logger("monitor.shell.watch")

HUP_IGNORED = "reloading is not offered: restart the monitor to apply changed settings"
USR2_IGNORED = "SIGUSR2 has no meaning here"
# Sessions a `monitor.status` line lists (held first, then busy): a log line stays short.
STATUS_LINE_SESSIONS = 10


def catch_signals(loop: asyncio.AbstractEventLoop, status: Callable[[], dict[str, object]]) -> None:
    loop.add_signal_handler(signal.SIGHUP, _ignore, "SIGHUP", HUP_IGNORED)
    loop.add_signal_handler(signal.SIGUSR2, _ignore, "SIGUSR2", USR2_IGNORED)
    loop.add_signal_handler(signal.SIGUSR1, lambda: log_status(status()))


def _ignore(name: str, reason: str) -> None:
    log.warning("signal.ignored", signal=name, reason=reason)


def log_status(status: dict[str, object]) -> None:
    """What /status says, as one `monitor.status` line (SIGUSR1): ids, names, counts and
    states, never an argument or a password; at most STATUS_LINE_SESSIONS sessions."""
    sessions = status["sessions"]
    assert isinstance(sessions, list)
    omitted = status["sessions_omitted"]
    assert isinstance(omitted, int)
    status["sessions"] = sessions[:STATUS_LINE_SESSIONS]
    status["sessions_omitted"] = omitted + len(sessions[STATUS_LINE_SESSIONS:])
    log.info("monitor.status", **status)
