"""The waits and the clock of a watch, and which sessions it follows (`Scope`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from monitor.core.plugin_stats import UNASKED_AFTER_S
from monitor.shell.acting import POLL_S as TAKEOVER_POLL_S
from monitor.shell.actions import random_stagger
from monitor.shell.api import OpencodeAPI, Retry
from monitor.shell.backoff import Backoff
from monitor.shell.silence import SILENCE_S
from monitor.shell.stream import READ_TIMEOUT_S, RECONNECT
from monitor.shell.webhook import Delivery

__all__ = ["AllSessions", "Scope", "Timing"]

# SIGTERM to exit must stay under 5 s: in-flight aborts get this long to finish.
DRAIN_S = 3.0
# How long a loop `attach` finds at a call's start waits for that call's end: a plugin that
# asks no monitor refuses the call by its own rule within milliseconds of its start.
OWN_REFUSAL_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class Timing:
    """The waits and the clock of the shell; tests shorten or replace them, the defaults suit
    a real server."""

    read_timeout: float = READ_TIMEOUT_S
    reconnect: Backoff = RECONNECT
    retry: Retry = Retry()
    drain: float = DRAIN_S
    # No event (heartbeats aside) for this long while runs are under way: ask the server.
    silence: float = SILENCE_S
    webhook: Delivery = Delivery()
    # Tool calls with no plugin asking for this long: say so (`plugin.not_asking`).
    unasked: float = UNASKED_AFTER_S
    # How long `attach` waits to see whether a plugin refused a loop's call (OWN_REFUSAL_WAIT_S).
    own_refusal: float = OWN_REFUSAL_WAIT_S
    # How often a standby tries to take over from the acting monitor (monitor.shell.acting).
    takeover: float = TAKEOVER_POLL_S
    # How long the feedback waits after an abort (see monitor.shell.actions.STAGGER_S).
    stagger: Callable[[], float] = random_stagger
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic


class Scope(Protocol):
    """Which sessions a watch follows, and when following them is over."""

    @property
    def only_session(self) -> str | None:
        """The one session followed, or None for all; read once, when the watch starts."""
        ...

    async def still_there(self, api: OpencodeAPI, route: int) -> bool:
        """On every (re)connect: False when there is nothing left to follow. `route`: the
        one session's, as the core names it (`Tracker.route`)."""
        ...

    @property
    def found_engine(self) -> int:
        """The engine the one session followed was found to run on when it was looked up,
        before the stream shows it (2: the new one, whose actions and read-backs take the
        `/api` routes), else 1."""
        ...


class AllSessions:
    """The daemon's scope: every session, for ever."""

    only_session = None

    async def still_there(self, api: OpencodeAPI, route: int) -> bool:
        return True

    found_engine = 1
