"""Structured logs: one JSON object per line on stdout, or a console rendering on a terminal.

Every event the monitor logs is listed in docs/logs.md. Nothing here ever receives a tool
argument, a tool output, a prompt or a password: callers log ids, names and counts only.
"""

from __future__ import annotations

import logging
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


def configure_logging(
    log_format: str,
    level: str,
    stream: TextIO | None = None,
    observe: Callable[[Mapping[str, Any]], None] | None = None,
) -> None:
    """Log at `level` and above to `stream` (stdout by default).

    `observe`, if given, sees every record from info up, whatever `level` says: the demo
    tells its story from them while the file keeps only what was asked for.
    """
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
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stdout),
        # Not cached: tests swap the configuration (structlog.testing.capture_logs), and the
        # monitor logs rarely enough that the lookup costs nothing.
        cache_logger_on_first_use=False,
    )
