"""Which server a watch talks to, found before every connect (`--api`), and said once its
stream has answered. Given no `--url`, OpenCode 2's background service is looked for in its
registration at every connect (monitor/service.py): a service restarted on another port with
another password is followed there. A registration refused (another user's, writable by
others, a link, off loopback) is never followed: the watch stays where it was, with the
password that goes there, and `service.refused` says why each time the reason changes."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from monitor.config import public_url
from monitor.core.monitor import Monitor
from monitor.core.server import ServerKind
from monitor.errors import ServerError
from monitor.service import Refusal, Registry, Service, read_service
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.stream import stream_url

__all__ = ["Locator"]

log = structlog.get_logger("monitor.shell.watch")


class Locator:
    """`service`: where the background service is registered, when no `--url` was given;
    `authorize(password)` gives every later request the password; `server_pid(pid)` is told
    the server's process as each connect finds it."""

    def __init__(
        self,
        api: EngineAPI,
        monitor: Monitor,
        url: str,
        directory: str | None,
        service: Registry | None = None,
        authorize: Callable[[str | None], None] = lambda password: None,
        server_pid: Callable[[int | None], None] = lambda pid: None,
    ) -> None:
        self._api = api
        self._monitor = monitor
        self._url = url
        self._directory = directory
        self._service = service
        # Why the registration is refused, as last said (at start, by `config.warning`).
        self._refused = None if service is None else service.refused
        self._authorize = authorize
        self._server_pid = server_pid
        self.server: ServerKind | None = None  # what the last stream that answered speaks
        self._locating: ServerKind | None = None  # what the connect under way speaks

    @property
    def url(self) -> str:
        """The server's base URL as the last connect found it."""
        return self._url

    def _follow_service(self) -> None:
        """Where the registered service listens now, with its password; where none is
        registered (stopped, restarting, or not started yet) or it is refused, where the
        watch was: the service it followed last, else the URL given by default."""
        service = self._service
        if service is None:
            return
        registered = read_service(service.path, remote=service.remote)
        refused = registered.reason if isinstance(registered, Refusal) else None
        if refused is not None and refused != self._refused:
            log.warning("service.refused", reason=refused)
        self._refused = refused
        if not isinstance(registered, Service):
            # None (stopped, or restarting) or refused: where it was, with what goes there.
            return
        url = registered.url
        # The service's password goes with its URL, to nowhere else.
        self._authorize(registered.password)
        if url != self._url:
            log.info("server.moved", url=public_url(url), before=public_url(self._url))
            self._url = url
            self._api.retarget(url)

    async def locate(self) -> str:
        """Before every connect: which server this is, and so which stream."""
        self._follow_service()
        try:
            kind = await self._api.detect()
        except ServerError:
            # Down, starting or failing: the stream's own connect says so, with its hint.
            kind = self.server or self._api.server
        self._locating = kind
        self._monitor.server(kind)
        self._server_pid(kind.pid)
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
