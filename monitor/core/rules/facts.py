"""What the progress rules read beside a call's identity: whether it changed files, and
whether the server said files changed; and what they share in reading it.

`no_progress` and `revisit` (and `text_steps` for outcomes) take a call's `digest` and
`outcome` from the core (monitor/core/session.py `Call`: one identity, one masked outcome
digest for every rule). What they add is here:

- `changes_files(tool, args)`: whether the call changes files by what it is: the edit tools,
  and bash commands that write (redirections into files, `sed -i`, `tee`, `patch`,
  `git apply`, ...). Deliberately broad: a change wrongly assumed makes `no_progress` see
  edits where there were none (it then needs a real repeat anyway), a change missed makes
  `revisit` take a re-read after an edit for a loop. A call of that kind that failed (state
  `error`: a write refused, an edit whose old text was not found, `failed_change`) changed
  nothing;
- `Signals`: the server's own progress signals for the run, kept in the session's rule state
  under `SIGNALS` by the tracker: a `session.diff` whose files differ from the previous one,
  and a `file.edited` in the session's directory (that event names no session), each count
  one change. `server_changes(session)` is the count a rule compares with the one it saw at
  its previous call. `todo.updated` is bookkeeping, not progress, and is not read. The
  server's measure of the workspace itself (each step's snapshot, `WorkspaceState`) is kept
  there too, and read with `workspace(session)`: a fact where the rest are guesses;
- `OutcomeRule`: `no_progress`, `revisit` and `circles` read a call once its outcome came,
  and whether it changes files (`OutcomeRule.finished_call`); `run_state` makes a rule's state
  for the run only once the run gives it something to remember (`failure` too); `named` keeps
  the few tools a finding names.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from monitor.core.events import NO_DIFF
from monitor.core.findings import Finding
from monitor.core.session import Call, SessionRecord

__all__ = [
    "COMMAND_EDGE",
    "OutcomeRule",
    "SIGNALS",
    "Signals",
    "TEXT_EDGE",
    "changes_files",
    "failed_change",
    "named",
    "remember",
    "rule_args",
    "run_state",
    "server_changed",
    "tool_is",
    "workspace",
]

S = TypeVar("S")

SIGNALS = "signals"
# Tools named in a finding, at most: the feedback names them, it must stay short.
MAX_TOOLS = 4

# Tools that change files by what they are (OpenCode's, and SWE-agent's ACI `edit`/`create`).
EDIT_TOOLS = frozenset({"edit", "write", "multiedit", "apply_patch", "patch", "create"})

# A bash command writes when it redirects into a file (not /dev/null or a descriptor), edits
# in place or runs a tool whose job is to write.
_WRITES = re.compile(
    r"(?<![<>&0-9])>>?\s*(?!/dev/null\b|&|\s*\d)[\w./~\"'$-]"
    r"|\bsed\s+(?:-[a-zA-Z]*\s+)*-[a-zA-Z]*i"
    r"|\bperl\s+-[a-zA-Z]*i"
    r"|\btee\b|\bpatch\b|\bgit\s+(?:apply|checkout|restore|stash|reset|am|cherry-pick)\b"
    r"|\b(?:mv|cp|rm|mkdir|touch|truncate|ln|chmod)\s"
    r"|\bopen\([^)]*['\"][wa]\+?['\"]"  # python -c / heredoc scripts that write a file
    r"|\.write_text\(|\.write\(",
)


# A call keeps of its arguments only what a rule reads once its digest is made: a bash
# command (its first and last COMMAND_EDGE characters when it is longer), its timeout
# (`runaway`), the keys a keystroke is sent by (`no_progress`), and an edit's place and
# texts (`no_progress` tells a rewrite of the run's own change), each text cut to its first
# TEXT_EDGE characters. A `write` carries a whole file; kept whole, 3,000 calls the stream
# never finished held 940 MB (issue 25).
COMMAND_EDGE = 4096
TEXT_EDGE = 8192
_TEXTS = frozenset({"filePath", "oldString", "newString", "content", "keystrokes", "keys"})
_READ = _TEXTS | {"command", "timeout", "offset", "limit", "edits"}


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_EDGE else text[:TEXT_EDGE]


def rule_args(tool: str, args: Any) -> dict[str, Any] | None:
    """What the rules read of a call's arguments (`changes_files`, `waits_by_command`,
    `call_bound`, `is_keystroke`, no_progress's edits), bounded; None when nothing."""
    if not isinstance(args, dict):
        return None
    kept: dict[str, Any] = {}
    # Only the keys the call has: most have one or two of the dozen read here.
    for key in args.keys() & _READ:
        value = args[key]
        if key in _TEXTS:
            if isinstance(value, str):
                kept[key] = _cut(value)
        elif key == "command":
            if isinstance(value, str):
                if len(value) > 2 * COMMAND_EDGE:
                    value = value[:COMMAND_EDGE] + "\n" + value[-COMMAND_EDGE:]
                kept[key] = value
        elif key == "edits":
            if isinstance(value, list):
                kept[key] = [
                    {k: _cut(v) for k, v in edit.items() if k in _TEXTS and isinstance(v, str)}
                    if isinstance(edit, dict)
                    else None
                    for edit in value[:64]
                ]
        # `timeout`, and the window of a `read` (revisit's creeping reads)
        elif type(value) is int or (key == "timeout" and type(value) is float):
            kept[key] = value
    return kept or None


def tool_is(tool: str, args: Any, tools: frozenset[str], command: re.Pattern[str]) -> bool:
    """Whether a call is of a kind: one of `tools`, or a bash command that `command` finds."""
    if tool in tools:
        return True
    if tool != "bash" or not isinstance(args, dict):
        return False
    text = args.get("command")
    return isinstance(text, str) and command.search(text) is not None


def changes_files(tool: str, args: Any) -> bool:
    """Whether the call changes files: an edit tool, or a bash command that writes."""
    return tool_is(tool, args, EDIT_TOOLS, _WRITES)


def failed_change(call: Call) -> bool:
    """Whether a call that would change files failed (state `error`: a `write` refused with
    "File already exists", an `edit` whose old text was not found): it changed nothing
    (issue 44). A bash command's non-zero exit is not such a failure: it may have written
    before it failed."""
    return call.status == "error" and changes_files(call.tool, call.args)


class Signals:
    """The server's change signals in the current run: how many, the last diff seen, and the
    workspace state the server measured last (`workspace`, 0 while unknown) with how many such
    measures came (`measures`: which tells a rule whether one came since a call of its own)."""

    __slots__ = ("count", "diff", "workspace", "measures")

    def __init__(self) -> None:
        self.count = 0
        # A run starts with no file changed: a first diff that lists none (the real server
        # sends one at each step's end) is no change.
        self.diff = NO_DIFF
        self.workspace = 0
        self.measures = 0

    def measured(self, digest: int) -> None:
        """A step's snapshot (`WorkspaceState`): the workspace as it is now."""
        self.workspace = digest
        self.measures += 1

    def diffed(self, digest: int) -> None:
        """A `session.diff`: a change when its files differ from the previous diff's."""
        if digest != self.diff:
            self.diff = digest
            self.count += 1


def workspace(session: SessionRecord) -> tuple[int, int]:
    """The workspace state the server measured last in the session's current run (0 when it
    measured none) and how many measures came in the run."""
    signals: Signals | None = session.peek(SIGNALS)
    return (0, 0) if signals is None else (signals.workspace, signals.measures)


def server_changes(session: SessionRecord) -> int:
    """How many times the server said files changed in the session's current run."""
    signals: Signals | None = session.peek(SIGNALS)
    return 0 if signals is None else signals.count


class SeesSignals(Protocol):
    """A rule's state that remembers `server_changes` at its previous call."""

    signals: int


def server_changed(session: SessionRecord, state: SeesSignals) -> bool:
    """Whether the server said files changed since the rule's previous call (noted)."""
    signals = server_changes(session)
    if signals == state.signals:
        return False
    state.signals = signals
    return True


def remember(seen: array[int], oldest: int, digest: int, size: int) -> int:
    """Keep `digest` in the ring `seen` of at most `size` (32-bit digests: 4 bytes each),
    over its oldest (at `oldest`) once full; returns where the oldest is now."""
    if len(seen) < size:
        seen.append(digest)
        return oldest
    seen[oldest] = digest
    return (oldest + 1) % size


class OutcomeRule:
    """A call rule that reads each call once, when its outcome comes, with whether the call
    changes files (`changes_files`): the prologue of `no_progress`, `revisit` and `circles`,
    whose `finished_call` is the rule."""

    reads_recorded = False
    reads_finished = True  # outcomes only
    reads_running = False

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> Finding | None:
        outcome = call.outcome if finished else None  # digested only once the call finished
        if outcome is None:
            return None
        changes = call.changes
        if changes is None:  # asked by each of these rules: found once
            # A call that failed changed nothing (`failed_change`).
            changes = call.changes = call.status != "error" and changes_files(call.tool, call.args)
        return self.finished_call(session, call, outcome, changes)

    def finished_call(
        self, session: SessionRecord, call: Call, outcome: int, changes: bool
    ) -> Finding | None:
        """What this finished `call` (`outcome`: its `Call.outcome`; `changes`: it changes
        files) completes, if anything."""
        raise NotImplementedError


def run_state(session: SessionRecord, rule: str, make: Callable[[], S], needed: bool) -> S | None:
    """The running state of `rule` in this run; made with `make()` only when `needed` (the
    call gives it something to remember), so a run that never does costs nothing: None until
    then."""
    state: S | None = session.peek(rule)
    if state is None and needed:
        state = session.state(rule, make)
    return state


def named(tools: list[str] | None, tool: str) -> list[str]:
    """The tools a finding names (made at the first), `tool` added while fewer than
    `MAX_TOOLS`."""
    if tools is None:
        tools = []
    if tool not in tools and len(tools) < MAX_TOOLS:
        tools.append(tool)
    return tools
