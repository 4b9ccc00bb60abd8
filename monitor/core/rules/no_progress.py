"""Rule `no_progress`: the same check keeps reporting the same thing while the run changes things.

The agent edits, reruns its check, edits again, reruns: every edit differs, so no cycle forms,
and the check prints the same result each time (in real runs: a script that imported another
installed copy of the package, so no edit could ever matter). A *check* is a call that changes
nothing (`changes_files` false, monitor/core/rules/facts.py); it *stalls* when it runs again,
with the same `Call.digest`, after at least one change since its previous run, and reports
the same `Call.outcome` as then. `repeats` runs of one check with the same outcome, each after
changes, are a loop. Plain reruns with nothing changed in between are `cycle`'s business and
neither count nor reset; a different outcome resets the check's count (the edits did
something).

A check that prints nothing and succeeds is never counted: silence says nothing about
whether an edit mattered (`sed -i` and `grep -q` in turn are normal), and runs of silent
successes are legitimate work (the real corpus's `silent_success` set).

Signals read: each finished call's `digest`, `outcome`, tool and arguments (for
`changes_files`), and the server's change signals (`session.diff` with new files, a
`file.edited` in the session's directory: `server_changes`), each counted as a change.
`todo.updated` is not progress. Memory: at most `MAX_CHECKS` checks per run, the least
recently run forgotten first, packed in one array (24 bytes a check, 288 bytes when full),
made at the first check of the run; cost per finished call: a search of at most 36 machine
words (in C).
"""

from __future__ import annotations

from array import array

from monitor.core.findings import Finding, NoProgress
from monitor.core.rules.facts import changes_files, server_changed
from monitor.core.session import Call, SessionRecord, outcome_digest

NAME = "no_progress"
MAX_CHECKS = 12
# Silent successes, with and without an exit status (bash has one, read does not).
SILENT = frozenset(
    {
        outcome_digest("completed", "", None, {"exit": 0}),
        outcome_digest("completed", "", None, None),
    }
)
# A check's counters, packed in one 64-bit word: the changes seen at its last run and at its
# first (24 bits each, compared modulo 2**24), and its runs (15 bits).
_BITS = 24
_MASK = (1 << _BITS) - 1


class Checks:
    """One run's checks, packed in one array, three words a check: its digest, its outcome
    and its counters."""

    __slots__ = ("changes", "signals", "checks")

    def __init__(self) -> None:
        self.changes = 0  # changing calls and server change signals seen so far
        self.signals = 0  # `server_changes` at the previous call
        self.checks = array("q")


def _find(checks: array[int], digest: int) -> int:
    """Where the check `digest` starts in `checks`, or -1."""
    start = 0
    while True:
        try:
            index = checks.index(digest, start)
        except ValueError:
            return -1
        if index % 3 == 0:
            return index
        start = index + 1  # an outcome or counters equal to the digest: look on


class NoProgressRule:
    """Rule `no_progress`: one check's same outcome `repeats` times, changes before each."""

    reads_recorded = False
    reads_finished = True  # outcomes only

    def __init__(self, repeats: int, max_checks: int = MAX_CHECKS) -> None:
        self.repeats = repeats
        self.max_checks = max_checks

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> Finding | None:
        if not finished or call.outcome is None:
            return None
        changes = changes_files(call.tool, call.args)
        state: Checks | None = session.peek(NAME)
        if state is None:
            if changes or call.outcome in SILENT:
                return None  # a change before any check changes nothing that is counted
            state = session.state(NAME, Checks)
        if server_changed(session, state):
            state.changes += 1
        if changes:
            state.changes += 1
            return None
        if call.outcome in SILENT:
            return None
        now = state.changes & _MASK
        checks = state.checks
        index = _find(checks, call.digest)
        if index < 0 or checks[index + 1] != call.outcome:
            runs, first = 1, now
        else:
            packed = checks[index + 2]
            last, first, runs = packed & _MASK, (packed >> _BITS) & _MASK, packed >> 2 * _BITS
            if last != now:
                runs += 1
        if index >= 0:  # taken out, to go back in last: the least recently run goes first
            del checks[index : index + 3]
        elif len(checks) >= 3 * self.max_checks:
            del checks[0:3]
        if runs >= self.repeats:
            return NoProgress(call.tool, runs, (now - first) & _MASK)
        checks.extend((call.digest, call.outcome, (runs << 2 * _BITS) | (first << _BITS) | now))
        return None
