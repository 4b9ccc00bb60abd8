"""Rule `runaway`: one call that does not end: it streams the same output over and over, or
runs past its time bound.

A local model answered the monitor's feedback with `bash -c 'while true; do echo ...; sleep
0.01; done'` (../shared/realmodel): one call, never finished, its output the same line again
and again. OpenCode re-sent that call's `running` update about 87 times a second (each carrying
the output so far, the last 30,000 characters once it is longer), 320 MB of stream in two
minutes, until bash's own timeout ended it. No rule over finished calls sees it: it has not
finished.

Only the re-sent `running` updates of a call already recorded are read (`reads_running`), from
the update's `state.metadata.output` (bash's streamed output; other tools stream none). An
update *repeats* when the last `LINES` complete lines of that output are one and the same
non-blank line; `updates` repeating updates of one call in a row are a runaway. An update that
does not repeat starts the call's count over: a long build or test run prints different
lines, and a command that printed a block of equal lines once moves on.

The cost is bounded whatever the output: only its last `TAIL` characters are looked at (one
slice, one split and one count in C), and the state is one small int per call that repeats,
dropped with the run. Calls read back after a reconnect and calls of a loop just stopped
(no longer `running` in their life, monitor/core/calls.py) are not judged: the abort ends them.

The time bound (`call_bound`): the core has no clock, so when a call starts running the
tracker hands the shell a `Deadline` (its part and its bound); the shell feeds it back
(`Tracker.overdue`) once the bound has passed, and a call still running then is a runaway.
The bound is `--call-seconds` for every call when set, else what the server allows a bash
call (its `timeout` argument, or OpenCode's 2 minutes) plus `GRACE_S`: a backstop for a call
the server did not end; other tools have none. Calls read back after a reconnect get no
deadline (when they started is not known).
"""

from __future__ import annotations

from typing import Any

from monitor.core.calls import CallState
from monitor.core.findings import Finding, RunawayCall
from monitor.core.session import Call, SessionRecord

__all__ = ["GRACE_S", "LINES", "RunawayRule", "SERVER_BASH_S", "call_bound", "repeats"]

NAME = "runaway"
LINES = 20
# Enough of the output's end to hold `LINES` lines of a typical length; a longer line is no
# repeated line as far as this rule goes (it then relies on the server's own timeout).
TAIL = 4096


def repeats(output: Any) -> bool:
    """The streamed output ends in the same non-blank line `LINES` times (its last, unfinished
    line aside)."""
    if not isinstance(output, str) or len(output) < 2 * LINES:
        return False
    lines = output[-TAIL:].split("\n")
    lines.pop()  # the line still being written, or "" after the final newline
    if len(lines) <= LINES:  # the first may be cut by the slice
        return False
    last = lines[-1]
    return bool(last.strip()) and lines[-LINES:].count(last) == LINES


class Streaming:
    """One run's calls whose updates repeat, by part id: how many in a row."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}


class RunawayRule:
    """Rule `runaway`: `updates` re-sent updates of one call in a row repeat one line."""

    reads_recorded = False
    reads_finished = False
    reads_running = True  # the re-sent `running` updates only

    def __init__(self, updates: int) -> None:
        self.updates = updates

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> Finding | None:
        if recorded or finished or call.state is not CallState.RUNNING:
            return None
        metadata = call.metadata
        output = metadata.get("output") if isinstance(metadata, dict) else None
        if not repeats(output):
            state: Streaming | None = session.peek(NAME)
            if state is not None:
                state.counts.pop(call.part_id, None)
            return None
        counts = session.state(NAME, Streaming).counts
        count = counts.get(call.part_id, 0) + 1
        if count < self.updates:
            counts[call.part_id] = count
            return None
        del counts[call.part_id]
        return RunawayCall(call.tool, count, LINES)


# OpenCode's limit for a bash call without a `timeout` argument (1.18.33: the server's
# OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS, else 2 minutes), and how long after the
# server should have ended a call it counts as still running: the server's own end (its error
# update) takes a moment to arrive.
SERVER_BASH_S = 120.0
GRACE_S = 30.0


def call_bound(tool: str, args: Any, seconds: float) -> float | None:
    """How long a call may run before it is a runaway, or None for no bound: `seconds` for
    every call when above 0, none below; else (0) what the server allows a bash call, its
    `timeout` argument (milliseconds) or the server's default, plus `GRACE_S`: a bash call
    still running then was not ended by the server. Other tools (a subagent's `task` can run
    for an hour) have no bound unless one is set."""
    if seconds > 0:
        return seconds
    if seconds < 0 or tool != "bash":
        return None
    timeout = args.get("timeout") if isinstance(args, dict) else None
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return timeout / 1000 + GRACE_S
    return SERVER_BASH_S + GRACE_S
