"""Attach: watch one session that is already running, starting from what it did so far.

`attach SESSION_ID` looks the session up (`GET /session/{id}`, which also gives its project
directory), follows that directory's `/event` stream with a tracker that ignores every other
session, and from there behaves like `watch`, whose resync seeds the tracker with the calls
of the session's current run. It ends by itself, with status 0, when the session is deleted.

The core is the tracker (`only_session`, `seed`, `followed_deleted`); this module is the thin
shell around it, a `Watch` with its own start and a deletion check on every connect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

import structlog

from monitor.config import Settings
from monitor.core.tracker import Tracker
from monitor.errors import ServerError, SessionGone
from monitor.shell.api import OpencodeAPI
from monitor.shell.logs import configure_logging
from monitor.shell.watch import Watch, detection_of, http_session

log = structlog.get_logger("monitor.shell.attach")

PROG = "opencode-loop-monitor"
EX_NOINPUT = 66  # the session does not exist
EX_UNAVAILABLE = 69  # the server could not be asked (down, or failing)

# OpenCode's session ids start with this; the server answers 500, not 404, for any other id.
SESSION_ID_PREFIX = "ses_"


class Attach(Watch):
    """`Watch` restricted to one session, seeded with that session's current run."""

    def __init__(self, settings: Settings, session_id: str, **kwargs: Any) -> None:
        tracker = Tracker(
            detection_of(settings), directory=settings.directory, only_session=session_id
        )
        super().__init__(settings, tracker=tracker, **kwargs)
        self.session_id = session_id

    def _on_frame(self, data: str) -> None:
        super()._on_frame(data)
        if self.tracker.followed_deleted:
            self._deleted()

    def _deleted(self) -> None:
        if not self._stop.is_set():
            log.info("attach.session_deleted", session_id=self.session_id)
            self._stop.set()

    async def _resync(self) -> None:
        # On every (re)connect: away from the stream, the deletion may have gone by unseen.
        # Then `watch`'s resync seeds the session's current run, if it has one.
        try:
            await self.api.session(self.session_id, self.settings.directory)
        except SessionGone:
            self._deleted()
            return
        except ServerError as exc:
            # Cannot tell: keep following; the next reconnect asks again.
            log.warning("stream.resync_failed", error=str(exc))
        await super()._resync()


async def look_up(settings: Settings, session_id: str) -> dict[str, Any]:
    # The server answers 500, not 404, for an id that is not an OpenCode session id.
    if not session_id.startswith(SESSION_ID_PREFIX):
        raise SessionGone("not an OpenCode session id")
    async with http_session(settings) as http:
        return await OpencodeAPI(http, settings.url).session(session_id, settings.directory)


async def attach(settings: Settings, session_id: str) -> int:
    try:
        info = await look_up(settings, session_id)
    except SessionGone:
        print(f"{PROG}: session {session_id} not found on {settings.url}", file=sys.stderr)
        return EX_NOINPUT
    except ServerError as exc:
        print(f"{PROG}: cannot look up session {session_id}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    # The session's own project: its events come on that instance's /event stream, and its
    # abort and prompt calls go to that instance.
    settings = dataclasses.replace(settings, directory=info["directory"])
    return await Attach(settings, session_id).run()


def run_attach(settings: Settings, session_id: str) -> int:
    configure_logging(settings.log_format, settings.log_level)
    return asyncio.run(attach(settings, session_id))
