"""Resync planning: after a (re)connect, what to believe about the runs we were following.

The stream does not replay what happened while we were away (OpenCode ignores
`Last-Event-ID`), so after every connect the shell asks the server which sessions are busy
and reads their current runs back. This module decides, from data only, where to ask and
what to do with the answer; `monitor.shell.resync` makes the requests.

The shell connects the stream before it asks, so nothing that happens meanwhile is lost:
the frames of a session being rebuilt wait until it is (`waits_on` says what a session
unknown at the connect waits for), the others are fed at once. Busy is asked before the
messages are read: a run that ends in between still leaves its `session.idle` on the stream,
which ends the read-back run; the other order could take a finished run for a current one.

A stream can also stall while connected (events stop, heartbeats go on): `missed_by_stream`
compares what we followed with what the server reports, so the shell reconnects, and so
resyncs, when the two disagree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from monitor.core.events import Malformed
from monitor.core.events_v2 import session_of
from monitor.core.export import current_run, tool_parts
from monitor.core.frames import FrameError, decode_frame

__all__ = [
    "Waiting",
    "ResyncPlan",
    "directories_to_ask",
    "finished_calls",
    "missed_by_stream",
    "plan_resync",
    "recent_sessions",
    "waits_on",
]


@dataclass(frozen=True, slots=True)
class ResyncPlan:
    """`end_runs`: sessions whose run is over; `read_back`: (session, directory) to seed."""

    end_runs: tuple[str, ...]
    read_back: tuple[tuple[str, str | None], ...]


def directories_to_ask(
    running: Mapping[str, str | None], configured: str | None
) -> set[str | None]:
    """Where to ask which sessions are busy: every directory a run we follow lives in.

    `configured` (`--directory`, or None for the server's own directory) is always asked, so
    that on the first connect the runs already under way there are found too. Busy sessions
    of other projects are picked up when their events show up: asking every project the
    server knows could start a server instance for each.
    """
    return {where for where in (*running.values(), configured) if askable(where)}


def askable(directory: str | None) -> bool:
    """Whether the server can be asked about `directory`: a lone surrogate (valid JSON in a
    frame or a plugin's question, not UTF-8) cannot go into a query. Such a directory is
    not asked and its runs are kept as they are: one session's odd folder must not fail the
    resync of every other, nor have its runs taken for ended."""
    if directory is None:
        return True
    try:
        directory.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def waits_on(
    directory: str | None, asked: Collection[str | None], configured: str | None
) -> tuple[str | None, ...]:
    """The directory whose answer a session unknown at the connect waits for, when its
    frames come during the resync: its own, if asked, else the configured one's (the
    server's own directory, which may list it busy); () when neither is asked. Busy
    there, it is read back before its frames are fed; else they are fed at once."""
    for where in (directory, configured):
        if where in asked:
            return (where,)
    return ()


def plan_resync(
    busy: Mapping[str, str | None],
    known: Mapping[str, str | None],
    follows: Collection[str] | None,
    acting_on: Iterable[str],
) -> ResyncPlan:
    """What to do after a connect, given the server's answer.

    `busy` maps each busy session to the directory it was found in; `known` maps the
    sessions we know to their directories (what the stream told us, None if it did not);
    `follows` is the only sessions we watch (attach), None for all; `acting_on` are the
    sessions whose intervention is still under way.
    """
    # A run that the server no longer calls busy ended while we were away (its
    # `session.idle` is lost): its history must go, or its calls would join the next run's.
    end_runs = tuple(
        session_id
        for session_id, directory in known.items()
        if session_id not in busy and askable(directory)
    )
    acting = set(acting_on)
    read_back = tuple(
        # The stream told us where a session lives; otherwise, where we found it busy.
        (session_id, known.get(session_id) or directory)
        for session_id, directory in busy.items()
        # A session we do not follow is not ours to read; one we are acting on is being
        # stopped, and reading back the run we are stopping would find the same loop again.
        if (follows is None or session_id in follows) and session_id not in acting
    )
    return ResyncPlan(end_runs, read_back)


def finished_calls(messages: object, skip: Collection[str]) -> int:
    """Tool calls of the session's current run that the server has finished (`skip`: the
    transparent tools, which the tracker does not count either)."""
    if not isinstance(messages, list):
        return 0
    count = 0
    for message in current_run(messages):
        for part in tool_parts(message):
            state = part.get("state")
            status = state.get("status") if isinstance(state, dict) else None
            count += part.get("tool") not in skip and status in ("completed", "error")
    return count


def missed_by_stream(
    ours: Mapping[str, int], busy: Collection[str], theirs: Mapping[str, int]
) -> list[str]:
    """The sessions the stream has fallen silent about, from the server's own state.

    `ours`: the runs we follow, with the calls we counted; `busy`: the sessions the server
    runs; `theirs`: the finished calls of its current run, for the busy ones we asked about.
    A run the server calls idle ended without our seeing it; one with more finished calls
    than we counted made calls we never saw. A long call, quiet and under way, is neither.
    """
    return [
        session_id
        for session_id, calls in ours.items()
        if session_id not in busy or theirs.get(session_id, 0) > calls
    ]


def recent_sessions(sessions: object, limit: int, directory: str | None) -> dict[str, str | None]:
    """The `limit` most recently updated of the sessions `GET /session` listed, with their
    directories: at start, the ones to read back for a hold an earlier monitor put them on
    (a held session is idle, so the busy ones' read-back never finds it)."""
    found: list[tuple[float, str, str | None]] = []
    for info in sessions if isinstance(sessions, list) else ():
        session_id = info.get("id") if isinstance(info, dict) else None
        if not isinstance(session_id, str) or not session_id:
            continue
        time = info.get("time")
        updated = time.get("updated") if isinstance(time, dict) else None
        own = info.get("directory")
        found.append(
            (
                updated if isinstance(updated, int | float) else 0,
                session_id,
                own if isinstance(own, str) and own else directory,
            )
        )
    found.sort(key=lambda entry: entry[0], reverse=True)
    return {session_id: where for _, session_id, where in found[:limit]}


class Waiting:
    """While a resync runs, the frames of the sessions it rebuilds wait, each session's in
    order, and every other session's go to the tracker at once: a loop they complete is
    stopped ahead of the resync's bulk reads (issue 33: 3.1 s behind 10,001 status reads).

    The sessions known at the connect wait for the whole resync (it ends, reads back or
    replays them), as do those it `claim`s. A session unknown at the connect waits only for
    the answer of the directory it may be busy in (`waits_on`), which the resync asks first:
    busy there, it is read back before its frames are fed; else they are fed at once. A
    session fed during the resync is `live`: the stream follows it, no resync ends its run."""

    def __init__(
        self, known: Iterable[str], asked: Iterable[str | None], configured: str | None
    ) -> None:
        self._held = set(known)
        self.asked = list(asked)
        self._configured = configured
        # A directory's answer for an engine: who waits for it, in the order they came.
        self._on: dict[tuple[str | None, int], dict[str, None]] = {}
        # By session, each frame with its place on the stream: frames let go together are
        # fed in the stream's order, also across sessions (which one a bounded table
        # forgets first, a parent seen before its child, depend on it).
        self._frames: dict[str, list[tuple[int, object]]] = {}
        self._arrived = itertools.count()
        self.answered: set[tuple[str | None, int]] = set()
        self.busy: set[str] = set()  # in the directories answered so far
        self.live: set[str] = set()

    def claim(self, sessions: Iterable[str]) -> None:
        """From now on these sessions' frames wait too (their record is about to be read)."""
        self._held.update(sessions)

    def admit(self, data: str) -> object | None:
        """The decoded frame to feed now, or None when it waits."""
        try:
            frame: object = decode_frame(data)
        except FrameError as exc:
            return Malformed(str(exc))
        session_id, directory, engine = session_of(frame)
        if session_id is None or not self.waits(session_id, directory, engine):
            return frame
        self._frames[session_id].append((next(self._arrived), frame))
        return None

    def waits(self, session_id: str, directory: str | None, engine: int) -> bool:
        """Whether the session's frames, and the plugin's questions about it, wait for the
        resync. A session first named now (by a frame, or by a question that came before
        any frame of it) is placed: followed at once, read back with the others, or waiting
        for the answer of the directory it may be busy in, which is asked next."""
        if session_id in self.live:
            return False
        if session_id in self._frames:
            return True
        if session_id not in self._held:
            on = [(where, engine) for where in waits_on(directory, self.asked, self._configured)]
            if not on or (on[0] in self.answered and session_id not in self.busy):
                self.live.add(session_id)
                return False
            if on[0] in self.answered:
                self._held.add(session_id)  # found busy: read back with the others
            else:
                self._on.setdefault(on[0], {})[session_id] = None
        self._frames[session_id] = []
        return True

    def urgent(self) -> list[str | None]:
        """The directories whose answer sessions wait for: asked first."""
        return [where for where, _ in self._on]

    def answer(self, directory: str | None, engine: int, busy: Collection[str]) -> list[str]:
        """`directory` answered `busy` for `engine` (2: the new one, whose sessions' frames
        are 2.x): the sessions of that engine that waited for it, first come first."""
        self.answered.add((directory, engine))
        self.busy.update(busy)
        return list(self._on.pop((directory, engine), {}))

    def free(self, sessions: Iterable[str]) -> list[object]:
        """The sessions' frames, to feed now in the stream's order; from here on their
        frames go on at once."""
        self.live.update(sessions)
        return _in_order(self._frames.pop(session_id, []) for session_id in sessions)

    def rest(self) -> list[object]:
        """Every frame still waiting, in the stream's order (the resync is over)."""
        frames = _in_order(self._frames.values())
        self._frames.clear()
        return frames


def _in_order(waited: Iterable[list[tuple[int, object]]]) -> list[object]:
    return [frame for _, frame in heapq.merge(*waited, key=lambda item: item[0])]
