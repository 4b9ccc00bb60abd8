"""The OpenCode REST calls the monitor makes, with bounded retries.

Transient failures (connection errors, timeouts, 5xx) are retried with backoff; a 404 means
the session is gone (`SessionGone`), a 401 means our credentials are wrong (`ConfigError`,
never retried), anything else is a `ServerError`. Only ids and status codes go into errors.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from monitor.errors import ConfigError, ServerError, SessionGone
from monitor.shell.backoff import Backoff
from monitor.shell.diagnosis import refused_credentials


@dataclass(frozen=True, slots=True)
class Retry:
    attempts: int = 4
    backoff: Backoff = Backoff(initial=0.2, cap=2.0)
    timeout: float = 10.0


class _Transient(ServerError):
    pass


def basic_auth_header(user: str, password: str) -> dict[str, str]:
    """The header `opencode serve` wants when it runs with OPENCODE_SERVER_PASSWORD.

    Built by hand: aiohttp 3.14 deprecates its BasicAuth helper.
    """
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return {"Authorization": f"Basic {token}"}


def _session_path(session_id: str, action: str = "") -> str:
    # Session ids come from the stream or the command line: quoted so that no id can reach
    # another endpoint.
    path = f"/session/{quote(session_id, safe='')}"
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
        self._base = base_url.rstrip("/")
        self._retry = retry
        self._sleep = sleep
        self._headers = dict(headers or {})

    async def abort(self, session_id: str, directory: str | None) -> None:
        await self._call("POST", _session_path(session_id, "abort"), directory)

    async def prompt(
        self, session_id: str, directory: str | None, text: str, no_reply: bool = False
    ) -> None:
        """Add a user message; with `no_reply` it is stored and no answer starts."""
        body: dict[str, Any] = {"parts": [{"type": "text", "text": text}]}
        if no_reply:
            body["noReply"] = True
        await self._call("POST", _session_path(session_id, "prompt_async"), directory, body)

    async def create_session(
        self, directory: str | None, title: str | None = None
    ) -> dict[str, Any]:
        """A new session's info (with its `id`); the monitor never makes one, its kit does."""
        body = {"title": title} if title else {}
        info = await self._call("POST", "/session", directory, body)
        if not isinstance(info, dict) or not isinstance(info.get("id"), str):
            raise ServerError("POST /session did not answer an object with an id")
        return info

    async def sessions(self, directory: str | None) -> list[Any]:
        """The project's sessions; the kit asks for them to see that a new server is up."""
        sessions = await self._call("GET", "/session", directory)
        if not isinstance(sessions, list):
            raise ServerError("/session did not answer a list")
        return sessions

    async def server_directory(self) -> str:
        """The folder the server was started in, as it names it (its sessions' `directory`)."""
        paths = await self._call("GET", "/path", None)
        if not isinstance(paths, dict) or not isinstance(paths.get("directory"), str):
            raise ServerError("/path did not answer an object with a directory")
        return str(paths["directory"])

    async def reply_permission(
        self, request_id: str, directory: str | None, reply: str, message: str | None = None
    ) -> bool:
        """Answer a permission request; False when it was answered already (404)."""
        body: dict[str, Any] = {"reply": reply}
        if message is not None:
            body["message"] = message
        path = f"/permission/{quote(request_id, safe='')}/reply"
        try:
            await self._call("POST", path, directory, body)
        except SessionGone:
            return False
        return True

    async def pending_permissions(self, directory: str | None) -> list[dict[str, Any]]:
        """The permission requests nobody has answered yet (the stream does not replay them)."""
        pending = await self._call("GET", "/permission", directory)
        if not isinstance(pending, list):
            raise ServerError("/permission did not answer a list")
        return [request for request in pending if isinstance(request, dict)]

    async def statuses(self, directory: str | None) -> dict[str, Any]:
        """The status of each session id as the server answers it (it may leave idle ones out)."""
        statuses = await self._call("GET", "/session/status", directory)
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

    async def session(self, session_id: str, directory: str | None) -> dict[str, Any]:
        """The session's info (with its `directory`); `SessionGone` when the server has none."""
        info = await self._call("GET", _session_path(session_id), directory)
        if not isinstance(info, dict) or not isinstance(info.get("directory"), str):
            raise ServerError("/session/{id} did not answer an object with a directory")
        return info

    async def project_directories(self) -> list[str]:
        """The directories of the projects the server knows (worktrees and sandboxes)."""
        projects = await self._call("GET", "/project", None)
        if not isinstance(projects, list):
            raise ServerError("/project did not answer a list")
        directories: list[str] = []
        for project in projects:
            if isinstance(project, dict):
                for where in (project.get("worktree"), *(project.get("sandboxes") or ())):
                    if isinstance(where, str) and where not in directories:
                        directories.append(where)
        return directories

    async def messages(self, session_id: str, directory: str | None) -> list[Any]:
        messages = await self._call("GET", _session_path(session_id, "message"), directory)
        if not isinstance(messages, list):
            raise ServerError("/session/{id}/message did not answer a list")
        return messages

    async def _call(
        self, method: str, path: str, directory: str | None, body: object = None
    ) -> Any:
        params = {"directory": directory} if directory else None
        attempt = 0
        while True:
            try:
                return await self._once(method, path, params, body)
            except _Transient:
                attempt += 1
                if attempt >= self._retry.attempts:
                    raise
                await self._sleep(self._retry.backoff.delay(attempt - 1))

    async def _once(
        self, method: str, path: str, params: dict[str, str] | None, body: object
    ) -> Any:
        what = f"{method} {path}"
        try:
            async with self._http.request(
                method,
                self._base + path,
                params=params,
                json=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self._retry.timeout),
            ) as response:
                if response.status == 401:
                    sent = aiohttp.hdrs.AUTHORIZATION in self._http.headers
                    raise ConfigError(f"{what}: {refused_credentials(401, sent)}")
                if response.status == 404:
                    raise SessionGone(f"{what}: not found (404)")
                if response.status >= 500:
                    raise _Transient(f"{what}: server error {response.status}")
                if response.status >= 400:
                    raise ServerError(f"{what}: refused ({response.status})")
                if response.status == 204 or response.content_length == 0:
                    return None
                return await response.json(content_type=None)
        except (aiohttp.ContentTypeError, ValueError) as exc:
            raise ServerError(f"{what}: unreadable answer ({type(exc).__name__})") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _Transient(f"{what}: {type(exc).__name__}") from None
