"""Revisits: re-reading what the run already read, in any order, with nothing changed since.

Paging through one file in the same 14 or 17 views over and over is a cycle longer than
`cycle` looks for (periods up to 10, repeated 3 times, in 32 calls of history), and re-reading
the same things in a shuffled order is no cycle at all. Both are one loop: the calls bring
nothing new. A call is a *revisit* when the same call (same digest) came back with the same
outcome earlier in the run (within the last `memory` distinct calls) and no call changed files
since then. `window` calls of which at least `revisits` are revisits are a loop.

Position-dependent calls (`scroll_down`, `goto`) are the same call each time; their outcome
tells the views apart, so a scroll through a file is no revisit until it wraps around.

Inputs, per finished call in order: `CallFacts` (monitor/core/rules/facts.py). Progress
signals: `file.edited` / `session.diff` outside a call clear the memory through `changed()`
(what was read may read differently now); `todo.updated` is ignored. Memory per session: two
arrays of `memory` 8-byte digests and the window as one int bitmask, about 1.2 KB at the
default 64; cost per call: a linear search of `memory` machine words (in C) and a popcount.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from monitor.core.rules.facts import CallFacts
from monitor.core.signature import signature_digest


@dataclass(frozen=True, slots=True)
class RevisitFinding:
    """`revisits` of the last `window` calls brought back what the run had already seen."""

    revisits: int
    window: int
    tools: tuple[str, ...]


class Revisit:
    """One session's run; `see` each finished call."""

    __slots__ = ("window", "revisits", "memory", "_seen", "_next", "_bits", "_calls", "_tools")

    def __init__(self, window: int = 16, revisits: int = 12, memory: int = 64) -> None:
        if not 0 < revisits <= window:
            raise ValueError("revisits must be between 1 and window")
        self.window = window
        self.revisits = revisits
        self.memory = memory
        self._seen = array("q")  # (call, outcome) digests since the last change, a ring
        self._next = 0
        self._bits = 0  # bit i: the i-th newest call was a revisit
        self._calls = 0
        self._tools: dict[str, None] = {}  # tools of the revisits, for the finding

    def changed(self) -> None:
        """Files changed: what was read may read differently now."""
        del self._seen[:]
        self._next = 0

    def see(self, call: CallFacts) -> RevisitFinding | None:
        if call.changes:
            self.changed()
            revisit = False
        else:
            pair = signature_digest(f"{call.digest}\x00{call.outcome}")
            seen = self._seen
            revisit = pair in seen
            if not revisit:
                if len(seen) < self.memory:
                    seen.append(pair)
                else:
                    seen[self._next] = pair
                    self._next = (self._next + 1) % self.memory
        mask = (1 << self.window) - 1
        self._bits = ((self._bits << 1) | revisit) & mask
        self._calls += 1
        if revisit:
            self._tools[call.tool] = None
        if not revisit or self._bits.bit_count() < self.revisits:
            return None
        count, window = self._bits.bit_count(), min(self._calls, self.window)
        found = RevisitFinding(count, window, tuple(self._tools))
        self._bits = 0
        self._tools = {}
        return found
