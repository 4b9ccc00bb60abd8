"""Rule `revisit`: re-reading what the run already read, in any order, with nothing changed since.

Paging through one file in the same 14 or 17 views over and over is a cycle longer than
`cycle` looks for (periods up to 10, repeated 3 times, in 32 calls of history), and re-reading
the same things in a shuffled order is no cycle at all. Both are one loop: the calls bring
nothing new. A call is a *revisit* when the same call (`Call.digest`) came back with the same
`Call.outcome` earlier in the run (within the last `MEMORY` distinct calls) and nothing
changed files since then. `revisits` of the last `WINDOW` calls are a loop.

A `read` (with a `limit`) of lines the run already read from the same file, nothing changed
since, is a revisit too, whatever its `offset` and `limit`: at least `COVERED` of its window
was in the windows read before (a window that creeps or slides back and forth over the same lines;
paging on through a file reads new lines each time and is none). At most `FILES` files'
windows are kept, as merged ranges.

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
that changes nothing; cost per finished call: a search
of 64 machine words (in C) and a popcount.
"""

from __future__ import annotations

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
# A window that much inside what was read before reads (almost) nothing new.
COVERED = 0.8
FILES = 16
RANGES = 16  # apart, of one file


class Seen:
    """One run's remembered (call, outcome) digests since the last change, and the window."""

    __slots__ = ("seen", "next", "bits", "calls", "signals", "tools", "windows")

    def __init__(self) -> None:
        self.seen = array("I")  # a ring of at most MEMORY, 32 bits each
        self.next = 0
        self.bits = 0  # bit i: the i-th newest call was a revisit
        self.calls = 0
        self.signals = 0  # `server_changes` at the previous call
        self.tools: list[str] | None = None  # tools of the revisits, for the finding
        self.windows: dict[str, list[tuple[int, int]]] | None = None  # lines read, by file

    def clear(self) -> None:
        del self.seen[:]
        self.next = 0
        self.windows = None

    def reread(self, path: str, start: int, end: int) -> bool:
        """Whether lines `start` to `end` of `path` were mostly read before; they are now."""
        windows = self.windows
        if windows is None:  # made at the first read of a range: most runs read none
            windows = self.windows = {}
        ranges = windows.pop(path, [])
        before = sum(max(0, min(end, b) - max(start, a)) for a, b in ranges)
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*ranges, (start, end)]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        windows[path] = merged[-RANGES:]  # the newest file last
        while len(windows) > FILES:
            del windows[next(iter(windows))]
        return before >= COVERED * (end - start)


def _window(call: Call) -> tuple[str, int, int] | None:
    """The file and lines a `read` reads, or None for any other call."""
    args = call.args
    if call.tool != "read" or not isinstance(args, dict):
        return None
    # Without a limit the lines read depend on the file's length, which the call does not say.
    path, offset, limit = args.get("filePath"), args.get("offset", 0), args.get("limit")
    if not isinstance(path, str) or not isinstance(offset, int) or not isinstance(limit, int):
        return None
    if offset < 0 or limit <= 0:
        return None
    return path, offset, offset + limit


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
        revisit = False
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
        state.bits = ((state.bits << 1) | revisit) & ((1 << WINDOW) - 1)
        state.calls += 1
        if not revisit:
            return None
        state.tools = named(state.tools, call.tool)
        count = state.bits.bit_count()
        if count < self.revisits:
            return None
        found = Revisit(count, min(state.calls, WINDOW), tuple(state.tools))
        state.bits, state.tools = 0, None
        return found
