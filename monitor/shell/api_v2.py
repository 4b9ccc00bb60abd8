"""The REST client for servers of both generations: each request of a session by the routes
the core names for it, the health routes asked for the core to say which server this is.

OpenCode 2 (2.2.5) serves only `/api/...` (queries `location[directory]=`); 1.18.33 serves the
1.x routes and, for sessions of its new engine, `/api` routes of the same names. Every request
of one session takes its `route` (`Intervene.route`, `Tracker.route`: 1 the 1.x routes, 2 the
`/api` ones), which `EngineAPI` maps to its URL; which server this is (`detect`) is
`core/server.py`'s word on the health routes' answers, and so are the bodies each request of
the new engine takes and whether a session's inbox is read with its record. So
`Interventions` carries out the same decisions on both:

- stop the run: `POST /session/{id}/abort` / `POST /api/session/{id}/interrupt` (the 1.x abort
  answers `true` on a new-engine session and the run goes on);
- feedback: `POST /session/{id}/prompt_async` with `noReply` / `POST /api/session/{id}/prompt`
  (`server.prompt_body`: 2.x `{text, resume}`, 1.18.33 `{prompt: {text}, resume}`; `resume:
  false` adds the message and starts no turn);
- permission reply: `POST /permission/{id}/reply` / `POST /api/session/{sid}/permission/{id}/
  reply` (`server.permission_body`: 2.x `{decision, message}`, 1.18.33 `{reply, message}`);
- read back: `GET /session/{id}/message` / `GET /api/session/{id}/message` (as 1.x messages,
  `core/export_v2.py`), on 2.x with `GET /api/session/{id}/inbox` (what waits for a run);
  busy sessions: `GET /session/status` / `GET /api/session/active`;
- look up: `GET /session/{id}` / `GET /api/session/{id}` (its directory under `location`);
  whether a session has messages on a route (`has_messages`: `attach` hands it to the core's
  `engine_of_session`);
- missed events: none on 1.x and 2.x (read back) / 1.18.33's `GET /api/session/{id}/history
  ?after=SEQ`.

Auth: the same `Authorization` header goes with every request (1.18.33 guards `/api` like the
rest; 2.x always has a password, its background service's read from its registration,
`monitor/service.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from monitor.config import ApiChoice
from monitor.core.export import feedback_delivered
from monitor.core.export_v2 import inbox_v1_shape, messages_v1_shape
from monitor.core.ids import is_permission_id
from monitor.core.server import (
    Probe,
    ServerKind,
    assumed_kind,
    kind_from_probes,
    permission_body,
    probes,
    prompt_body,
)
from monitor.errors import (
    ConfigError,
    CredentialsRefused,
    MalformedId,
    Refused,
    ServerAway,
    ServerError,
    SessionGone,
)
from monitor.shell.api import OpencodeAPI, Retry, path_segment, session_path

__all__ = ["EngineAPI", "ServerKind"]

# Pages of a session's missed events read after a reconnect, at most, and their size (the
# server's maximum): a session that ran longer than this while we were away is read back up
# to there, the rest comes live.
HISTORY_PAGE = 100
HISTORY_PAGES = 50
# The longest a read of `/api` may take, retries included, whatever the server does (hung, or
# dribbling bytes, which a read timeout never ends). The resync asks `/api` while the frames
# of the new-engine sessions it rebuilds wait (a hung `GET /api/session/active` once held a
# 1.x loop's too, for 14 s); a hung `/api/health` added 10 s to every connect. Its
# answers come in milliseconds once warm, but a real 1.18.33's first `/api` read on a loaded
# machine took over 2 s (attach's look-up failed on it in the suite): the bound is for a
# server that does not answer, not for one that is slow.
API_READ_S = 10.0


def _api_path(session_id: str, action: str = "") -> str:
    return session_path(session_id, action, root="/api/session")


def _where(directory: str | None, **query: str) -> dict[str, str]:
    return {**({"location[directory]": directory} if directory else {}), **query}


class EngineAPI(OpencodeAPI):
    """`OpencodeAPI`, each session's actions by the routes the core names (see the module)."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        retry: Retry = Retry(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        headers: Mapping[str, str] | None = None,
        choice: ApiChoice = "auto",
    ) -> None:
        super().__init__(http, base_url, retry, sleep, headers)
        self.choice = choice
        # Until `detect` says otherwise.
        self.server = assumed_kind(choice)
        self.api_read_s = API_READ_S

    @property
    def shows_toasts(self) -> bool:
        return self.server.toasts

    async def _read(self, path: str, query: dict[str, str] | None) -> Any:
        """GET `path` of `/api`, answered within API_READ_S or a ServerError."""
        try:
            async with asyncio.timeout(self.api_read_s):
                return await self._call("GET", path, None, idempotent=True, query=query)
        except TimeoutError:
            raise ServerError(f"GET {path}: no answer within {self.api_read_s:g} s") from None

    async def detect(self) -> ServerKind:
        """Ask the health routes the core names and let it say which server this is (at every
        connect: it may have been upgraded in place). Refused credentials are said as the
        stream says them: this is the first request of every connect."""
        try:
            answers = {path: await self._probe(path) for path in probes(self.choice)}
        except CredentialsRefused as exc:
            raise ConfigError(exc.reason) from None
        self.server = kind_from_probes(self.choice, answers)
        return self.server

    async def _probe(self, path: str) -> Probe:
        """One health route's answer, asked once: a server that does not answer is the
        stream's to report. An `/api` route that hangs is a ServerError (the kind found
        before then holds for this connect, `Locator.locate`)."""
        try:
            if not path.startswith("/api/"):
                return Probe(200, await self._once("GET", path, None, None))
            async with asyncio.timeout(self.api_read_s):
                return Probe(200, await self._once("GET", path, None, None))
        except Refused as exc:
            return Probe(exc.status)  # 2.x's web page too, as not this server's route
        except TimeoutError:
            raise ServerError(f"GET {path}: no answer within {self.api_read_s:g} s") from None

    async def abort(self, session_id: str, directory: str | None, *, route: int) -> None:
        if route == 1:
            await super().abort(session_id, directory, route=route)
            return
        # Interrupting a run that stopped changes nothing (204 all the same).
        path = _api_path(session_id, "interrupt")
        await self._call("POST", path, None, idempotent=True, query=_where(directory))

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
        if route == 1:
            await super().prompt(session_id, directory, text, no_reply, after_part, route=route)
            return

        async def arrived() -> bool:
            messages = await self.messages(session_id, directory, route=2)
            return feedback_delivered(messages, text, after_part)

        body = prompt_body(self.server, text, resume=not no_reply)
        path = _api_path(session_id, "prompt")
        await self._call(
            "POST", path, None, body, idempotent=False, arrived=arrived, query=_where(directory)
        )

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
        if session_id is None or route == 1:
            return await super().reply_permission(
                request_id, directory, reply, message, route=route
            )
        if not is_permission_id(request_id):
            raise MalformedId("permission request id is not of the shape per_...")
        path = _api_path(session_id, f"permission/{path_segment(request_id)}/reply")
        body = permission_body(self.server, reply, message)
        try:
            await self._call("POST", path, None, body, idempotent=False, query=_where(directory))
        except SessionGone:
            return False  # answered already
        return True

    async def messages(
        self,
        session_id: str,
        directory: str | None,
        last: int | None = None,
        *,
        route: int,
    ) -> list[Any]:
        if route == 1:
            return await super().messages(session_id, directory, last, route=route)
        record = messages_v1_shape(
            await self._engine_messages(session_id, directory, last), session_id
        )
        if not self.server.inbox:
            return record
        inbox = await self._read(_api_path(session_id, "inbox"), _where(directory))
        return record + inbox_v1_shape(inbox, session_id)

    async def _engine_messages(
        self, session_id: str, directory: str | None, last: int | None
    ) -> list[Any]:
        """The session's messages on the `/api` route, as it answers them (newest first)."""
        query = _where(directory, order="desc")
        if last is not None:
            query["limit"] = str(last)
        page = await self._read(_api_path(session_id, "message"), query)
        data = page.get("data") if isinstance(page, dict) else None
        if not isinstance(data, list):
            raise ServerError("/api/session/{id}/message did not answer {data: [...]}")
        return data

    async def session(
        self, session_id: str, directory: str | None, *, route: int
    ) -> dict[str, Any]:
        """The session's info, with its `directory`. On the `/api` route (1.18.33 answers it
        for a session of either engine) the info is `{data: {id, projectID, title, time,
        location: {directory}, ...}}`; its directory is `location`'s."""
        if route == 1:
            return await super().session(session_id, directory, route=route)
        answer = await self._read(_api_path(session_id), _where(directory))
        info = answer.get("data") if isinstance(answer, dict) else None
        location = info.get("location") if isinstance(info, dict) else None
        where = location.get("directory") if isinstance(location, dict) else None
        if not isinstance(info, dict) or not isinstance(where, str):
            raise ServerError("/api/session/{id} did not answer {data: {location: {directory}}}")
        return {**info, "directory": where}

    async def has_messages(
        self, session_id: str, directory: str | None, routes: tuple[int, ...]
    ) -> dict[int, bool | None]:
        """Whether the session has messages on each of `routes` (None: that route did not
        answer it), for the core to tell its engine (`engine_of_session`)."""
        found: dict[int, bool | None] = {}
        for route in routes:
            try:
                newest = await self.messages(session_id, directory, 1, route=route)
            except ServerAway:
                raise  # down: said as it is
            except ServerError:
                # No such routes after all (a server the probes missed), or no answer within
                # API_READ_S: slow, not down (a real 1.18.33 at a load of 8, issue 56), so
                # the look-up goes on; the session's first frames say its engine.
                found[route] = None
                continue
            found[route] = bool(newest)
        return found

    async def busy_sessions(self, directory: str | None) -> set[str]:
        busy: set[str] = set()
        for route in self.server.routes():
            busy |= await self.busy_on(route, directory)
        return busy

    async def busy_on(self, route: int, directory: str | None) -> set[str]:
        """The sessions of `route` the server runs right now."""
        if route == 1:
            return await super().busy_sessions(directory)
        return await self._engine_busy(directory)

    async def _engine_busy(self, directory: str | None) -> set[str]:
        active = await self._read("/api/session/active", _where(directory))
        data = active.get("data") if isinstance(active, dict) else None
        if not isinstance(data, dict):
            raise ServerError("/api/session/active did not answer {data: {...}}")
        # 1.18.33 lists only its own sessions here: the resync tells the core they are the new
        # engine's (`Tracker.engine_sessions`), so one a restarted monitor has not seen on
        # the stream yet is read back by the `/api` routes (the 1.x message route answers
        # [] for it).
        return {session_id for session_id in data if isinstance(session_id, str)}

    async def pending_permissions(self, directory: str | None) -> list[dict[str, Any]]:
        """On a server without 1.x routes, `GET /api/permission/request`, each request in
        the 1.x shape the read-back feeds as `permission.asked` (`action` is `permission`,
        `source` names the call as `tool` did)."""
        if self.server.unseen_route() == 1:
            return await super().pending_permissions(directory)
        page = await self._read("/api/permission/request", _where(directory))
        data = page.get("data") if isinstance(page, dict) else page
        if not isinstance(data, list):
            raise ServerError("/api/permission/request did not answer a list")
        requests = []
        for request in data:
            if isinstance(request, dict):
                source = request.get("source")
                source = source if isinstance(source, dict) else {}
                call = {"messageID": source.get("messageID"), "callID": source.get("callID")}
                requests.append({**request, "permission": request.get("action"), "tool": call})
        return requests

    async def sessions(self, directory: str | None) -> list[Any]:
        if self.server.unseen_route() == 1:
            return await super().sessions(directory)
        page = await self._read("/api/session", _where(directory))
        data = page.get("data") if isinstance(page, dict) else None
        if not isinstance(data, list):
            raise ServerError("/api/session did not answer {data: [...]}")
        return data

    async def history(self, session_id: str, after: int) -> list[dict[str, Any]]:
        """The session's durable events after seq `after`, as `/api/event` envelopes, oldest
        first (at most HISTORY_PAGES pages)."""
        events: list[dict[str, Any]] = []
        for _ in range(HISTORY_PAGES):
            query = {"after": str(after), "limit": str(HISTORY_PAGE)}
            page = await self._read(_api_path(session_id, "history"), query)
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                raise ServerError("/api/session/{id}/history did not answer {data: [...]}")
            for event in data:
                if isinstance(event, dict):
                    envelope = _envelope(event, session_id)
                    events.append(envelope)
                    seq = envelope.get("durable", {}).get("seq")
                    after = seq if type(seq) is int and seq > after else after
            if not page.get("hasMore") or not data:
                return events
        return events


def _envelope(event: dict[str, Any], session_id: str) -> dict[str, Any]:
    """A history entry as the stream's envelope: the entry may carry its seq at the top
    (`{id, type, seq, aggregateID, data}`) or as the stream does (`durable`)."""
    if "durable" in event or "seq" not in event:
        return event
    durable = {"aggregateID": event.get("aggregateID", session_id), "seq": event["seq"]}
    return {**event, "durable": durable}
