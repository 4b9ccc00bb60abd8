"""Rule `revisit`: re-reading what the run already read, in any order, with nothing changed since.

Paging through one file in the same 14 or 17 views over and over is a cycle longer than
`cycle` looks for (periods up to 10, repeated 3 times, in 32 calls of history), and re-reading
the same things in a shuffled order is no cycle at all. Both are one loop: the calls bring
nothing new. A call is a *revisit* when the same call (`Call.digest`) came back with the same
`Call.outcome` earlier in the run (within the last `MEMORY` distinct calls) and nothing
changed files since then. `revisits` of the last `WINDOW` calls are a loop.

A read of a window of lines (a `read` with a `limit`, or a shell's `sed -n 'A,Bp' FILE`) is
a revisit too when it is nearly the same window as one read before from the same file,
nothing changed since: they overlap by at least `NEAR` of the larger, whatever the calls'
arguments (a window that creeps around the same lines is another call with another answer
each time). A window inside the union of several earlier ones, or inside one much larger
(a full-file read), reads something else (issue 44: a second, shorter pass over pages read
before was stopped as a loop); a read that failed ("Invalid `view_range`") read no window.
`CREEP` reads in a row of nearly one window (the first of them), nothing changed, are a
loop at once. At most `RANGES` windows of `FILES` files are kept.

Position-dependent calls (`scroll_down`, `goto`) are the same call each time; their outcome
tells the views apart, so a scroll through a file is no revisit until it wraps around.

Signals read: each finished call's `digest`, `outcome`, tool and arguments
(`changes_files`, monitor/core/rules/facts.py: a call that changes files clears the memory,
what was read may read differently now), and the server's change signals (`session.diff`
with new files, `file.edited` in the session's directory), which clear it too.
A call that waits (monitor/core/rules/waiting.py: it sleeps or polls, or its answer says
"in progress") is never a revisit: waiting is rule `wait`'s, with its own allowance.
`todo.updated` is ignored. Memory per run: `MEMORY` 32-bit (call, outcome) digests in an
array (256 bytes at 64) and the window as one int bitmask, made at the run's first call
that changes nothing, the windows read (a list of pairs a file) and the creeping read (one
tuple); cost per finished call: a search of 64 machine words (in C), a popcount and, for a
window, a look at the file's at most `RANGES` earlier ones.
"""

from __future__ import annotations

import re
from array import array

from monitor.core.findings import Finding, Revisit
from monitor.core.rules.facts import OutcomeRule, named, remember, run_state, server_changed
from monitor.core.rules.waiting import answers_in_progress, waits_by_command
from monitor.core.session import Call, SessionRecord
from monitor.core.signature import int_digest

__all__ = ["RevisitRule", "WINDOW"]

NAME = "revisit"
WINDOW = 16
MEMORY = 64
# Two windows of one file that overlap by this much of the larger read nearly the same.
NEAR = 0.8
FILES = 16
RANGES = 16  # distinct windows, of one file
# Reads in a row of nearly one window, nothing changed, that make a loop at once (a window
# that creeps around the same lines, each one another call with another answer).
CREEP = 4


class Seen:
    """One run's remembered (call, outcome) digests since the last change, the window, the
    windows read by file, and the reads in a row of nearly one window (`creep`)."""

    __slots__ = ("seen", "next", "bits", "calls", "signals", "tools", "windows", "creep")

    def __init__(self) -> None:
        self.seen = array("I")  # a ring of at most MEMORY, 32 bits each
        self.next = 0
        self.bits = 0  # bit i: the i-th newest call was a revisit
        self.calls = 0
        self.signals = 0  # `server_changes` at the previous call
        self.tools: list[str] | None = None  # tools of the revisits, for the finding
        # The windows read since the last change, by file, newest file last: at most RANGES
        # distinct windows a file, FILES files.
        self.windows: dict[str, list[tuple[int, int]]] | None = None
        # The reads in a row of nearly one window: the first one's (file, start, end) and
        # how many.
        self.creep: tuple[str, int, int, int] | None = None

    def clear(self) -> None:
        del self.seen[:]
        self.next = 0
        self.windows = self.creep = None

    def reread(self, path: str, start: int, end: int) -> bool:
        """Whether lines `start` to `end` of `path` are nearly the same window as one read
        before (`near`); they are read now."""
        windows = self.windows
        if windows is None:  # made at the first read of a range: most runs read none
            windows = self.windows = {}
        kept = windows.pop(path, [])
        again = any(near(a, b, start, end) for a, b in kept)
        if (start, end) not in kept:
            kept = [*kept[1 - RANGES :], (start, end)]
        windows[path] = kept
        while len(windows) > FILES:
            del windows[next(iter(windows))]
        return again

    def crept(self, window: tuple[str, int, int] | None) -> int:
        """How many reads in a row, this one (`window`, None for any other call) included,
        read nearly the window the first of them read."""
        creep = self.creep
        if window is None:
            self.creep = None
            return 0
        path, start, end = window
        if creep is not None and creep[0] == path and near(creep[1], creep[2], start, end):
            self.creep = (*creep[:3], creep[3] + 1)
        else:
            self.creep = (path, start, end, 1)
        return self.creep[3]


def near(a: int, b: int, start: int, end: int) -> bool:
    """Whether windows `a`-`b` and `start`-`end` are nearly the same: they overlap by at
    least `NEAR` of the larger. A window inside a much larger one read before (a full-file
    read), or inside the union of several, reads something else (issue 44)."""
    overlap = min(b, end) - max(a, start)
    return overlap > 0 and overlap >= NEAR * max(b - a, end - start)


# What reads a window in a shell: `sed -n 'A,Bp' FILE`, or `cat FILE` / `nl -ba FILE` into
# it (mini-swe-agent's way of paging: 6,328 of its commands in the shared real runs).
_SED_WINDOW = re.compile(
    r"(?:(?:cat|nl)(?:\s+-\w+)*\s+(?P<piped>[^\s|;&<>]+)\s*\|\s*)?"
    r"sed\s+-n\s+(?P<q>['\"]?)(?P<a>\d+),(?P<b>\d+)p(?P=q)(?:\s+(?P<file>[^\s|;&<>]+))?"
)


def _window(call: Call) -> tuple[str, int, int] | None:
    """The file and lines a call reads, if it reads a window: a `read` with a `limit`, or a
    shell's `sed -n 'A,Bp'` of one file; None for any other call, and for one that failed
    (its window was not read: "Invalid `view_range`")."""
    args = call.args
    if call.status == "error" or not isinstance(args, dict):
        return None
    if call.tool == "bash":
        return _shell_window(args.get("command"))
    if call.tool != "read":
        return None
    # Without a limit the lines read depend on the file's length, which the call does not say.
    path, offset, limit = args.get("filePath"), args.get("offset", 0), args.get("limit")
    if not isinstance(path, str) or not isinstance(offset, int) or not isinstance(limit, int):
        return None
    if offset < 0 or limit <= 0:
        return None
    return path, offset, offset + limit


def _shell_window(command: object) -> tuple[str, int, int] | None:
    if not isinstance(command, str) or "sed" not in command:
        return None
    found = _SED_WINDOW.fullmatch(command.strip())
    if found is None or (found["piped"] is None) == (found["file"] is None):
        return None  # no file, or two
    start, end = int(found["a"]), int(found["b"]) + 1
    return (found["piped"] or found["file"], start, end) if start < end else None


def _waits(call: Call) -> bool:
    return waits_by_command(call.tool, call.args) or answers_in_progress(call.output)


class RevisitRule(OutcomeRule):
    """Rule `revisit`: `revisits` of the last `WINDOW` calls brought nothing new."""

    def __init__(self, revisits: int, memory: int = MEMORY) -> None:
        if not 0 < revisits <= WINDOW:
            raise ValueError(f"revisits must be between 1 and {WINDOW}")
        self.revisits = revisits
        self.memory = memory

    def finished_call(
        self, session: SessionRecord, call: Call, outcome: int, changes: bool
    ) -> Finding | None:
        # A change with nothing remembered yet has nothing to clear: no state needed.
        state = run_state(session, NAME, Seen, needed=not changes)
        if state is None:
            return None
        if server_changed(session, state):
            state.clear()
        revisit, crept = False, 0
        if changes:
            state.clear()
        else:
            pair = int_digest(call.digest, outcome) & 0xFFFFFFFF
            seen = state.seen
            # A wait (a poll answered "in progress") is `wait`'s, with its larger allowance.
            window = _window(call)
            reread = window is not None and state.reread(*window)
            revisit = (pair in seen or reread) and not _waits(call)
            if not revisit and pair not in seen:
                state.next = remember(seen, state.next, pair, self.memory)
            crept = state.crept(window)
        state.bits = ((state.bits << 1) | revisit) & ((1 << WINDOW) - 1)
        state.calls += 1
        if not revisit:
            return None
        state.tools = named(state.tools, call.tool)
        count = state.bits.bit_count()
        if crept >= CREEP:  # nearly one window read again and again, in a row
            state.bits, state.tools, state.creep = 0, None, None
            return Revisit(crept, crept, (call.tool,))
        if count < self.revisits:
            return None
        found = Revisit(count, min(state.calls, WINDOW), tuple(state.tools))
        state.bits, state.tools = 0, None
        return found
