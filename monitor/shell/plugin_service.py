"""The plugin endpoint of a watch: the `DecideServer` it serves, its questions handed to
`Monitor` and the commands that come back handed to the watch's executor."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from monitor.core.commands import Command
from monitor.core.monitor import Monitor
from monitor.core.plugin_protocol import PluginCall, PluginVerdict, RequestRefused
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import EndpointTaken, PluginEndpoint

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

    async def close(self) -> None:
        if self.server is not None:
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
