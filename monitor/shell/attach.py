"""Attach: watch one session that is already running, starting from what it did so far.

`attach SESSION_ID` looks the session up (`GET /session/{id}`, which also gives its project
directory), then runs a `Watch` on that directory's `/event` stream with a `OneSession`
scope: the tracker ignores every other session, the watch's resync reads back only this
session's current run, and the watch ends by itself, with status 0, when the session is
deleted (seen on the stream, or found gone on a reconnect).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

import structlog

from monitor.config import Settings, public_url
from monitor.core.export import feedback_count
from monitor.core.ids import is_session_id
from monitor.core.tracker import Fed
from monitor.errors import ServerError, SessionGone
from monitor.exits import EX_NOINPUT, EX_UNAVAILABLE
from monitor.shell.api import OpencodeAPI
from monitor.shell.logs import configure_logging
from monitor.shell.watch import Watch, http_session

log = structlog.get_logger("monitor.attach")

PROG = "opencode-loop-monitor"


class OneSession:
    """A watch's scope for `attach`: one session, until it is deleted."""

    def __init__(self, session_id: str, directory: str | None) -> None:
        self.only_session = session_id
        self._directory = directory
        self._over = False

    async def still_there(self, api: OpencodeAPI) -> bool:
        # On every (re)connect: away from the stream, the deletion may have gone by unseen.
        try:
            await api.session(self.only_session, self._directory)
        except SessionGone:
            return self._deleted()
        except ServerError as exc:
            # Cannot tell: keep following; the next reconnect asks again.
            log.warning("stream.resync_failed", error=str(exc))
        return True

    def ended(self, fed: Fed) -> bool:
        return fed.deleted == self.only_session and not self._deleted()

    def _deleted(self) -> bool:
        """Log the deletion once; False, the answer to `still_there`."""
        if not self._over:
            self._over = True
            log.info("attach.session_deleted", session_id=self.only_session)
        return False


async def look_up(settings: Settings, session_id: str) -> dict[str, Any]:
    # The server answers 500, not 404, for an id that is not an OpenCode session id; and an
    # id of another shape is never sent at all.
    if not is_session_id(session_id):
        raise SessionGone("not an OpenCode session id")
    async with http_session(settings) as http:
        api = OpencodeAPI(http, settings.url)
        info = await api.session(session_id, settings.directory)
        await warn_if_followed(api, session_id, info["directory"])
        return info


async def warn_if_followed(api: OpencodeAPI, session_id: str, directory: str) -> None:
    """Warn when a monitor has intervened in this session already: a `watch` daemon most
    likely follows it too. Both then see each loop; the second to act defers to the first
    (docs/operations.md, "Delivery guarantees"), but the warning says why two are logging."""
    try:
        count = feedback_count(await api.messages(session_id, directory))
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


async def attach(settings: Settings, session_id: str) -> int:
    try:
        info = await look_up(settings, session_id)
    except SessionGone:
        url = public_url(settings.url)
        print(f"{PROG}: session {session_id} not found on {url}", file=sys.stderr)
        return EX_NOINPUT
    except ServerError as exc:
        print(f"{PROG}: cannot look up session {session_id}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    # The session's own project: its events come on that instance's /event stream, and its
    # abort and prompt calls go to that instance.
    settings = dataclasses.replace(settings, directory=info["directory"])
    return await Watch(settings, scope=OneSession(session_id, settings.directory)).run()


def run_attach(settings: Settings, session_id: str) -> int:
    configure_logging(settings.log_format, settings.log_level)
    return asyncio.run(attach(settings, session_id))
