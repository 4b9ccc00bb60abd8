"""Rule `no_progress`: the same check keeps reporting the same thing while the run changes things.

The agent edits, reruns its check, edits again, reruns: every edit differs, so no cycle forms,
and the check prints the same result each time (in real runs: a script that imported another
installed copy of the package, so no edit could ever matter). A *check* is a call that changes
nothing (`changes_files` false, monitor/core/rules/facts.py); it *stalls* when it runs again,
with the same `Call.digest`, after at least one change since its previous run, and reports
the same `Call.outcome` as then. `repeats` runs of one check with the same outcome, each after
changes, are a loop. Plain reruns with nothing changed in between are `cycle`'s business and
neither count nor reset; a different outcome resets the check's count (the edits did
something). A check stalls only while the work does: when another check run again moves
(from failing to passing, or back: the tests between the runs of a debugging script that
can never print anything else), every check's count starts over (issue 44). Another answer
that fails or passes as before (a file shown again after an edit, 3 failures where there
were 4) does not move the work: on the real runs, counting it would have delayed two true
loops by 2 and 3 calls and silenced none.

An edit or write that failed (state `error`: a write refused with "File already exists",
an edit whose old text was not found) changed nothing and checked nothing: neither a change
nor a check (`failed_change`, issue 44).

A check that prints nothing and succeeds is never counted: silence says nothing about
whether an edit mattered (`sed -i` and `grep -q` in turn are normal), and runs of silent
successes are legitimate work (the real corpus's `silent_success` set). Nor is a keystroke
sent to a running program (`C-c`, answered `^C`) or an empty command: it checks nothing.

Which changes count: in the real loops the agent comes back to text its own edits touched:
it rewrites its earlier, unverified change (an edit whose `oldString` holds lines an earlier
edit of the same file added, or a file it wrote written again), flips between two versions
(the flip's old text is what the previous edit added), or edits again a line an earlier
edit replaced and something put back (edit, `git checkout`, edit). So an edit of known place
counts when its old text holds a line an earlier edit of the run added or replaced (context
lines, in both its old and new text, are neither). An edit of known place that does not is
a step somewhere new: progress, so every check's count starts over (one TODO after another
in one file or three while an unrelated check keeps printing the same; issue 44: counting
every edit of a file edited before took working through a list in one file for a loop). A
change whose place is unknown (a bash command that writes, SWE-agent's line-range `edit`,
a patch, the server's signals) counts as before.

Issue 55: on real runs that edit with OpenCode's `edit` (../shared/realtraj-edits), the loops
land somewhere new nearly every time (another spot of the same function each try) while the
same failing check answers the same, and the step somewhere new let them go or caught them
up to 13 calls late. So a check also keeps its streak: its runs with the same outcome, each
after any change, a step somewhere new included. The streak is a loop at `repeats` when the
answer is a failure (`says_failed`: state `error`, a non-zero exit, or an output with a
traceback, an error line, a test's failure or a `: False` verdict) and the run has come back
to its own text (an edit that `counts`) since the answer began. A clean answer (a build that
succeeds the same, a lint with the same two warnings) and a run that never comes back (a list
worked through, under an unrelated failure) keep the count that a step somewhere new starts
over. Measured on realtraj-edits, realtraj and tests/corpus together (docs/detection.md): the
failure alone fired on the written list in one file; the coming back alone on three resolved
runs (clean answers).

Where the server measured the workspace (each step's snapshot, `workspace` in facts.py) since
the run's last changing call, the measure decides instead (`Measured`): a check answering the
same in a state it already answered in (edit, revert, edit) stalls whatever the edit's place;
a state as at its last run is no change, whatever the calls looked like; a new state counts
unless the arguments called its edit a step somewhere new (docs/detection.md, "The workspace
signal").

Signals read: each finished call's `digest`, `outcome`, tool and arguments (for
`changes_files`; an edit's `filePath`, `oldString`, `newString`, a write's `content`), and
the server's change signals (`session.diff` with new files, a `file.edited` in the session's
directory: `server_changes`), each counted as a change.
`todo.updated` is not progress; and the server's last workspace state with the number of
measures in the run. Memory: at most `MAX_CHECKS` checks per run, the least recently run
forgotten first, packed in one array (32 bytes a check, 384 bytes when full; a bit of its
counters says whether its last run failed; the fourth word its streak, the run's rewrites when
the answer began and its steps somewhere new at its last run), made at the first check or
change of the run;
the lines the run's edits added or replaced, and the files they edited, as 32-bit digests of
(file, line) and (file), at most `MAX_ADDED` in a ring (256 bytes full); on a measured
workspace, its checks again (288 bytes full) and `MAX_VISITS` 32-bit digests of (check,
outcome, state) in a ring (256 bytes full). Cost per finished call: a search of at most 36
machine words (in C), and for an edit one digest per line of its old and new text (at most
`MAX_EDIT_LINES` each).
"""

from __future__ import annotations

import re
from array import array
from typing import Any

from monitor.core.findings import Finding, NoProgress
from monitor.core.rules.facts import (
    OutcomeRule,
    failed_change,
    remember,
    run_state,
    server_changed,
    workspace,
)
from monitor.core.session import Call, SessionRecord, outcome_digest
from monitor.core.signature import int_digest, text_crc

__all__ = ["NoProgressRule", "is_keystroke"]

NAME = "no_progress"
MAX_CHECKS = 12
MAX_ADDED = 64
MAX_EDIT_LINES = 512
MAX_VISITS = 64
_EDGE = 2048
# A keystroke sent to a running program (tmux's names: `C-c`, `M-x`, `Enter`; or `^C`).
_KEYSTROKE = re.compile(r"(?:(?:[CM]-\S|\^[A-Z@\\\]^_]|Enter|Escape|Tab)\s*)+")
# Silent successes, with and without an exit status (bash has one, read does not).
SILENT = frozenset(
    {
        outcome_digest("completed", "", None, {"exit": 0}),
        outcome_digest("completed", "", None, None),
    }
)
# A check's counters, packed in one 64-bit word: the changes seen at its last run and at its
# first (24 bits each, compared modulo 2**24), its runs (14 bits) and whether it failed then.
_BITS = 24
_MASK = (1 << _BITS) - 1
_RUNS = (1 << 14) - 1
_FAILED = 1 << 62


class Checks:
    """One run's checks, packed in one array, three words a check: its digest, its outcome
    and its counters."""

    __slots__ = (
        "changes",
        "fresh",
        "rewrites",
        "signals",
        "edited",
        "checks",
        "added",
        "oldest",
        "measured",
    )

    def __init__(self) -> None:
        self.changes = 0  # changing calls and server change signals seen so far
        self.fresh = 0  # edits somewhere new so far (a step of known place onto new text)
        self.rewrites = 0  # changes that went on with the same work (`counts`) so far
        self.signals = 0  # `server_changes` at the previous call
        # A changing call came since the last check: the server's signals of the same edit
        # (its `file.edited`, the step's `session.diff`) are that change, not more of them.
        self.edited = False
        self.checks = array("q")
        # What the run's edits of known place added or replaced: a ring of 32-bit digests of
        # (file, line), and of (file, None) for each file edited (made at the first such edit).
        self.added: array[int] | None = None
        self.oldest = 0
        # The checks as the server's workspace measures count them: made at the run's first
        # check or change on a measured workspace, so a run with no snapshots pays one word.
        self.measured: Measured | None = None

    def moved(self) -> None:
        """A check's result moved: every check's count starts over."""
        del self.checks[:]
        if self.measured is not None:
            del self.measured.checks[:]

    def counts(self, tool: str, args: Any) -> bool:
        """Whether a change goes on with the same work (it comes back to text the run's own
        edits wrote, or its place is unknown) rather than stepping somewhere new; notes what
        it adds."""
        pieces = _pieces(tool, args)
        if pieces is None:
            return True
        added = self.added
        if added is None:
            added = self.added = array("I")
        same = False
        for path, old, new in pieces:
            edited = _digest(path, None)
            old_lines = _lines(path, old)
            if old is None:  # a whole file written again rewrites what the run did there
                same |= edited in added
            else:
                same |= any(line in added for line in old_lines)
            # What it changed, both ways: the lines it added and the lines it replaced.
            for digest in (_lines(path, new) ^ old_lines) | {edited}:
                if digest not in added:
                    self.oldest = remember(added, self.oldest, digest, MAX_ADDED)
        return same


class Measured:
    """The checks of a run counted by what the server measured of the workspace (its step
    snapshots), not by what the calls' arguments suggest: three words a check, as in `Checks`
    (its digest, its outcome, and its runs beside the workspace state at its last run), and a
    ring of 32-bit digests of (check, outcome, workspace state) for every check run, the
    states each check was seen in."""

    __slots__ = ("checks", "visits", "oldest", "changed_at")

    def __init__(self) -> None:
        self.checks = array("q")
        self.visits = array("I")
        self.oldest = 0
        self.changed_at = -1  # the number of measures at the run's last changing call

    def runs(self, digest: int, outcome: int, state: int, fresh: bool, max_checks: int) -> int:
        """The runs of check `digest` with `outcome` so far, this one (in workspace `state`)
        counted; `fresh`: the arguments' count of it started over (a step somewhere new)."""
        visit = int_digest(digest, outcome, state) & 0xFFFFFFFF
        came_back = visit in self.visits
        if not came_back:
            self.oldest = remember(self.visits, self.oldest, visit, MAX_VISITS)
        checks = self.checks
        index = _find(checks, digest, 3)
        if index < 0 or checks[index + 1] != outcome:
            runs = 1
        else:
            packed = checks[index + 2]
            runs = packed >> 32
            if state == packed & 0xFFFFFFFF:
                pass  # the same files as at its last run: a plain rerun, neither counted nor reset
            elif came_back or not fresh:
                # Back in a state this check already answered the same in (edit, revert, edit):
                # a stall, however new the edit's place looked.
                runs += 1
            else:
                runs = 1  # a state never seen, reached by a step somewhere new
        if index >= 0:
            del checks[index : index + 3]
        elif len(checks) >= 3 * max_checks:
            del checks[0:3]
        checks.extend((digest, outcome, (min(runs, _MASK) << 32) | state))
        return runs


def _measured(state: Checks) -> Measured:
    if state.measured is None:
        state.measured = Measured()
    return state.measured


def _digest(path: str, line: str | None) -> int:
    return text_crc("\1" if line is None else f"\0{line}", text_crc(path))


def _lines(path: str, text: str | None) -> set[int]:
    """The digests of a text's lines in file `path` that say something (a letter or digit),
    spaces aside."""
    if not text:
        return set()
    lines = text.splitlines()[:MAX_EDIT_LINES]
    return {_digest(path, line.strip()) for line in lines if any(c.isalnum() for c in line)}


def _pieces(tool: str, args: Any) -> list[tuple[str, str | None, str]] | None:
    """What an edit of known place does, as (file, old text or None for a whole file, new
    text); None when its place is not known."""
    if not isinstance(args, dict) or not isinstance(args.get("filePath"), str):
        return None
    path = args["filePath"]
    if tool == "write" and isinstance(args.get("content"), str):
        return [(path, None, args["content"])]
    edits = args.get("edits") if tool == "multiedit" else [args] if tool == "edit" else None
    if not isinstance(edits, list):
        return None
    pieces: list[tuple[str, str | None, str]] = []
    for edit in edits:
        if not isinstance(edit, dict):
            return None
        old, new = edit.get("oldString"), edit.get("newString")
        if not isinstance(old, str) or not isinstance(new, str):
            return None
        pieces.append((path, old, new))
    return pieces


def is_keystroke(call: Call) -> bool:
    """A keystroke sent to a running program, or an empty command: it checks nothing."""
    args = call.args
    if isinstance(args, dict):
        for key in ("command", "keystrokes", "keys"):
            text = args.get(key)
            if isinstance(text, str):
                return not text.strip() or _KEYSTROKE.fullmatch(text.strip()) is not None
    output = call.output
    return isinstance(output, str) and output.strip() == "^C"


def _failed(call: Call) -> bool:
    """Whether a check failed: state `error`, or a non-zero exit status."""
    metadata = call.metadata
    code = metadata.get("exit") if isinstance(metadata, dict) else None
    return call.status == "error" or (type(code) is int and code != 0)


# A failing answer printed by a check that may still exit 0 (a script that catches its own
# exception, a test runner's summary, a reproduction script's own verdict).
_FAILURE = re.compile(
    r"Traceback \(most recent call last\)|^\s*(?:[\w.]*(?:Error|Exception)|FAIL(?:ED)?)\b"
    r"|\b(?:failed|FAILED|Failed)\b|: False\b|\bFalse$",
    re.MULTILINE,
)


def says_failed(call: Call) -> bool:
    """Whether a check's answer is a failure: state `error`, a non-zero exit status, or an
    output that shows one (a traceback, an error line, a test's failure)."""
    if _failed(call):
        return True
    output = call.output
    if not isinstance(output, str):
        return False
    if len(output) > 2 * _EDGE:
        output = output[:_EDGE] + "\n" + output[-_EDGE:]
    return _FAILURE.search(output) is not None


def _moved(last: int, packed: int, outcome: int, failed: bool) -> bool:
    """Whether a check's result moved since its last run (outcome `last`, counters
    `packed`) to this one (`outcome`, `failed`): from failing to passing or back. Another
    answer that fails or passes as before (a file shown again after an edit, 3 failures
    where there were 4) is not counted as the work moving."""
    return outcome != last and bool(packed & _FAILED) != failed


def _find(checks: array[int], digest: int, words: int) -> int:
    """Where the check `digest` starts in `checks` (`words` a check: 4 in `Checks`, 3 in
    `Measured`), or -1. Among the checks' first words only (an outcome or counters may equal
    the digest), without the `ValueError` that `index` raises for a check not run before:
    most are not."""
    digests = checks[::words]
    return words * digests.index(digest) if digest in digests else -1


class NoProgressRule(OutcomeRule):
    """Rule `no_progress`: one check's same outcome `repeats` times, changes before each."""

    def __init__(self, repeats: int, max_checks: int = MAX_CHECKS) -> None:
        self.repeats = repeats
        self.max_checks = max_checks

    def finished_call(
        self, session: SessionRecord, call: Call, outcome: int, changes: bool
    ) -> Finding | None:
        # A silent success, a keystroke: no check, and no change either; nor is a change that
        # failed (a write refused: issue 44), whose error says nothing of the work.
        checks_nothing = not changes and (
            outcome in SILENT or is_keystroke(call) or failed_change(call)
        )
        state = run_state(session, NAME, Checks, needed=not checks_nothing)
        if state is None:
            return None
        if server_changed(session, state) and not (changes or state.edited):
            state.changes += 1
        measured, measures = workspace(session)
        if changes:
            state.edited = True
            if measured:  # the last measure predates this change
                _measured(state).changed_at = measures
            state.changes += 1
            if state.counts(call.tool, call.args):
                state.rewrites += 1
            else:
                state.fresh += 1  # a step somewhere new: every check's count starts over
            return None
        if checks_nothing:
            return None
        state.edited = False
        return self._check(state, call, outcome, measured, measures)

    def _check(
        self, state: Checks, call: Call, outcome: int, measured: int, measures: int
    ) -> Finding | None:
        """A check ran: its count, and a finding when it stalled `repeats` times."""
        now, fresh_now, rewrites = state.changes & _MASK, state.fresh & _MASK, state.rewrites
        checks = state.checks
        index = _find(checks, call.digest, 4)
        failed = _failed(call)
        if index >= 0 and _moved(checks[index + 1], checks[index + 2], outcome, failed):
            # A check run again whose result moved (the tests went from failing to passing,
            # or back): the work is not stalled, whatever another check says; every check's
            # count starts over (issue 44).
            state.moved()
            index = -1
        if index < 0 or checks[index + 1] != outcome:
            runs = streak = 1
            first, since = now, rewrites & _MASK
            fresh = True
        else:
            packed, kept = checks[index + 2], checks[index + 3]
            last, first = packed & _MASK, (packed >> _BITS) & _MASK
            runs = (packed >> 2 * _BITS) & _RUNS
            streak, since = (kept >> 2 * _BITS) & _RUNS, (kept >> _BITS) & _MASK
            fresh = (kept & _MASK) != fresh_now  # a step somewhere new since its last run
            if last != now:
                streak += 1
                runs = 1 if fresh else runs + 1
        if index >= 0:  # taken out, to go back in last: the least recently run goes first
            del checks[index : index + 4]
        elif len(checks) >= 4 * self.max_checks:
            del checks[0:4]
        if measured and _measured(state).changed_at != measures:
            # The server measured the workspace since the last change: its measure decides.
            stalls = _measured(state).runs(call.digest, outcome, measured, fresh, self.max_checks)
            if stalls >= self.repeats:
                return NoProgress(call.tool, stalls, stalls - 1)
            runs = min(runs, self.repeats - 1)  # the arguments' count is not the measure
            streak = min(streak, self.repeats - 1)
        elif runs >= self.repeats:
            return NoProgress(call.tool, runs, (now - first) & _MASK)
        elif streak >= self.repeats and since != rewrites & _MASK and says_failed(call):
            # Edits somewhere new each time, while the same failing answer comes back and the
            # run has come back to its own text since the answer began (issue 55).
            return NoProgress(call.tool, streak, (now - first) & _MASK)
        packed = (runs << 2 * _BITS) | (first << _BITS) | now
        checks.extend(
            (
                call.digest,
                outcome,
                packed | _FAILED if failed else packed,
                (min(streak, _RUNS) << 2 * _BITS) | (since << _BITS) | fresh_now,
            )
        )
        return None
