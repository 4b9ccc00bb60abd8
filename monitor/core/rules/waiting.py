"""Waiting: calls that wait for something else get a larger budget before they count as a loop.

`sleep 30 && gh run view N` answered "in_progress" four times is a model waiting for CI, not a
loop; so is checking a health URL and a log tail in turn. A call waits when its command says so
(it sleeps, watches, waits, polls a health endpoint, follows a log) or when its answer says
the thing is still under way ("in progress", "queued", "still running", "not ready"). A cycle
that holds such a call is a loop only once it has run for `wait_calls` calls (rule `wait`).
A wait that keeps returning the same failure is still caught by the failure rule.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from monitor.core.patterns import TextPattern

__all__ = ["answers_in_progress", "waits_by_command"]

_WAITING_COMMAND = re.compile(
    r"\bsleep\s+\d|\bwatch\b|--watch\b|\bwait\b|\buntil\b|\bhealth|\bpoll|\btail\s+-[a-zA-Z]*f",
    re.IGNORECASE,
)
_IN_PROGRESS = TextPattern(
    r"\bin[ _-]?progress\b|\bqueued\b|\bstill running\b|\bnot (?:yet )?ready\b|\bwaiting for\b",
    re.IGNORECASE,
)
# An answer's status line sits near its start or its end.
_EDGE = 2048


def waits_by_command(tool: str, args: Any) -> bool:
    """The call itself says it waits (a bash command that sleeps, watches, polls, ...)."""
    if tool != "bash" or not isinstance(args, dict):
        return False
    command = args.get("command")
    return isinstance(command, str) and _WAITING_COMMAND.search(command) is not None


def answers_in_progress(output: Any) -> bool:
    """The call's answer says the thing it asked about is still under way."""
    if not isinstance(output, str):
        return False
    if len(output) > 2 * _EDGE:
        output = output[:_EDGE] + "\n" + output[-_EDGE:]
    return _says_in_progress(output)


# Remembered for the last few answers, by their text, as `session.outcome_digest` does: a
# loop's calls answer the same again and again (and `cycle` and `revisit` ask of one call).
@lru_cache(maxsize=64)
def _says_in_progress(text: str) -> bool:
    return _IN_PROGRESS.of(text).search(text) is not None
