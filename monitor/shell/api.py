"""The OpenCode REST calls the monitor makes, with bounded retries.

A request is sent again only when it surely did not arrive (the connection was never made)
or when sending it twice does no harm (GET, abort). `prompt_async` adds a message each time
the server takes it: after a failure that leaves open whether it arrived (a timeout, a 5xx,
a dropped connection), the session's messages are read first, and the feedback is sent
again only if it is not among them. The request timeout counts from the moment a
connection is ours: waiting for one of the pool's connections behind a slow server delays a
request, it never times it out (a timed-out request the server already had would be sent
twice).

Redirects are never followed: a 3xx is a `ServerError` that says so. A 404 of a session's
own route means the session is gone (`SessionGone`); of any other route it is `Refused` with
status 404. A 401 means our credentials are wrong (`CredentialsRefused`, a `ConfigError`,
never retried), anything else is a `ServerError` (monitor/errors.py). Only ids and status codes
go into errors. Ids are checked against OpenCode's shapes (`monitor.core.ids`) and every
path segment is percent-encoded, dots included, so no id can reach another endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
from yarl import URL

from monitor.config import Settings
from monitor.core.export import feedback_delivered
from monitor.core.frames import loads
from monitor.core.ids import is_permission_id, is_session_id
from monitor.errors import (
    CredentialsRefused,
    MalformedId,
    Refused,
    ServerAway,
    ServerError,
    SessionGone,
)
from monitor.shell.backoff import Backoff
from monitor.shell.diagnosis import refused_credentials
from monitor.shell.stream import READ_BUFSIZE

__all__ = [
    "OpencodeAPI",
    "Retry",
    "WEB_PAGE",
    "authorize",
    "basic_auth_header",
    "http_session",
    "path_segment",
    "session_path",
]


@dataclass(frozen=True, slots=True)
class Retry:
    attempts: int = 4
    backoff: Backoff = Backoff(initial=0.2, cap=2.0)
    timeout: float = 10.0


class _Failing(ServerError):
    """A 5xx: a failure that may pass; the server may or may not have taken the request."""


class _NotSent(ServerAway):
    """The connection was never made: the server surely did not get the request."""


class _Unanswered(ServerAway):
    """Sent, and no answer came (timeout, dropped connection): the server may still act."""


class _WebPage(Refused):
    """A web page answered where OpenCode's JSON was asked for: 2.x's web app on a path outside
    `/api`, or a page of a proxy in front of the server. Not this server's route, as a 404
    would say, but never a sign that someone else acted (a permission answered first)."""


# What may pass: worth another try, or a look whether it arrived.
_TRANSIENT = (_Failing, ServerAway)
# What a route that answered the web app's page (not JSON) is said to have done.
WEB_PAGE = (
    "answered a web page, not OpenCode's API (an OpenCode 2 server serves its API under /api "
    "only: --api auto or 2)"
)
_SESSION_ROUTE = re.compile(r"(?:/api)?/session/([^/]+)(?:/|$)")


def _names_session(path: str) -> bool:
    """Whether `path` is a session's own route (`/session/ses_...`, `/api/session/ses_...`):
    only there does a 404 mean the session is gone; elsewhere it is the route's own answer."""
    route = _SESSION_ROUTE.match(path)
    return route is not None and is_session_id(unquote(route.group(1)))


def basic_auth_header(user: str, password: str) -> dict[str, str]:
    """The header `opencode serve` wants when it runs with OPENCODE_SERVER_PASSWORD.

    Built by hand: aiohttp 3.14 deprecates its BasicAuth helper.
    """
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return {"Authorization": f"Basic {token}"}


def path_segment(text: str) -> str:
    """`text` as one path segment: `quote` leaves "." alone, and "/session/../abort" is
    "/abort" to every URL parser on the way."""
    return quote(text, safe="", errors="strict").replace(".", "%2E")


def session_path(session_id: str, action: str = "", root: str = "/session") -> str:
    """The path of a session's route (`root`: `/api/session` for a new-engine session's)."""
    # Session ids come from the stream, the server or the command line.
    if not is_session_id(session_id):
        raise MalformedId("session id is not of the shape ses_...")
    path = f"{root}/{path_segment(session_id)}"
    return f"{path}/{action}" if action else path


class OpencodeAPI:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        retry: Retry = Retry(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`headers` go with every request, on top of the session's own: the kit's callers
        share one session between servers with and without a password."""
        self._http = http
        # Encoded once; paths are appended already encoded, so nothing decodes "%2E" again.
        self._base = str(URL(base_url.rstrip("/")))
        self._retry = retry
        self._sleep = sleep
        self._headers = dict(headers or {})

    def retarget(self, base_url: str) -> None:
        """Send every later request to `base_url` (a background service that restarted on
        another port, `Locator`)."""
        self._base = str(URL(base_url.rstrip("/")))

    async def abort(self, session_id: str, directory: str | None, *, route: int) -> None:
        """Abort the session's run. `route` (here and below): which engine's routes, as the
        core says (`Intervene.route`, `Tracker.route`): 1 the 1.x `/session/...` ones, all this
        client serves; `EngineAPI` maps 2 to the new engine's `/api/session/...`."""
        # Idempotent: aborting an aborted run answers true and changes nothing.
        await self._call("POST", session_path(session_id, "abort"), directory, idempotent=True)

    async def prompt(
        self,
        session_id: str,
        directory: str | None,
        text: str,
        no_reply: bool = False,
        after_part: str = "",
        *,
        route: int,
    ) -> None:
        """Add a user message once; with `no_reply` it is stored and no answer starts.

        `after_part` is the tool part the message answers: a copy stored after it means an
        earlier attempt arrived, and nothing is sent again.
        """
        body: dict[str, Any] = {"parts": [{"type": "text", "text": text}]}
        if no_reply:
            body["noReply"] = True

        async def arrived() -> bool:
            messages = await self.messages(session_id, directory, route=1)
            return feedback_delivered(messages, text, after_part)

        path = session_path(session_id, "prompt_async")
        await self._call("POST", path, directory, body, idempotent=False, arrived=arrived)

    @property
    def shows_toasts(self) -> bool:
        """Whether the server has the TUI's toast route (`EngineAPI`: as its kind says)."""
        return True

    async def show_toast(self, directory: str | None, body: Mapping[str, Any]) -> Any:
        """Once, never again: a toast shown twice is worse than none. The server's answer."""
        params = {"directory": directory} if directory else None
        return await self._once("POST", "/tui/show-toast", params, dict(body))

    async def create_session(
        self, directory: str | None, title: str | None = None
    ) -> dict[str, Any]:
        """A new session's info (with its `id`); the monitor never makes one, its kit does."""
        body = {"title": title} if title else {}
        info = await self._call("POST", "/session", directory, body, idempotent=False)
        if not isinstance(info, dict) or not isinstance(info.get("id"), str):
            raise ServerError("POST /session did not answer an object with an id")
        return info

    async def sessions(self, directory: str | None) -> list[Any]:
        """The project's sessions; the kit asks for them to see that a new server is up."""
        sessions = await self._call("GET", "/session", directory, idempotent=True)
        if not isinstance(sessions, list):
            raise ServerError("/session did not answer a list")
        return sessions

    async def server_directory(self) -> str:
        """The folder the server was started in, as it names it (its sessions' `directory`)."""
        paths = await self._call("GET", "/path", None, idempotent=True)
        if not isinstance(paths, dict) or not isinstance(paths.get("directory"), str):
            raise ServerError("/path did not answer an object with a directory")
        return str(paths["directory"])

    async def reply_permission(
        self,
        request_id: str,
        directory: str | None,
        reply: str,
        message: str | None = None,
        session_id: str | None = None,
        *,
        route: int,
    ) -> bool:
        """Answer a permission request; False when it was answered already (404).

        `session_id`, the session that asks, is not part of a 1.x route; `EngineAPI` needs it
        for a new-engine session's."""
        body: dict[str, Any] = {"reply": reply}
        if message is not None:
            body["message"] = message
        if not is_permission_id(request_id):
            raise MalformedId("permission request id is not of the shape per_...")
        path = f"/permission/{path_segment(request_id)}/reply"
        try:
            # Not idempotent: a second copy of an answer that arrived would meet a 404, which
            # reads as "someone answered first".
            await self._call("POST", path, directory, body, idempotent=False)
        except _WebPage:
            raise  # not the server's answer at all: nobody is known to have answered
        except Refused as exc:
            if exc.status != 404:
                raise
            return False
        return True

    async def pending_permissions(self, directory: str | None) -> list[dict[str, Any]]:
        """The permission requests nobody has answered yet (the stream does not replay them)."""
        pending = await self._call("GET", "/permission", directory, idempotent=True)
        if not isinstance(pending, list):
            raise ServerError("/permission did not answer a list")
        return [request for request in pending if isinstance(request, dict)]

    async def statuses(self, directory: str | None) -> dict[str, Any]:
        """The status of each session id as the server answers it (it may leave idle ones out)."""
        statuses = await self._call("GET", "/session/status", directory, idempotent=True)
        if not isinstance(statuses, dict):
            raise ServerError("/session/status did not answer an object")
        return statuses

    async def busy_sessions(self, directory: str | None) -> set[str]:
        """Ids of the sessions the server is running right now."""
        return {
            session_id
            for session_id, status in (await self.statuses(directory)).items()
            if not (isinstance(status, dict) and status.get("type") == "idle")
        }

    async def session(
        self, session_id: str, directory: str | None, *, route: int
    ) -> dict[str, Any]:
        """The session's info (with its `directory`); `SessionGone` when the server has none."""
        info = await self._call("GET", session_path(session_id), directory, idempotent=True)
        if not isinstance(info, dict) or not isinstance(info.get("directory"), str):
            raise ServerError("/session/{id} did not answer an object with a directory")
        return info

    async def project_directories(self) -> list[str]:
        """The directories of the projects the server knows (worktrees and sandboxes)."""
        projects = await self._call("GET", "/project", None, idempotent=True)
        if not isinstance(projects, list):
            raise ServerError("/project did not answer a list")
        directories: list[str] = []
        for project in projects:
            if isinstance(project, dict):
                for where in (project.get("worktree"), *(project.get("sandboxes") or ())):
                    if isinstance(where, str) and where not in directories:
                        directories.append(where)
        return directories

    async def messages(
        self,
        session_id: str,
        directory: str | None,
        last: int | None = None,
        *,
        route: int,
    ) -> list[Any]:
        """The session's messages, oldest first; `last`: only the newest that many (the
        server's `limit`), for a check that needs only what came lately."""
        path = session_path(session_id, "message")
        query = None if last is None else {"limit": str(last)}
        messages = await self._call("GET", path, directory, idempotent=True, query=query)
        if not isinstance(messages, list):
            raise ServerError("/session/{id}/message did not answer a list")
        return messages

    async def _call(
        self,
        method: str,
        path: str,
        directory: str | None,
        body: object = None,
        *,
        idempotent: bool,
        arrived: Callable[[], Awaitable[bool]] | None = None,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """Send once; again only if it surely did not arrive, or is idempotent.

        Otherwise `arrived` (None: give up at once) is asked first. After a 5xx the request
        is sent again if `arrived` finds no trace of it; after no answer at all it is never
        sent again (the server may still be carrying it out), only looked for.
        """
        params = {**({"directory": directory} if directory else {}), **(query or {})} or None
        attempt = 0
        while True:
            try:
                return await self._once(method, path, params, body)
            except _TRANSIENT as exc:
                once_only = not idempotent and not isinstance(exc, _NotSent)
                attempt += 1
                if attempt >= self._retry.attempts or (once_only and arrived is None):
                    raise
                await self._sleep(self._retry.backoff.delay(attempt - 1))
                if not once_only:
                    continue
                assert arrived is not None
                if await arrived():
                    return None
                if isinstance(exc, _Unanswered):
                    await self._look_for(arrived, attempt, exc)
                    return None

    async def _look_for(
        self, arrived: Callable[[], Awaitable[bool]], attempt: int, failure: _Unanswered
    ) -> None:
        while True:
            attempt += 1
            if attempt >= self._retry.attempts:
                raise ServerError(f"{failure}; not sent again, as it may still arrive")
            await self._sleep(self._retry.backoff.delay(attempt - 1))
            if await arrived():
                return

    async def _once(
        self, method: str, path: str, params: dict[str, str] | None, body: object
    ) -> Any:
        what = f"{method} {path}"
        url = URL(self._base + path, encoded=True)
        if params:
            try:
                # yarl would drop a lone surrogate (valid JSON, not UTF-8) and send the
                # request to another directory's instance.
                for value in params.values():
                    value.encode("utf-8")
            except UnicodeEncodeError:
                raise ServerError(f"{what}: the directory is not UTF-8") from None
            url = url.with_query(params)
        try:
            async with self._http.request(
                method,
                url,
                json=body,
                headers=self._headers,
                # A redirect would carry the request, the password with it, anywhere; and a
                # redirected abort answered 200 elsewhere would read as done.
                allow_redirects=False,
                # No total and no pool-wait limit: a request waiting for a pooled connection
                # has not been sent, so running out of time there would send it twice.
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=None,
                    sock_connect=self._retry.timeout,
                    sock_read=self._retry.timeout,
                ),
            ) as response:
                if response.status == 401:
                    sent = aiohttp.hdrs.AUTHORIZATION in self._http.headers
                    raise CredentialsRefused(what, refused_credentials(401, sent))
                if response.status == 404 and _names_session(path):
                    raise SessionGone(f"{what}: not found (404)")
                if response.status >= 500:
                    raise _Failing(f"{what}: server error {response.status}")
                if response.status >= 400:
                    raise Refused(f"{what}: refused ({response.status})", response.status)
                if response.status >= 300:
                    raise ServerError(f"{what}: redirected ({response.status}), not followed")
                if response.status == 204:
                    return None
                if response.content_type == "text/html":
                    # 2.x answers every path outside `/api` with its web app's page, and a
                    # proxy may answer with one of its own, even empty: the route is not this
                    # server's, as a 404 would say (never a session gone, never done).
                    raise _WebPage(f"{what}: {WEB_PAGE}", 404)
                if response.content_length == 0:
                    return None
                return await response.json(content_type=None, loads=loads)
        except (aiohttp.ContentTypeError, ValueError) as exc:
            raise ServerError(f"{what}: unreadable answer ({type(exc).__name__})") from None
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # The cause is kept for a diagnosis in plain words (monitor/shell/diagnosis.py).
            raise _NotSent(f"{what}: {type(exc).__name__}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _Unanswered(f"{what}: {type(exc).__name__}") from None


def authorize(http: aiohttp.ClientSession, username: str, password: str | None) -> None:
    """Every later request of `http` with `password` (none: without credentials)."""
    http.headers.pop(aiohttp.hdrs.AUTHORIZATION, None)
    if password is not None:
        http.headers.update(basic_auth_header(username, password))


def http_session(settings: Settings) -> aiohttp.ClientSession:
    """The HTTP client of a watch: the server's credentials with every request."""
    headers = {}
    if settings.password is not None:
        headers = basic_auth_header(settings.username, settings.password)
    return aiohttp.ClientSession(headers=headers, read_bufsize=READ_BUFSIZE)
