"""Attach: watch one session that is already running, starting from what it did so far.

`attach SESSION_ID` looks the session up (`GET /session/{id}`, which also gives its project
directory), follows that directory's `/event` stream with a tracker that ignores every other
session, seeds the tracker with the tool calls of the session's current run, and from there
behaves like `watch`. It ends by itself, with status 0, when the session is deleted.

The core is the tracker (`only_session`, `seed`, `followed_deleted`) and `current_run`; this
module is the thin shell around them, a `Watch` with its own start and its own resync.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

import structlog

from monitor.api import OpencodeAPI
from monitor.config import Settings
from monitor.errors import ServerError, SessionGone
from monitor.logs import configure_logging
from monitor.replay import export_frames
from monitor.tracker import Tracker
from monitor.watch import Watch, detection_of, http_session

log = structlog.get_logger("monitor.attach")

PROG = "opencode-loop-monitor"
EX_NOINPUT = 66  # the session does not exist
EX_UNAVAILABLE = 69  # the server could not be asked (down, or failing)

# OpenCode's session ids start with this; the server answers 500, not 404, for any other id.
SESSION_ID_PREFIX = "ses_"


def current_run(messages: list[Any]) -> list[Any]:
    """The messages of the session's current run: from its last user message on.

    A user message (a prompt, or the monitor's own feedback) starts a new run, so the calls
    before it belong to runs that are over and must not count.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        info = message.get("info") if isinstance(message, dict) else None
        if isinstance(info, dict) and info.get("role") == "user":
            return messages[index:]
    return messages


class Attach(Watch):
    """`Watch` restricted to one session, seeded with that session's current run."""

    def __init__(self, settings: Settings, session_id: str, **kwargs: Any) -> None:
        tracker = Tracker(
            detection_of(settings), directory=settings.directory, only_session=session_id
        )
        super().__init__(settings, tracker=tracker, **kwargs)
        self.session_id = session_id
        self._seeded = False

    def _on_frame(self, data: str) -> None:
        super()._on_frame(data)
        if self.tracker.followed_deleted and not self._stop.is_set():
            log.info("attach.session_deleted", session_id=self.session_id)
            self._stop.set()

    async def _resync(self) -> None:
        # Called on every (re)connect, after the stream answered and before its first frame
        # is read: frames that arrive meanwhile wait in the socket, so the seed goes first.
        try:
            if not self._seeded:
                await self._seed()
                return
            await self._check_exists()
        except SessionGone:
            log.info("attach.session_deleted", session_id=self.session_id)
            self._stop.set()
            return
        await super()._resync()

    async def _check_exists(self) -> None:
        """Away from the stream, we may have missed the deletion (raises `SessionGone`)."""
        try:
            await self.api.messages(self.session_id, self.settings.directory)
        except SessionGone:
            raise
        except ServerError as exc:
            # Cannot tell: keep following; the next reconnect asks again.
            log.warning("stream.resync_failed", error=str(exc))

    async def _seed(self) -> None:
        """Record the calls of the session's current run, and act if they already loop.

        The stream is connected before the messages are read, so that no update made in
        between is lost; the tracker's seed keeps every part it recorded in flight, so that
        those updates, arriving on the stream as well, are not recorded twice. Busy is asked
        before the messages: a run that ends in between still leaves its `session.idle` on
        the stream, which ends the seeded run; the other order could take the last, finished
        run for a current one. An idle session has no current run: nothing is seeded, its
        next prompt starts clean. A failure here (other than a 404) fails this connection;
        the stream reconnects and the seed is tried again.
        """
        directory = self.settings.directory
        busy = self.session_id in await self.api.busy_sessions(directory)
        messages = await self.api.messages(self.session_id, directory)
        frames = list(export_frames(current_run(messages))) if busy else []
        decisions = self.tracker.seed(frames)
        self._seeded = True
        log.info(
            "attach.seeded",
            session_id=self.session_id,
            busy=busy,
            calls=sum(isinstance(frame, dict) for frame in frames),
            loop=bool(decisions),
        )
        for decision in decisions:
            self.interventions.submit(decision)


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
