"""Per-call facts the progress rules read: what was called, what came back, what it changed.

The rules `no_progress`, `revisit` and the narration-aware `text_steps` never see a frame; the
tracker (or `evaluate`) hands them one `CallFacts` per finished call, built here from what a
tool part's final update carries:

- `digest`: the call after the profile (`signature_digest(canonical_signature(tool, args))`
  with the profile's label and volatile arguments dropped), the same digest `cycle` records;
- `outcome`: a digest of what came back (`outcome_digest`): status, exit status and output or
  error, with only what differs between two runs of an unchanged thing masked (durations,
  addresses, long hex ids, temporary folders, the line counter of a long-lived bash); line
  numbers and counts are kept, as a test run whose counts change did change;
- `changes`: whether the call changes files (`changes_files`): the edit tools, and bash
  commands that write (redirections into files, `sed -i`, `tee`, `patch`, `git apply`, ...).
  Deliberately broad: a change wrongly assumed makes `no_progress` see edits where there were
  none (it then needs a real repeat anyway), a change missed makes `revisit` take a re-read
  after an edit for a loop.

The server's own progress signals (`file.edited`, `session.diff`) say the same as `changes`
for tools it knows; a tracker that follows them passes `changes=True` for the call they
follow (see each rule's docstring).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from monitor.core.signature import signature_digest

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
# Only the ends of a long output are hashed: its cost per call must not grow with the output,
# and what a check reports (a summary, an error) sits at either end.
_EDGE = 4096
_VOLATILE = re.compile(
    r"\b\d+(?:\.\d+)?\s*(?:ms|s|sec|secs|seconds|minutes)\b"  # durations
    r"|\b0x[0-9a-f]+\b"  # addresses
    r"|\b[0-9a-f]{12,}\b"  # hashes, ids
    r"|(?:/tmp|/var/tmp)/[^/\s]+"  # temporary folders
    # bash's own counter of lines read by a long-lived shell (SWE-agent's): `/bin/bash: line
    # 212: javac: command not found` grows by one each run of the same failing command
    r"|(?<=bash: line )\d+",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class CallFacts:
    """One finished call as the progress rules see it."""

    tool: str
    digest: int
    outcome: int
    changes: bool


def changes_files(tool: str, args: Any) -> bool:
    """Whether the call changes files: an edit tool, or a bash command that writes."""
    if tool in EDIT_TOOLS:
        return True
    if tool != "bash" or not isinstance(args, dict):
        return False
    command = args.get("command")
    return isinstance(command, str) and _WRITES.search(command) is not None


def outcome_digest(status: str, output: Any, error: Any, metadata: Any) -> int:
    """What a finished call got back, as a digest; equal for two runs that reported the same."""
    text = error if status == "error" else output
    if not isinstance(text, str):
        text = "" if text is None else repr(text)
    if len(text) > 2 * _EDGE:
        text = text[:_EDGE] + "\n...\n" + text[-_EDGE:]
    code = metadata.get("exit") if isinstance(metadata, dict) else None
    return signature_digest(f"{status}\x00{code}\x00{_VOLATILE.sub('#', text)}")
