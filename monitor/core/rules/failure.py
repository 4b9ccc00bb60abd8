"""The same failure again and again: a loop whatever the arguments.

A model that rewrites a failing command each time (adds `-q`, prefixes `cd X &&`, sends prose
as the command) makes a new call every time, so no cycle forms, while the tool keeps
answering with the same error. A call fails when its state is `error`, or when it is `bash`
with a non-zero `metadata.exit` (bash ends `completed` also when the command fails). Two
failures are the same when the tool, the exit status and the error text agree once volatile
bits are normalized: numbers (line numbers, counters, timestamps, pids), long hex ids and
temporary paths; other paths and file names are kept, as they say what failed.

Rule `failure` (`FailureRule`). Successful calls never feed this rule, they end the run:
output equality is not a sign of a loop (silence, exit 0 with empty output, repeats in long
runs of strong models all the time).
"""

from __future__ import annotations

import re
from typing import Any

from monitor.core import findings
from monitor.core.patterns import TextPattern
from monitor.core.rules.facts import run_state
from monitor.core.session import Call, SessionRecord
from monitor.core.signature import signature_digest

__all__ = ["FailureRule", "FailureRun", "failed", "failed_as", "failure_digest", "normalize"]

# Only the head and tail of a long output are compared: errors sit at either end, and the
# cost per call must not grow with the output.
_EDGE = 2048
_VOLATILE = TextPattern(
    # The random folder of a temporary path (the rest of the path still says what failed).
    r"(?P<temp>(?:/tmp|/var/tmp|(?:/private)?/var/folders/[^/\s]+/[^/\s]+/T)/[^/\s]*)"
    # Other paths and file names are what failed: `file-3.md` and `file-4.md` are two
    # different misses, not one repeated.
    r"|(?P<path>[\w.~-]*/[\w./~-]*|\b[\w-]+\.[A-Za-z]\w*\b)"
    r"|\b[0-9a-f]{8,}\b"  # hashes, ids
    r"|\d+",  # line numbers, counters, timestamps, durations
    re.IGNORECASE,
)
_SPACE = TextPattern(r"\s+")


def _mask(match: re.Match[str]) -> str:
    if match.group("temp") is not None:
        return match.group("temp").rsplit("/", 1)[0] + "/#"
    path = match.group("path")
    return "#" if path is None else path


def normalize(text: str) -> str:
    """The error text with its volatile bits replaced, whitespace collapsed."""
    if len(text) > 2 * _EDGE:
        text = text[:_EDGE] + "\n...\n" + text[-_EDGE:]
    text = _VOLATILE.of(text).sub(_mask, text)
    return _SPACE.of(text).sub(" ", text).strip()


def exit_status(tool: str, status: str, metadata: Any) -> int | None:
    """The non-zero exit status of a bash call that ended `completed` but failed, else None."""
    if tool != "bash" or status != "completed" or not isinstance(metadata, dict):
        return None
    code = metadata.get("exit")
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return None
    return code


def failed(call: Call) -> bool:
    """The finished call failed: state `error`, or bash with a non-zero exit."""
    return call.status == "error" or exit_status(call.tool, call.status, call.metadata) is not None


def failure_digest(tool: str, status: str, output: Any, error: Any, metadata: Any) -> int | None:
    """A digest of how a finished call failed, or None when it did not fail."""
    if status == "error":
        text = error if isinstance(error, str) else repr(error)
        return signature_digest(f"{tool}\x00error\x00{normalize(text)}")
    code = exit_status(tool, status, metadata)
    if code is None:
        return None
    text = output if isinstance(output, str) else ""
    return signature_digest(f"{tool}\x00{code}\x00{normalize(text)}")


def failed_as(call: Call) -> int | None:
    """How a finished call failed (`failure_digest`), None if it did not: found once per
    call, which the rule, the armed loop's check and the plan each ask."""
    failure = call.failure
    if failure is ...:
        failure = failure_digest(call.tool, call.status, call.output, call.error, call.metadata)
        if call.status != "running":  # its end is what the digest reads
            call.failure = failure
    return failure


class FailureRun:
    """The session's current run of identical failures: its digest and length."""

    __slots__ = ("digest", "count")

    def __init__(self) -> None:
        self.digest: int | None = None
        self.count = 0

    def feed(self, digest: int | None) -> int:
        """Take the outcome of the next finished call; return the length of the run."""
        if digest is None:
            self.digest, self.count = None, 0
        elif digest == self.digest:
            self.count += 1
        else:
            self.digest, self.count = digest, 1
        return self.count


class FailureRule:
    """Rule `failure`: the same failure `repeats` times in a row. Its state is the run of
    failures, made at the first failure (successes cost nothing until then)."""

    reads_recorded = False
    reads_finished = True  # outcomes only
    reads_running = False

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> findings.Finding | None:
        if not finished:
            return None
        digest = failed_as(call)
        run = run_state(session, "failure", FailureRun, needed=digest is not None)
        if run is None:
            return None
        count = run.feed(digest)
        return None if count < self.repeats else findings.FailureRun(call.tool, count)
