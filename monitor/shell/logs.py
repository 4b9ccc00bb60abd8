"""Structured logs: one JSON object per line on stdout, or a console rendering on a terminal.

Every event the monitor logs is listed in docs/logs.md. Nothing here ever receives a tool
argument, a tool output, a prompt or a password: callers log ids, names and counts only.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

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


def _journal_priority(_: Any, method: str, line: str) -> str:
    # Without it journald stores every line at info: `journalctl -p warning` would show none.
    return f"<{JOURNAL_PRIORITIES.get(method, 6)}>{line}"


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
    processors.append(structlog.processors.format_exc_info)
    if log_format == "json":
        processors.append(structlog.processors.JSONRenderer())
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    if writes_to_journal(stream, environ):
        processors.append(_journal_priority)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(stream),
        # Not cached: tests swap the configuration (structlog.testing.capture_logs), and the
        # monitor logs rarely enough that the lookup costs nothing.
        cache_logger_on_first_use=False,
    )
