"""Rule `circles`: searching in circles, looking and finding nothing, with nothing changed.

A model that looks for something that is not there rewrites its search each time (ten
different `find`/`grep` commands whose filter drops every hit; `find_file`, `search_dir`,
`search_file` for a symbol that does not exist), so no cycle forms, the outputs differ (each
names its term) or are silent successes, and no check repeats: `cycle`, `failure`,
`no_progress` and `revisit` all miss it. What these runs share is that the searches bring
nothing: they come back empty, fail, or bring back what an earlier call of the run already
brought back, and nothing is edited in between.

A call is a *search* when it only looks (`SEARCH_TOOLS`, or a bash command whose program is
one that looks: `find`, `grep`, `rg`, `ls`, `cat`, `sed -n`, ...) and changes no file; it is
*fruitless* when it failed (`failure.failed`), its answer is empty or says nothing was found
("No matches found", "No files found", ...), or its answer (`Call.outcome`) is one the run
already had since the last change. `fruitless` of the last `WINDOW` calls are a
loop when at least one of them found nothing or failed: a window of re-reads alone is
`revisit`'s (its own window and count), so the two rules do not report one loop twice. Calls
that are not searches take their place in the window without counting; a call that changes
files, or the server's change signals (`session.diff`, `file.edited`), empty the window and
the memory of answers: what was searched for may be there now.

A family of searches through one filter is circling sooner: `SAME_FILTER` (6) bash searches
since the last change whose pipe ends in the same stage (`... | grep -v test`) that each
found nothing, with no search through it finding anything between (issue 31: nine different
`find`/`grep` commands, each ending in the filter that removed every hit). On the shared real
corpus no run has more than 3 such searches through one filter (4 to 6 would fire on none).

Signals read: each finished call's tool, arguments (the bash command), status, exit status,
output and `outcome`. Memory per run: at most `MEMORY` 32-bit outcome digests in an array
(256 bytes at 64) and the window as two int bitmasks, made at the run's first search that
finds nothing (none before: a run that always finds something costs nothing); cost per
finished call: one or two anchored regular expressions over the
command and the answer's first line, a search of `MEMORY` machine words (in C) and a
popcount.
"""

from __future__ import annotations

import re
from array import array
from typing import Any

from monitor.core.findings import Finding, SearchCircles
from monitor.core.patterns import TextPattern
from monitor.core.rules.facts import (
    OutcomeRule,
    named,
    remember,
    run_state,
    server_changed,
    tool_is,
)
from monitor.core.rules.failure import failed
from monitor.core.session import Call, SessionRecord
from monitor.core.signature import text_crc

__all__ = ["CirclesRule", "SAME_FILTER", "WINDOW", "filter_of", "found_nothing", "looks"]

NAME = "circles"
WINDOW = 12
MEMORY = 64

# Tools that only look: OpenCode's, and SWE-agent's ACI commands (the real corpus).
SEARCH_TOOLS = frozenset(
    {
        "read",
        "grep",
        "glob",
        "list",
        "codesearch",
        "find_file",
        "search_dir",
        "search_file",
        "open",
        "goto",
        "scroll_up",
        "scroll_down",
    }
)
# A bash command that looks: its program (after any `cd DIR &&`) is one that reads or
# searches. What follows in a pipe does not matter: `find . | grep x` still only looks.
_LOOKS = re.compile(
    r"^\s*(?:cd\s+\S+\s*(?:&&|;)\s*)*"
    r"(?:find|grep|egrep|fgrep|rg|ag|ack|ls|cat|head|tail|nl|wc|tree|which|locate|file|stat"
    r"|git\s+(?:grep|log|show|ls-files|status|diff)|sed\s+-n|awk)\b"
)
# An answer that says nothing was found, on its first line (the tools' own words, OpenCode's
# bash for an empty output, and the shell's for a missing file or program).
_NOTHING = TextPattern(
    r"\s*(?:No (?:matches|files|results) found|Did not find|Found 0 |\(no output\))"
    r"|[^\n]*(?:No such file or directory|command not found)",
    re.IGNORECASE,
)
# Enough of an answer's start to hold its first line's verdict.
_HEAD = 512
# Empty searches through one filter that are a loop, and the filters remembered at once.
SAME_FILTER = 6
MAX_FILTERS = 8
# A shell command's tokens: quoted strings (a `|` in them is no pipe), `||`, `|`, the rest.
_TOKENS = re.compile(r"'[^']*'|\"(?:\\.|[^\"\\])*\"|\|\||\||[^'\"|]+|['\"]")


def looks(tool: str, args: Any) -> bool:
    """The call only looks (a read or a search), by what it is."""
    return tool_is(tool, args, SEARCH_TOOLS, _LOOKS)


def found_nothing(output: Any) -> bool:
    """The answer is empty, or says that nothing was found."""
    if not isinstance(output, str):
        return output is None
    head = output[:_HEAD].lstrip()
    return not head or _NOTHING.of(head).match(head) is not None


def filter_of(tool: str, args: Any) -> int | None:
    """A digest of the last stage of a bash command's pipe (its filter), or None without one."""
    if tool != "bash" or not isinstance(args, dict) or not isinstance(args.get("command"), str):
        return None
    tokens = _TOKENS.findall(args["command"])
    if "|" not in tokens:
        return None
    last = len(tokens) - 1 - tokens[::-1].index("|")
    stage = " ".join("".join(tokens[last + 1 :]).split())
    return text_crc(stage) if stage else None


class Searches:
    """One run's fruitless-search window and the answers seen since the last change."""

    __slots__ = ("bits", "misses", "calls", "seen", "oldest", "signals", "tools", "filters")

    def __init__(self) -> None:
        self.bits = 0  # bit i: the i-th newest call was a fruitless search
        self.misses = 0  # bit i: ... and it found nothing or failed
        self.calls = 0  # calls in the window so far (at most WINDOW count)
        self.seen = array("I")  # a ring of at most MEMORY outcome digests, 32 bits each
        self.oldest = 0
        self.signals = 0  # `server_changes` at the previous call
        self.tools: list[str] | None = None  # tools of the fruitless searches, for the finding
        # Empty searches through each filter since the last change (made at the first).
        self.filters: dict[int, int] | None = None

    def clear(self) -> None:
        self.bits = self.misses = self.calls = self.oldest = 0
        del self.seen[:]
        self.tools = self.filters = None

    def through(self, stage: int, missed: bool) -> int:
        """How many searches through the filter `stage` found nothing since the last change
        and the last that found something through it, this one counted."""
        filters = self.filters
        if filters is None:
            filters = self.filters = {}
        if not missed:
            filters.pop(stage, None)
            return 0
        if stage not in filters and len(filters) >= MAX_FILTERS:
            del filters[next(iter(filters))]
        filters[stage] = filters.get(stage, 0) + 1
        return filters[stage]


class CirclesRule(OutcomeRule):
    """Rule `circles`: `fruitless` of the last `WINDOW` calls were searches that brought
    nothing new, with nothing changed."""

    def __init__(self, fruitless: int, memory: int = MEMORY) -> None:
        if not 0 < fruitless <= WINDOW:
            raise ValueError(f"fruitless must be between 1 and {WINDOW}")
        self.fruitless = fruitless
        self.memory = memory

    def finished_call(
        self, session: SessionRecord, call: Call, outcome: int, changes: bool
    ) -> Finding | None:
        search = not changes and looks(call.tool, call.args)
        output = call.error if call.status == "error" else call.output
        missed = search and (failed(call) or found_nothing(output))
        # No window holds a loop before a search finds nothing.
        state = run_state(session, NAME, Searches, needed=missed)
        if state is None:
            return None
        if server_changed(session, state) or changes:
            state.clear()
            if changes:
                return None
        fruitless = missed
        if search:
            seen, answer = state.seen, outcome & 0xFFFFFFFF
            fruitless = missed or answer in seen
            if answer not in seen:
                state.oldest = remember(seen, state.oldest, answer, self.memory)
        state.bits = ((state.bits << 1) | fruitless) & ((1 << WINDOW) - 1)
        state.misses = ((state.misses << 1) | missed) & ((1 << WINDOW) - 1)
        state.calls = min(state.calls + 1, WINDOW)
        stage = filter_of(call.tool, call.args) if search else None
        through = 0 if stage is None else state.through(stage, missed)
        if not fruitless:
            return None
        state.tools = named(state.tools, call.tool)
        count = state.bits.bit_count()
        if through >= SAME_FILTER:
            found = SearchCircles(through, through, tuple(state.tools), filtered=True)
        elif count >= self.fruitless and state.misses:
            found = SearchCircles(count, state.calls, tuple(state.tools))
        else:
            return None
        state.clear()
        return found
