"""A stand-in OpenCode server: the REST calls and event stream the monitor uses, scripted.

Public and shipped, as `structlog.testing` is: anything that talks to the monitor or to
OpenCode's API can be tested against it without a server running. The tests use it for
faults a real server cannot be made to show on demand, the benchmarks (`bench/harness.py`)
to write loops and permission requests at a known moment. Each connection to the event
stream plays the next script in `streams` (`play` writes fixed chunks; `FakeOpencode.live`
writes whatever `push` is given); every request is recorded in `requests`, with the time it
arrived, so callers assert on what the monitor actually sent and when.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = [
    "PROXY_PAGE",
    "WEB_APP_PAGE",
    "FakeOpencode",
    "Received",
    "engine_call",
    "engine_event",
    "frames",
    "no_headers",
    "play",
]

StreamScript = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


@dataclass
class Received:
    """One request; `at` is when its handler started, on the event loop's clock."""

    method: str
    path: str
    query: dict[str, str]
    body: object
    at: float
    # The credentials it came with (`Authorization`), to see which password went where.
    authorization: str | None = None

    @property
    def session_id(self) -> str | None:
        """The session a `/session/{id}/...` request is about."""
        parts = self.path.split("/")
        return parts[2] if len(parts) > 3 and parts[1] == "session" else None


def frames(*events: object) -> bytes:
    """`events` as the event stream sends them, one `data:` line each."""
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def engine_event(
    kind: str,
    session: str,
    data: dict[str, Any] | None = None,
    seq: int | None = None,
    directory: str | None = None,
) -> dict[str, Any]:
    """One event of OpenCode 2's `/api/event` (2.0 names, `session.tool.called`...): the
    envelope `{id, type, durable?, location?, data}` with `sessionID` in its data; `seq` makes
    it durable (replayed by `/api/session/{id}/event?after=`)."""
    event: dict[str, Any] = {
        "id": f"evt_{kind}_{session}_{seq}",
        "type": kind,
        "data": {"sessionID": session, **(data or {})},
    }
    if seq is not None:
        event["durable"] = {"aggregateID": session, "seq": seq, "version": 1}
    if directory is not None:
        event["location"] = {"directory": directory}
    return event


def engine_call(
    session: str,
    n: int,
    tool: str,
    args: dict[str, Any],
    seq: int,
    directory: str | None = None,
    *,
    release: str = "2.2.5",
) -> list[dict[str, Any]]:
    """The n-th call of a session as the new engine streams it, durable events `seq` to
    `seq + 2`: its input started (the only event naming the tool), called (with the input),
    success. As 2.2.5 sends them (the call's id at `id`, the result's `metadata`), or with
    `release="1.18.33"` as 1.18.33's new engine does (`callID`, `structured`)."""
    key, result_key = ("callID", "structured") if release == "1.18.33" else ("id", "metadata")
    ids = {key: f"call_{n}", "assistantMessageID": f"msg_{n}"}
    result = {**ids, result_key: {}, "content": []}
    return [
        engine_event("session.tool.input.started", session, {**ids, "name": tool}, seq, directory),
        engine_event("session.tool.called", session, {**ids, "input": args}, seq + 1, directory),
        engine_event("session.tool.success", session, result, seq + 2, directory),
    ]


def play(*chunks: bytes, then: str = "hang") -> StreamScript:
    """A stream that writes `chunks`, then hangs (silent), ends, or breaks mid-read."""

    async def script(request: web.Request, response: web.StreamResponse) -> None:
        await response.prepare(request)
        await response.write(frames({"type": "server.connected", "properties": {}}))
        for chunk in chunks:
            await response.write(chunk)
        if then == "end":
            return
        if then == "break":
            await response.write(b'data: {"type":"sess')
            assert request.transport is not None
            request.transport.abort()
            return
        await asyncio.sleep(3600)

    return script


async def no_headers(request: web.Request, response: web.StreamResponse) -> None:
    """What a server still starting up can do: accept the request and never answer it."""
    await asyncio.sleep(3600)


TOAST_PATH = "/tui/show-toast"
# What generation 2's `/api/info` gives as its pid.
INFO_PID = 17329
# What 2.2.5 answers on every path outside `/api`: its web app, 200 text/html.
WEB_APP_PAGE = '<!doctype html>\n<html lang="en"><head><title>OpenCode</title></head></html>\n'
# What a proxy in front of a server answers for it when it cannot reach it.
PROXY_PAGE = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"


def _invalid(key: str) -> web.Response:
    """A new-engine body without the key its schema asks for: the real server's 400."""
    error = {"_tag": "InvalidRequestError", "message": f'Missing key\n  at ["{key}"]'}
    return web.json_response({**error, "kind": "Payload"}, status=400)


@dataclass
class FakeOpencode:
    """The server; `app()` is its aiohttp application, to run on any port."""

    streams: list[StreamScript] = field(default_factory=list)
    # Per action a list of statuses to answer in turn; the last one repeats.
    answers: dict[str, list[int]] = field(default_factory=dict)
    # Per action, a web page answered instead (text/html, with the status `answers` gives):
    # 2.x's web app (`WEB_APP_PAGE`, 200), a proxy's page (`PROXY_PAGE`, 502, or even 200).
    pages: dict[str, str] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    # Keyed as `delays`: the action waits until its event is set (before any delay), so a
    # test decides when a slow server answers instead of racing a timer against it.
    holds: dict[str, asyncio.Event] = field(default_factory=dict)
    busy: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Generation 3: the new engine's busy sessions (`GET /api/session/active` lists only
    # those on 1.18.33; `busy` is the classic `/session/status`).
    engine_busy: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What GET /session/{id}/message answers, per session (an empty list when not given).
    messages: dict[str, list[Any]] = field(default_factory=dict)
    # What GET /session answers: the sessions, as {"id": ..., "time": {"updated": ...}} objects
    # (generation 2: GET /api/session, and GET /api/session/{id} one of them, with `location`).
    sessions: list[dict[str, Any]] = field(default_factory=list)
    # What GET /project answers: the server's projects, as {"worktree": DIR, ...} objects.
    projects: list[dict[str, Any]] = field(default_factory=list)
    # What GET /permission answers: the requests pending.
    permissions: list[Any] = field(default_factory=list)
    # Like the real server, keep each prompt_async as a user message (before its delay, so a
    # slow answer is one the server has already acted on).
    store_prompts: bool = False
    # Like the real server, answer a permission request once: a second reply meets 404.
    reply_once: bool = False
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    # 2: a server of OpenCode 2.2.5 (../shared/opencode/V2-REAL-NOTES.md), which has only the
    # `/api` routes (`/api/info`, its stream `/api/event`, its session actions
    # `/api/session/{id}/interrupt|prompt|permission/{rid}/reply`, no history) and answers
    # every other path with its web app's page; 1: a 1.x server. Restart a test's server as
    # the other one to change generation.
    # 3: 1.18.33, the 1.x routes and stream with the new engine's `/api` routes beside them
    # (`/api/health`, `/api/event`, the history of a session's events).
    generation: int = 1
    # Generation 2: the password the server takes (HTTP Basic, user `opencode`), as 2.2.5
    # always has one; every request without it is recorded and answered 401. None: any.
    password: str | None = None
    # What GET /api/session/{id}/inbox answers (generation 2), per session: its items
    # (`{id, type: "user", payload: {text}, delivery}`), oldest first.
    inbox: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # What GET /api/session/{id}/history answers (generation 3), per session: durable events
    # in the `/api/event` envelope (`engine_event`); only those after `?after=` are sent.
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Set once a stream played by `live` is open, so `push` reaches someone.
    live_connected: asyncio.Event = field(default_factory=asyncio.Event)
    _live: list[web.StreamResponse] = field(default_factory=list, init=False, repr=False)
    _closed: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _replied: set[str] = field(default_factory=set, init=False, repr=False)

    def app(self) -> web.Application:
        if self.generation == 2:
            return self._app_v2()
        app = web.Application()
        app.router.add_get("/global/event", self._stream)
        app.router.add_get("/event", self._stream)
        app.router.add_get("/session/status", self._status)
        app.router.add_get("/session", self._sessions)
        app.router.add_get("/project", self._projects)
        app.router.add_get("/session/{id}/message", self._messages)
        app.router.add_post("/session/{id}/{action}", self._action)
        app.router.add_get("/permission", self._permissions)
        # Answered like a session action named "reply" (statuses in `answers["reply"]`).
        app.router.add_post("/permission/{id}/{action}", self._action)
        # Answered like an action named "show-toast" (statuses in `answers["show-toast"]`).
        app.router.add_post(TOAST_PATH, self._toast)
        if self.generation == 3:
            app.router.add_get("/global/health", self._health)
            self._add_engine_routes(app)
        # Recorded too: a request that reached some other endpoint is what a test must see.
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        return app

    def _app_v2(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/info", self._info)
        app.router.add_get("/api/session/{id}/inbox", self._inbox)
        self._add_engine_routes(app)
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        return app

    def _add_engine_routes(self, app: web.Application) -> None:
        if self.generation == 3:
            app.router.add_get("/api/health", self._health)
            app.router.add_get("/api/session/{id}/history", self._history)
        app.router.add_get("/api/event", self._stream)
        app.router.add_get("/api/session/active", self._active)
        app.router.add_get("/api/session", self._sessions_v2)
        app.router.add_get("/api/session/{id}", self._session_v2)
        app.router.add_get("/api/permission/request", self._permissions_v2)
        app.router.add_get("/api/session/{id}/message", self._messages_v2)
        # Answered like the action of its last path segment ("interrupt", "prompt", "reply").
        app.router.add_post("/api/session/{id}/{action}", self._action)
        app.router.add_post("/api/session/{id}/permission/{request}/{action}", self._reply_v2)

    @web.middleware
    async def _auth(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """2.2.5's refusal of an `/api` request without its password (its web app, every
        other path, is not guarded)."""
        if self.password is None or not request.path.startswith("/api/"):
            return await handler(request)
        token = base64.b64encode(f"opencode:{self.password}".encode()).decode("ascii")
        if request.headers.get("Authorization") == f"Basic {token}":
            return await handler(request)
        await self._record(request)
        error = {"_tag": "UnauthorizedError", "message": "Authentication required"}
        headers = {"WWW-Authenticate": 'Basic realm="Secure Area"'}
        return web.json_response(error, status=401, headers=headers)

    def refused(self) -> list[Received]:
        """The requests refused for want of the password."""
        if self.password is None:
            return []
        token = base64.b64encode(f"opencode:{self.password}".encode()).decode("ascii")
        return [r for r in self.requests if r.authorization != f"Basic {token}"]

    async def _held(self, key: str) -> None:
        """Wait out a test's hold on a read (keyed by its last path segment)."""
        hold = self.holds.get(key)
        if hold is not None:
            await hold.wait()

    async def _health(self, request: web.Request) -> web.Response:
        await self._record(request)
        if request.path == "/global/health":
            return web.json_response({"healthy": True, "version": "1.18.33"})
        await self._held("health")  # `/api/health`'s
        return web.json_response({"healthy": True})

    async def _info(self, request: web.Request) -> web.Response:
        await self._record(request)
        await self._held("info")
        return web.json_response({"version": "2.2.5", "pid": INFO_PID, "urls": [], "paths": {}})

    async def _inbox(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"data": self.inbox.get(request.match_info["id"], [])})

    async def _sessions_v2(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"data": self.sessions})

    async def _session_v2(self, request: web.Request) -> web.Response:
        """One of `sessions` (given in 2.0's shape, `{id, location: {directory}, ...}`) as
        `{data: session}`; the real server's errors for an id of another shape and for one
        it does not have."""
        await self._record(request)
        session_id = request.match_info["id"]
        if not session_id.startswith("ses"):
            error = {"_tag": "InvalidRequestError", "message": "Invalid session ID"}
            return web.json_response({**error, "field": "sessionID"}, status=400)
        for session in self.sessions:
            if session.get("id") == session_id:
                return web.json_response({"data": session})
        message = f"Session not found: {session_id}"
        error = {"_tag": "SessionNotFoundError", "sessionID": session_id, "message": message}
        return web.json_response(error, status=404)

    async def _permissions_v2(self, request: web.Request) -> web.Response:
        """`permissions` in 2.0's shape (`{id, sessionID, action, resources, source}`)."""
        await self._record(request)
        return web.json_response({"data": self.permissions})

    async def _active(self, request: web.Request) -> web.Response:
        await self._record(request)
        await self._held("active")
        busy = self.engine_busy if self.generation == 3 else self.busy
        return web.json_response({"data": {sid: {"type": "running"} for sid in busy}})

    async def _messages_v2(self, request: web.Request) -> web.Response:
        """`messages` of a session are given in 2.0's form (`{id, type, content | text}`),
        oldest first; answered newest first, as the server does."""
        await self._record(request)
        await self._held("message")
        messages = list(reversed(self.messages.get(request.match_info["id"], [])))
        last = request.query.get("limit")
        return web.json_response({"data": messages[: int(last)] if last else messages})

    async def _history(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        if self.answers.get("history", [200])[0] != 200:
            return self._answer("history")  # statuses in `answers["history"]`, as an action's
        after = int(request.query.get("after", "0"))
        events = [
            event
            for event in self.history.get(request.match_info["id"], [])
            if event["durable"]["seq"] > after
        ]
        limit = int(request.query.get("limit", "100"))
        return web.json_response({"data": events[:limit], "hasMore": len(events) > limit})

    async def _reply_v2(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        # Each release takes its own body only (`additionalProperties: false`).
        if not self._takes(self.requests[-1].body, "decision", "reply"):
            return _invalid("decision" if self.generation == 2 else "reply")
        return self._answer("reply")

    def _takes(self, body: object, v2_key: str, v1_18_key: str) -> bool:
        """Whether a new-engine body has the key this generation's schema asks for."""
        return isinstance(body, dict) and (v2_key if self.generation == 2 else v1_18_key) in body

    def of(self, action: str) -> list[Received]:
        """The requests for one action (`abort`, `prompt_async`, `status`...), in order."""
        return [r for r in self.requests if r.path.endswith("/" + action)]

    def actions(self) -> list[str]:
        """The paths of the POSTs that act on sessions and permissions, in order (the toasts,
        posted apart and best effort, left out)."""
        return [r.path for r in self.requests if r.method == "POST" and r.path != TOAST_PATH]

    async def live(self, request: web.Request, response: web.StreamResponse) -> None:
        """A stream script: stays open, writing what `push` is given, until `close`."""
        await response.prepare(request)
        connected: dict[str, Any] = {"type": "server.connected", "properties": {}}
        if request.path == "/api/event":
            connected = {"id": "evt_0", "type": "server.connected", "data": {}}
        # /global/event wraps every event in an envelope, as the real server does.
        await response.write(
            frames({"payload": connected} if request.path == "/global/event" else connected)
        )
        self._live.append(response)
        self.live_connected.set()
        try:
            await self._closed.wait()
        finally:
            self._live.remove(response)

    async def push(self, chunk: bytes) -> None:
        """Write `chunk` to every open `live` stream."""
        for response in list(self._live):
            await response.write(chunk)

    def close(self) -> None:
        """End the `live` streams (a server shutting down)."""
        self._closed.set()

    async def _record(self, request: web.Request) -> None:
        # Timed before the body is read: `at` is when the request reached the server.
        at = asyncio.get_running_loop().time()
        body = await request.json() if request.can_read_body else None
        authorization = request.headers.get("Authorization")
        self.requests.append(
            Received(request.method, request.path, dict(request.query), body, at, authorization)
        )

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        index = self.connections
        self.connections += 1
        script = self.streams[index] if index < len(self.streams) else play()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await script(request, response)
        return response

    async def _status(self, request: web.Request) -> web.Response:
        await self._record(request)
        await self._held("status")  # a resync under way, for as long as a test needs
        return web.json_response(self.busy)

    async def _projects(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(self.projects)

    async def _sessions(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(self.sessions)

    async def _messages(self, request: web.Request) -> web.Response:
        await self._record(request)
        messages = self.messages.get(request.match_info["id"], [])
        last = request.query.get("limit")  # the newest messages, as the real server does
        return web.json_response(messages[-int(last) :] if last else messages)

    async def _permissions(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(self.permissions)

    async def _elsewhere(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.generation == 2 and not request.path.startswith("/api/"):
            return web.Response(text=WEB_APP_PAGE, content_type="text/html")
        if self.generation == 2:
            return web.Response(status=404)  # an unknown `/api` path: empty
        return web.json_response({"error": "no such endpoint"}, status=404)

    async def _action(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        action = request.match_info["action"]
        new_engine = request.path.startswith("/api/")
        if (
            new_engine
            and action == "prompt"
            and not self._takes(self.requests[-1].body, "text", "prompt")
        ):
            return _invalid("text" if self.generation == 2 else "prompt")
        if action == "prompt_async" and self.store_prompts:
            body = self.requests[-1].body
            assert isinstance(body, dict)
            message = {"info": {"role": "user"}, "parts": body["parts"]}
            self.messages.setdefault(request.match_info["id"], []).append(message)
        # Delays keyed by action ("abort") or by session and action ("s1/abort").
        session_action = f"{request.match_info['id']}/{action}"
        hold = self.holds.get(session_action, self.holds.get(action))
        if hold is not None:
            await hold.wait()
        await asyncio.sleep(self.delays.get(session_action, self.delays.get(action, 0)))
        if action == "reply" and self.reply_once:
            if request.match_info["id"] in self._replied:
                return web.json_response({"name": "PermissionNotFoundError"}, status=404)
            self._replied.add(request.match_info["id"])
        return self._answer(action)

    async def _toast(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return self._answer("show-toast")

    def _answer(self, action: str) -> web.StreamResponse:
        statuses = self.answers.get(action, [200])
        status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
        if action in self.pages and status != 204:
            return web.Response(text=self.pages[action], content_type="text/html", status=status)
        if status == 200:
            return web.json_response(True)
        if status == 204:
            return web.Response(status=204)
        return web.json_response({"error": "nope"}, status=status)
