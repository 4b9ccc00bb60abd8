"""A stream that stalls but stays connected: while runs are under way, a stream that brought
no event but heartbeats for `silence` seconds is checked against the server (its busy
sessions, their finished calls) every `silence / 2`, and dropped, so resynced, when the
server has what the stream did not bring (`monitor.core.resync.missed_by_stream`)."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from monitor.core.monitor import Monitor
from monitor.core.resync import directories_to_ask, missed_by_stream
from monitor.errors import ServerError, SessionGone
from monitor.shell.api import OpencodeAPI
from monitor.shell.resync import bounded
from monitor.shell.stream import EventStream

__all__ = ["CHECK_SESSIONS_MAX", "SILENCE_S", "Silence"]

log = structlog.get_logger("monitor.shell.watch")

SILENCE_S = 30.0
# At most this many sessions' messages are read per check.
CHECK_SESSIONS_MAX = 64


class Silence:
    """When the stream last brought an event, and the check of a silence that lasts."""

    def __init__(
        self,
        api: OpencodeAPI,
        monitor: Monitor,
        directory: str | None,
        silence: float,
        clock: Callable[[], float],
    ) -> None:
        self._api = api
        self._monitor = monitor
        self._directory = directory
        self._silence = silence
        self._clock = clock
        self.last_event_at = clock()

    def heard(self) -> None:
        self.last_event_at = self._clock()

    async def check(self, stream: EventStream) -> None:
        """One check, after `silence / 2` (see the module)."""
        running = self._monitor.running()
        silent_s = self._clock() - self.last_event_at
        if not stream.connected or not running or silent_s < self._silence:
            return
        try:
            missed = await self._missed(running)
        except ServerError as exc:
            log.warning("stream.check_failed", error=str(exc))
            return
        self.heard()  # the next check comes a silence later
        if missed:
            log.warning("stream.stalled", sessions=missed, silent_s=round(silent_s, 1))
            stream.reconnect("stalled: the server ran what the stream did not show")

    async def _missed(self, running: dict[str, str | None]) -> list[str]:
        monitor, api = self._monitor, self._api
        directories = list(directories_to_ask(running, self._directory))
        busy = set().union(*await bounded(api.busy_sessions(d) for d in directories))
        ours = {
            view.session_id: view.run_calls
            for view in monitor.sessions_view()
            if view.session_id in running
        }
        ours = dict(list(ours.items())[:CHECK_SESSIONS_MAX])
        asked = [session_id for session_id in ours if session_id in busy]

        async def finished(session_id: str) -> int:
            try:
                route = monitor.route(session_id)
                messages = await api.messages(session_id, running[session_id], route=route)
                return monitor.finished_calls(messages)
            except SessionGone:
                return 0

        counts = await bounded(finished(session_id) for session_id in asked)
        return missed_by_stream(ours, busy, dict(zip(asked, counts, strict=True)))
