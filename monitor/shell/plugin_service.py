"""The plugin endpoint of a watch: the `DecideServer` it serves, its questions handed to
`Monitor` and the commands that come back handed to the watch's executor."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import structlog

from monitor.core.commands import Command
from monitor.core.monitor import Monitor
from monitor.core.plugin_protocol import PluginCall, PluginVerdict, RequestRefused
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import (
    EndpointTaken,
    PluginEndpoint,
    link_server_pid,
    unlink_server_pid,
)

__all__ = ["PluginService"]

log = structlog.get_logger("monitor.shell.watch")


class PluginService:
    """Serves the plugin endpoint once `start` is called; `following(session, directory)`
    says whether a session's run is known (not being read back)."""

    def __init__(
        self,
        monitor: Monitor,
        execute: Callable[[Sequence[Command]], None],
        following: Callable[[str, str | None], bool],
        clock: Callable[[], float],
    ) -> None:
        self._monitor = monitor
        self._execute = execute
        self._following = following
        self._clock = clock
        self.server: DecideServer | None = None
        # Another monitor of this server serves its plugin (the endpoint was taken).
        self.elsewhere = False
        # The watched server's process id (2.x's `/api/info`), and the one the endpoint is
        # named after for its plugin (`link_server_pid`).
        self._pid: int | None = None
        self._linked: int | None = None

    async def start(self, endpoint: PluginEndpoint, unasked_after: float) -> None:
        server = DecideServer(endpoint, self.judge, self._asked, self._refused, self._late)
        try:
            await server.start()
        except EndpointTaken as exc:
            # A second monitor of the same server: the first answers its plugins.
            log.warning("plugin.endpoint_taken", reason=str(exc))
            self.elsewhere = True
            return
        self.server = server
        self._monitor.serving_plugins(_address(server), unasked_after)
        self._link()

    def server_pid(self, pid: int | None) -> None:
        """The process of the server watched, as the last connect found it: OpenCode 2 gives
        its plugin no URL, and the plugin, which runs in that process, finds this endpoint
        by its pid (monitor/plugin/loop-guard.ts)."""
        self._pid = pid
        self._link()

    def _link(self) -> None:
        pid, server = self._pid, self.server
        if pid is None or server is None or pid == self._linked:
            return
        try:
            link = link_server_pid(server.endpoint, pid)
        except OSError as exc:
            # The plugin still finds the socket of its server's port.
            log.warning("plugin.link_failed", server_pid=pid, error=exc.strerror)
            return
        self._linked = pid
        if link is not None:
            log.info("plugin.linked", server_pid=pid, link=str(link))

    async def close(self) -> None:
        if self.server is not None:
            if self._linked is not None:
                # Before the socket goes: no plugin is led to a socket no one serves.
                with contextlib.suppress(OSError):
                    unlink_server_pid(self.server.endpoint, self._linked)
            await self.server.close()

    def address(self) -> str | None:
        """Where a plugin reaches the endpoint served, as `status` and the logs say it."""
        return None if self.server is None else _address(self.server)

    def judge(self, call: PluginCall) -> PluginVerdict | RequestRefused:
        """The plugin's question about one call."""
        following = self._following(call.session_id, call.directory)
        answer, commands = self._monitor.question(call, following)
        self._execute(commands)
        return answer

    def _asked(self, call: PluginCall, verdict: PluginVerdict) -> None:
        self._execute(self._monitor.answered(call, verdict, time.time()))

    def _late(self, call: PluginCall) -> None:
        self._execute(self._monitor.late(call, time.time()))

    def _refused(self, refused: RequestRefused) -> None:
        self._execute(self._monitor.refused(refused, self._clock()))


def _address(server: DecideServer) -> str:
    endpoint = server.endpoint
    if endpoint.socket is not None:
        return f"unix:{endpoint.socket}"
    return f"http://{endpoint.host}:{server.port}"
