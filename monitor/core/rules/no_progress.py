"""No progress: the same check keeps reporting the same thing while the run changes things.

The agent edits, reruns its check, edits again, reruns: every edit differs, so no cycle forms,
and the check prints the same result each time (in real runs: a script that imported another
installed copy of the package, so no edit could ever matter). A *check* is a call that changes
nothing (`CallFacts.changes` false); it *stalls* when it runs again, with the same digest,
after at least one changing call since its previous run, and reports the same outcome as
then. `repeats` runs of one check with the same outcome, each after changes, are a loop.
Plain reruns with nothing changed in between are `cycle`'s business and neither count nor
reset; a different outcome resets the check's count (the edits did something).

A check that prints nothing and succeeds is never counted: silence says nothing about
whether an edit mattered (`sed -i` and `grep -q` in turn are normal), and runs of silent
successes are legitimate work (the corpus's `silent_success` set).

Inputs, per finished call in order: `CallFacts` (monitor/core/rules/facts.py). Progress
signals: a `file.edited` or `session.diff` between two calls means a change; the adapter
passes it by `changed()`. `todo.updated` is not progress (bookkeeping). Memory: at most
`max_checks` checks per session (the oldest forgotten first), 3 small ints each; cost per
call: one dict lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor.core.rules.facts import CallFacts
from monitor.core.signature import signature_digest

SILENT_SUCCESS = signature_digest("completed\x000\x00")
SILENT_SUCCESS_NO_EXIT = signature_digest("completed\x00None\x00")


@dataclass(frozen=True, slots=True)
class NoProgressFinding:
    """The check `digest` (of `tool`) reported the same outcome `runs` times, with changes
    before each rerun: `changes` changing calls in all."""

    tool: str
    digest: int
    runs: int
    changes: int


class NoProgress:
    """One session's run; `see` each finished call."""

    __slots__ = ("repeats", "max_checks", "_changes", "_checks")

    def __init__(self, repeats: int = 5, max_checks: int = 32) -> None:
        self.repeats = repeats
        self.max_checks = max_checks
        self._changes = 0  # changing calls (or server change signals) seen so far
        # check digest -> [outcome, changes seen at its last run, runs, changes at first run]
        self._checks: dict[int, list[int]] = {}

    def changed(self) -> None:
        """The server said files changed (`file.edited`, `session.diff`) outside a call."""
        self._changes += 1

    def see(self, call: CallFacts) -> NoProgressFinding | None:
        if call.changes:
            self._changes += 1
            return None
        if call.outcome in (SILENT_SUCCESS, SILENT_SUCCESS_NO_EXIT):
            return None
        checks = self._checks
        entry = checks.get(call.digest)
        if entry is None or entry[0] != call.outcome:
            if entry is None and len(checks) >= self.max_checks:
                del checks[next(iter(checks))]
            checks[call.digest] = [call.outcome, self._changes, 1, self._changes]
            return None
        if entry[1] == self._changes:
            return None  # nothing changed since: a plain rerun, cycle's business
        entry[1] = self._changes
        entry[2] += 1
        if entry[2] < self.repeats:
            return None
        del checks[call.digest]  # found once; the tracker starts the run's rules over anyway
        return NoProgressFinding(call.tool, call.digest, entry[2], self._changes - entry[3])
