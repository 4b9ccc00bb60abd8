"""After every connect: the resync. Events missed while away are gone, so every run is
rebuilt from the server's record (`monitor.core.resync` plans it; this asks the server and
carries the plan out): the busy sessions read back, new-engine sessions replayed from their
history, pending permission requests answered, held sessions read again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import structlog

from monitor.config import Settings
from monitor.core.commands import Command
from monitor.core.monitor import Monitor
from monitor.core.resync import Waiting, directories_to_ask, plan_resync, recent_sessions
from monitor.errors import ServerError, SessionGone
from monitor.shell.api_v2 import EngineAPI

__all__ = ["RECENT_HISTORY", "RESYNC_CONCURRENCY", "Resync", "Waiting", "bounded"]

log = structlog.get_logger("monitor.shell.resync")

T = TypeVar("T")

# Requests a resync has under way at once: 10,000 directories asked one by one took 4.8 s;
# all at once would take every connection of the pool from the aborts.
RESYNC_CONCURRENCY = 16
# An idle session is read back (at start, up to --max-sessions of them) from its newest this
# many messages: its recent interventions and whether it is held are there, and a whole record
# can be megabytes.
RECENT_HISTORY = 200


async def bounded(calls: Iterable[Awaitable[T]], limit: int = RESYNC_CONCURRENCY) -> list[T]:
    """Await `calls` at most `limit` at a time, their results in order; the first failure
    cancels the rest and is raised. `limit` workers take the calls one by one, so 10,000
    calls cost `limit` tasks, and a generator's calls are made only when their turn comes."""
    results: dict[int, T] = {}
    pending = enumerate(calls)  # one iterator: each call is taken by one worker

    async def worker() -> None:
        for index, call in pending:
            results[index] = await call

    workers = [asyncio.ensure_future(worker()) for _ in range(limit)]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    return [results[index] for index in range(len(results))]


class Resync:
    """One monitor's resync; `execute` and `take` are the watch's own paths for what the
    read-back decides and for a frame that waited (so it is logged, counted and carried out
    as live)."""

    def __init__(
        self,
        api: EngineAPI,
        monitor: Monitor,
        settings: Settings,
        only_session: str | None,
        execute: Callable[[Sequence[Command]], None],
        take: Callable[[object], object],
        clock: Callable[[], float],
    ) -> None:
        self._api = api
        self._monitor = monitor
        self._settings = settings
        self._only_session = only_session
        self._execute = execute
        self._take = take
        self._clock = clock
        # Set from the connect until the resync is done (`hold`, `release`).
        self.waiting: Waiting | None = None
        self._synced = False  # a first resync has ended: the runs under way are known

    def hold(self) -> None:
        """At the connect, before any frame is read: the frames of the sessions the resync
        may rebuild wait from now on (`Waiting`)."""
        self.waiting = self._waiting(self._monitor.known())

    def _waiting(self, held: Iterable[str]) -> Waiting:
        configured = self._settings.directory
        asked = directories_to_ask(self._monitor.running(), configured)
        return Waiting(held, asked, configured)

    def release(self) -> None:
        """The resync is done (or failed): the frames that waited are fed."""
        waiting, self.waiting = self.waiting, None
        self._synced = True
        self._feed(() if waiting is None else waiting.rest())

    def _feed(self, frames: Iterable[object]) -> None:
        for frame in frames:
            self._take(frame)

    def _claim(self, sessions: Iterable[str]) -> None:
        if self.waiting is not None:
            self.waiting.claim(sessions)

    def following(self, session_id: str, directory: str | None) -> bool:
        """Whether the session's frames reach the tracker as they come: not while the resync
        holds them (its directory's answer awaited, or its run being read back). Asked for
        the plugin's question, which may be the first the monitor hears of a session: a run
        under way when the monitor (re)connected is judged only once it has been read back,
        and none before the first connect's resync has ended."""
        if self.waiting is None:
            return self._synced
        return not self._monitor.waits(self.waiting, session_id, directory)

    def _live(self) -> set[str]:
        return set() if self.waiting is None else self.waiting.live

    async def _busy(self, waiting: Waiting) -> tuple[dict[str, str | None], int]:
        """Which sessions are busy, by directory, the directories sessions wait for asked
        first; a session that waited is read back (when busy) and then followed live. Also
        how many were read back."""
        seeded = 0

        async def ask(where: str | None) -> tuple[str | None, set[str]]:
            nonlocal seeded
            sessions: set[str] = set()
            only = self._only_session
            # Each engine's answer frees its own sessions: a hung `/api` read holds up no
            # 1.x one (what a session speaks, its frames say).
            for route in self._api.server.routes():
                found = await self._api.busy_on(route, where)
                self._monitor.named_busy(route, found)
                sessions |= found
                waited = waiting.answer(where, route, found)
                for session_id in waited:
                    if session_id in found and only in (None, session_id):
                        if not self._monitor.acting_on(session_id):
                            seeded += await self._seed(session_id, where)
                self._feed(waiting.free(waited))
            return where, sessions

        def asks() -> Iterator[Awaitable[tuple[str | None, set[str]]]]:
            order, done = iter(waiting.asked), set[str | None]()
            while len(done) < len(waiting.asked):
                urgent = [w for w in waiting.urgent() if w not in done]
                where = urgent[0] if urgent else next(w for w in order if w not in done)
                done.add(where)
                yield ask(where)

        busy: dict[str, str | None] = {}
        for where, sessions in await bounded(asks()):
            busy.update(dict.fromkeys(sessions, where))
        return busy, seeded

    async def _replay_engine_sessions(self, sessions: Iterable[str]) -> tuple[int, set[str]]:
        """New-engine sessions keep their events: what came while we were away is read from
        each one's last durable seq on and fed as if live (the adapter drops what the stream
        brings again). Of `sessions` (those running before or busy now, as the 1.x
        read-back), the new-engine ones we followed. How many events, and the sessions
        whose history could not be read: those are read back from their messages instead."""
        monitor = self._monitor
        asked = [(s, after) for s in sessions if (after := monitor.last_seq(s)) is not None]
        failed: set[str] = set()

        async def history(session_id: str, after: int) -> list[dict[str, Any]]:
            try:
                return await self._api.history(session_id, after)
            except SessionGone:
                monitor.gone(session_id)
            except ServerError as exc:
                # Issue 33: a history answering 500 lost the calls made while we were away,
                # and with them a loop they completed; the message list still has them.
                log.warning("session.replay_failed", session_id=session_id, error=str(exc))
                failed.add(session_id)
            return []

        # Read concurrently, within the bound, then fed in order: the sessions' frames wait.
        answers = await bounded(history(session_id, after) for session_id, after in asked)
        for events in answers:
            for event in events:
                self._take(event)
        return sum(map(len, answers)), failed

    async def run(self, first: bool) -> None:
        """Events missed while away are gone: rebuild every run from the server's record.

        `monitor.core.resync` plans it; this asks the server and carries the plan out.
        """
        monitor = self._monitor
        # Outside a connect (`hold`), as a test may run it, no frame waits.
        waiting = self.waiting or self._waiting(())
        try:
            busy, seeded = await self._busy(waiting)
        except ServerError as exc:
            # Without an answer we cannot tell finished runs from live ones: keep them all.
            log.warning("stream.resync_failed", error=str(exc))
            return
        only = self._only_session
        live = waiting.live
        plan = plan_resync(
            busy,
            # A session the stream has followed since the connect: its run is its own to end.
            {s: w for s, w in monitor.known().items() if s not in live},
            None if only is None else {only},
            [s for s in busy if s in live or monitor.acting_on(s)],
        )
        # Their records are read from now on: their frames wait, so the read-back comes
        # first (what the stream brought before is in the record, and counts once).
        self._claim(session for session, _ in plan.read_back)
        running = {s: w for s, w in monitor.running().items() if s not in live}
        # A refusal that waited in a run found over is released to be carried out late.
        self._execute(monitor.end_runs(plan.end_runs, self._clock()))
        # Read back concurrently, within the bound; the frames of these sessions wait. A
        # new-engine session we followed is replayed from its last seq instead.
        replayed, unreplayed = await self._replay_engine_sessions(
            {*running, *(s for s in busy if s not in live)}
        )
        read_back = [
            (s, w) for s, w in plan.read_back if monitor.last_seq(s) is None or s in unreplayed
        ]
        seeded += sum(await bounded(self._seed(session, where) for session, where in read_back))
        pending = await self._read_back_permissions(
            directories_to_ask(busy, self._settings.directory)
        )
        held = await self._read_back_held(busy, first)
        log.info(
            "stream.resynced",
            busy=len(busy),
            seeded=seeded,
            replayed=replayed,
            pending_permissions=pending,
            held=held,
        )

    async def _read_back_held(self, busy: dict[str, str | None], first: bool) -> int:
        """Held sessions are idle, so the busy ones' read-back misses them: read back those we
        hold (a person may have written while we were away) and, at start, the most recently
        updated sessions, as many as the session table holds (held before a restart, or with
        an earlier process's interventions the ladder must count). How many are held."""
        candidates = {
            session_id: where
            for session_id, where in self._monitor.held().items()
            if session_id not in busy and not self._monitor.acting_on(session_id)
        }
        if first and self._only_session is None:
            try:
                listed = await self._api.sessions(self._settings.directory)
            except ServerError as exc:
                log.warning("session.list_failed", error=str(exc))
                listed = []
            live = self._live()
            for session_id, where in recent_sessions(
                listed, self._settings.max_sessions, self._settings.directory
            ).items():
                # One the stream followed meanwhile runs: a person wrote, it is not held.
                if session_id not in busy and session_id not in live:
                    candidates.setdefault(session_id, where)
        self._claim(candidates)
        await bounded(self._read_hold(session, where) for session, where in candidates.items())
        return self._monitor.held_sessions()

    async def _read_hold(self, session_id: str, directory: str | None) -> None:
        """Whether an idle session waits for a person, and how often it was intervened in,
        from its messages: an idle session that a restart found between two loops continues
        the ladder where it was."""
        try:
            route = self._monitor.route(session_id)
            messages = await self._api.messages(
                session_id, directory, last=RECENT_HISTORY, route=route
            )
        except SessionGone:
            self._monitor.gone(session_id)
            return
        except ServerError as exc:
            log.warning("session.read_back_failed", session_id=session_id, error=str(exc))
            return
        self._monitor.idle_read(session_id, directory, messages)

    async def _read_back_permissions(self, directories: Iterable[str | None]) -> int:
        """The stream does not replay permission requests made while we were away: read the
        pending ones back (after the runs are seeded, so a loop's call is known as one) and
        answer them under the same rules. Their number."""
        if not self._monitor.reads_permissions():
            return 0
        count = 0
        for directory in directories:
            try:
                requests = await self._api.pending_permissions(directory)
            except ServerError as exc:
                log.warning("permission.read_back_failed", error=str(exc))
                continue
            for request in requests:
                frame = {"type": "permission.asked", "properties": request}
                if directory is not None:
                    frame = {"directory": directory, "payload": frame}
                fed, commands = self._monitor.event(frame, self._clock())
                count += fed.event_type == "permission.asked" and fed.malformed is None
                self._execute(commands)
        return count

    async def _seed(self, session_id: str, directory: str | None) -> int:
        """Seed one busy session's current run from its messages; 1 if it was seeded."""
        try:
            route = self._monitor.route(session_id)
            messages = await self._api.messages(session_id, directory, route=route)
        except SessionGone:
            self._monitor.gone(session_id)
            return 0
        except ServerError as exc:
            log.warning("session.seed_failed", session_id=session_id, error=str(exc))
            return 0
        self._execute(self._monitor.seed(session_id, directory, messages, self._clock()))
        return 1
