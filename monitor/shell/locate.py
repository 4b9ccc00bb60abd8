"""Which server a watch talks to, found before every connect (`--api`), and said once its
stream has answered."""

from __future__ import annotations

import structlog

from monitor.config import public_url
from monitor.core.monitor import Monitor
from monitor.core.server import ServerKind
from monitor.errors import ServerError
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.stream import stream_url

__all__ = ["Locator"]

log = structlog.get_logger("monitor.shell.watch")


class Locator:
    def __init__(self, api: EngineAPI, monitor: Monitor, url: str, directory: str | None) -> None:
        self._api = api
        self._monitor = monitor
        self._url = url
        self._directory = directory
        self.server: ServerKind | None = None  # what the last stream that answered speaks
        self._locating: ServerKind | None = None  # what the connect under way speaks

    async def locate(self) -> str:
        """Before every connect: which server this is, and so which stream."""
        try:
            kind = await self._api.detect()
        except ServerError:
            # Down, starting or failing: the stream's own connect says so, with its hint.
            kind = self.server or self._api.server
        self._locating = kind
        self._monitor.server(kind)
        return stream_url(self._url, self._directory, api=kind.api_stream)

    def say(self) -> None:
        """`server.detected` once the stream of what `locate` found has answered. Before,
        nothing shows that an OpenCode server is there: a dead port or a failed TLS handshake
        fails the health routes, and another web server answers them as a 1.x old enough to
        have none would."""
        kind, before = self._locating, self.server
        if kind is None or kind == before:
            return
        self.server = kind
        url = stream_url(self._url, self._directory, api=kind.api_stream)
        log.info(
            "server.detected",
            **kind.log_fields(),
            stream=public_url(url),
            changed=before is not None,
        )
