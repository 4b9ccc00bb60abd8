"""Attach: watch one session that is already running, starting from what it did so far.

`attach SESSION_ID` asks the server which generation it is (`EngineAPI.detect`, as the watch
does at every connect), looks the session up (`GET /session/{id}`, or `GET /api/session/{id}`
on a server with only the `/api` routes; either gives its project directory) and reads
whether it has messages where the core says they tell its engine (on 1.18.33 a session of
either engine is found on both routes, only its messages tell them apart; the core's
`engine_of_session` decides), then runs a `Watch` on that directory's stream
with a `OneSession` scope: the tracker ignores every other session, the watch's resync reads
back only this session's current run (by its engine's route), and the watch ends by itself,
with status 0, when the session is deleted (seen on the stream, or found gone on a
reconnect).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from dataclasses import dataclass

import structlog

from monitor.config import Settings, public_url
from monitor.core.export import feedback_count
from monitor.core.ids import is_session_id
from monitor.core.server import engine_of_session
from monitor.errors import MalformedId, ServerError, SessionGone
from monitor.exits import EX_NOINPUT, EX_UNAVAILABLE
from monitor.shell.api import OpencodeAPI, http_session
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.diagnosis import diagnose_error
from monitor.shell.logs import logging_off_the_loop
from monitor.shell.timing import Timing
from monitor.shell.watch import Watch

__all__ = ["OneSession", "attach", "run_attach", "warn_if_followed"]

log = structlog.get_logger("monitor.attach")

PROG = "opencode-loop-monitor"


class OneSession:
    """A watch's scope for `attach`: one session, until it is deleted."""

    def __init__(self, session_id: str, directory: str | None, engine: int = 1) -> None:
        self.only_session = session_id
        self._directory = directory
        self.found_engine = engine
        self._over = False

    async def still_there(self, api: OpencodeAPI, route: int) -> bool:
        # On every (re)connect: away from the stream, the deletion may have gone by unseen.
        # Asked by the session's route, as the core names it.
        try:
            await api.session(self.only_session, self._directory, route=route)
        except SessionGone:
            return self._deleted()
        except ServerError as exc:
            # Cannot tell: keep following; the next reconnect asks again.
            log.warning("stream.resync_failed", error=str(exc))
        return True

    def _deleted(self) -> bool:
        """Log the deletion once; False, the answer to `still_there`."""
        if not self._over:
            self._over = True
            log.info("attach.session_deleted", session_id=self.only_session)
        return False


@dataclass(frozen=True, slots=True)
class Found:
    """The session looked up: its project directory and the routes of its engine (2: the
    new one's)."""

    directory: str
    route: int


async def look_up(settings: Settings, session_id: str) -> Found:
    # The server answers 500 (1.x) or 400 (`/api`), not 404, for an id that is not an
    # OpenCode session id; and an id of another shape is never sent at all.
    if not is_session_id(session_id):
        raise MalformedId("not an OpenCode session id")
    async with http_session(settings) as http:
        api = EngineAPI(http, settings.url, choice=settings.api)
        try:
            await api.detect()
        except ServerError:
            pass  # down or failing: the look-up says so, after its retries
        kind = api.server
        info = await api.session(session_id, settings.directory, route=kind.unseen_route())
        directory = info["directory"]
        told = await api.has_messages(session_id, directory, kind.telling_routes())
        found = Found(directory, engine_of_session(kind, told))
        log.info(
            "attach.found",
            session_id=session_id,
            directory=found.directory,
            engine=found.route,
            server=kind.describe(),
        )
        await warn_if_followed(api, session_id, found.directory, found.route)
        return found


async def warn_if_followed(api: OpencodeAPI, session_id: str, directory: str, route: int) -> None:
    """Warn when a monitor has intervened in this session already: a `watch` daemon most
    likely follows it too. Both then see each loop; the second to act defers to the first
    (docs/operations.md, "Delivery guarantees"), but the warning says why two are logging."""
    try:
        count = feedback_count(await api.messages(session_id, directory, route=route))
    except ServerError:
        return  # only a warning: the watch itself reports what is wrong with the server
    if count:
        log.warning(
            "attach.other_monitor",
            session_id=session_id,
            feedback_messages=count,
            message="a loop monitor (a watch daemon?) has intervened in this session "
            "already; if it still follows it, each loop is stopped once, by whichever "
            "monitor acts first",
        )


async def attach(settings: Settings, session_id: str, timing: Timing = Timing()) -> int:
    try:
        found = await look_up(settings, session_id)
    except (SessionGone, MalformedId):
        url = public_url(settings.url)
        print(f"{PROG}: session {session_id} not found on {url}", file=sys.stderr)
        return EX_NOINPUT
    except ServerError as exc:
        # What `watch` says of the same failure, where it knows (a wrong port, say).
        diagnosis = None if exc.__cause__ is None else diagnose_error(exc.__cause__, settings.url)
        why = str(exc) if diagnosis is None else diagnosis.hint
        print(f"{PROG}: cannot look up session {session_id}: {why}", file=sys.stderr)
        return EX_UNAVAILABLE
    # The session's own project: its events come on that instance's stream, and its abort
    # and prompt calls go to that instance.
    settings = dataclasses.replace(settings, directory=found.directory)
    scope = OneSession(session_id, found.directory, found.route)
    return await Watch(settings, timing=timing, scope=scope).run()


def run_attach(settings: Settings, session_id: str) -> int:
    with logging_off_the_loop(settings.log_format, settings.log_level):
        return asyncio.run(attach(settings, session_id))
