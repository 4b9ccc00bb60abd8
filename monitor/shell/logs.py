"""Structured logs: one JSON object per line on stdout, or a console rendering on a terminal.

Every event the monitor logs is listed in docs/logs.md. Nothing here ever receives a tool
argument, a tool output, a prompt or a password: callers log ids, names and counts only.

Names come from the stream and can be anything, so every line is bounded here, whatever the
caller passed: each string is cleaned as the feedback cleans tool names and cut to
`STRING_MAX` characters, each list to `LIST_MAX` items, and a line still longer than
`LINE_MAX` (journald splits lines at 48 KiB, which breaks the JSON) is replaced by its event,
level and time with `truncated_chars`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

from monitor.core.feedback import clean_tool_name

__all__ = ["LoopErrors", "Throttle", "configure_logging"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


# syslog priorities, which journald reads from a `<N>` prefix on each line (sd-daemon(3)).
JOURNAL_PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def writes_to_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether `stream` is the journal stream systemd names in JOURNAL_STREAM ("dev:inode").

    Compared with the stream itself, as systemd.exec(5) advises: a child whose stdout was
    redirected elsewhere inherits the variable but not the journal.
    """
    expected = environ.get("JOURNAL_STREAM")
    if not expected:
        return False
    try:
        status = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (e.g. StringIO)
        return False
    return expected == f"{status.st_dev}:{status.st_ino}"


log = structlog.get_logger("monitor.shell.logs")

STRING_MAX = 512
LIST_MAX = 32
# A traceback keeps its lines (JSON escapes them) but not its whole length.
EXCEPTION_MAX = 8192
LINE_MAX = 16384
# Errors the event loop reports itself (a failed accept when descriptors run out comes back
# every time the listener is readable): one line per kind per interval, with the count.
LOOP_ERROR_EVERY_S = 10.0


def _bounded(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return clean_tool_name(value, STRING_MAX)
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        kept = [_bounded(item, depth + 1) for item in items[:LIST_MAX]]
        if len(items) > LIST_MAX:
            kept.append(f"… {len(items) - LIST_MAX} more")
        return kept
    if depth < 3 and isinstance(value, dict):
        pairs = list(value.items())
        bounded = {
            clean_tool_name(str(key), STRING_MAX): _bounded(item, depth + 1)
            for key, item in pairs[:LIST_MAX]
        }
        if len(pairs) > LIST_MAX:
            bounded["…"] = f"{len(pairs) - LIST_MAX} more"
        return bounded
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return clean_tool_name(repr(value), STRING_MAX)


def bound_fields(_: Any, __: str, record: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Clean and cut every field (see the module's docstring)."""
    for key, value in record.items():
        if key == "exception" and isinstance(value, str):
            record[key] = value[:EXCEPTION_MAX]
        else:
            record[key] = _bounded(value)
    return record


def bound_line(render: structlog.typing.Processor) -> structlog.typing.Processor:
    """`render`, with a line longer than `LINE_MAX` replaced by a short one that says so."""

    def bounded(logger: Any, method: str, record: MutableMapping[str, Any]) -> Any:
        short = {key: record[key] for key in ("event", "level", "timestamp") if key in record}
        line = render(logger, method, record)
        if isinstance(line, str) and len(line) > LINE_MAX:
            return render(logger, method, {**short, "truncated_chars": len(line)})
        return line

    return bounded


class Throttle:
    """One log line per kind per interval, for events a client or a fault can repeat at will:
    `due` counts one and, when a line is due, says how many came since the last line (this
    one included); None while the interval runs. Kinds must come from a bounded set."""

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        # Per kind: when it was last logged, and how many came since.
        self._seen: dict[str, tuple[float, int]] = {}

    def due(self, kind: str) -> int | None:
        now = self._clock()
        logged_at, count = self._seen.get(kind, (float("-inf"), 0))
        count += 1
        if now - logged_at < self._every:
            self._seen[kind] = (logged_at, count)
            return None
        self._seen[kind] = (now, 0)
        return count


class LoopErrors:
    """An event loop exception handler that logs each kind of error once per interval."""

    def __init__(
        self, every: float = LOOP_ERROR_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._throttle = Throttle(every, clock)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        error = type(exc).__name__ if exc is not None else ""
        if isinstance(exc, OSError) and exc.strerror:
            error = exc.strerror
        count = self._throttle.due(f"{context.get('message', '')}: {error}")
        if count is not None:
            log.error("loop.error", message=context.get("message"), error=error, count=count)


def journal_line(render: structlog.typing.Processor) -> structlog.typing.Processor:
    """`render`, with each line starting with its syslog priority (`<4>` for a warning).

    Without it journald stores every line at info: `journalctl -p warning` would show none.
    A wrapper around the renderer rather than a processor after it, because structlog's
    processors take a record, not the line a renderer returns.
    """

    def prefixed(logger: Any, method: str, record: MutableMapping[str, Any]) -> str:
        return f"<{JOURNAL_PRIORITIES.get(method, 6)}>{render(logger, method, record)!s}"

    return prefixed


def configure_logging(
    log_format: str,
    level: str,
    stream: TextIO | None = None,
    observe: Callable[[Mapping[str, Any]], None] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Log at `level` and above to `stream` (stdout by default).

    `observe`, if given, sees every record from info up, whatever `level` says: the demo
    tells its story from them while the file keeps only what was asked for. When `stream`
    is the journal (`environ` JOURNAL_STREAM), each line starts with its syslog priority.
    """
    stream = stream or sys.stdout
    threshold = LEVELS[level]
    processors: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    if observe is not None:

        def forward(_: Any, method: str, record: MutableMapping[str, Any]) -> Any:
            observe(record)
            if LEVELS.get(method, logging.INFO) < threshold:
                raise structlog.DropEvent
            return record

        processors.append(forward)
        threshold = min(threshold, logging.INFO)
    processors += [structlog.processors.format_exc_info, bound_fields]
    render: structlog.typing.Processor
    if log_format == "json":
        render = structlog.processors.JSONRenderer()
    else:
        render = structlog.dev.ConsoleRenderer(colors=False)
    render = bound_line(render)
    if writes_to_journal(stream, environ):
        render = journal_line(render)
    processors.append(render)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(stream),
        # Not cached: tests swap the configuration (structlog.testing.capture_logs), and the
        # monitor logs rarely enough that the lookup costs nothing.
        cache_logger_on_first_use=False,
    )
