"""Structured logs: one JSON object per line on stdout, or a console rendering on a terminal.

Every event the monitor logs is listed in docs/logs.md. Nothing here ever receives a tool
argument, a tool output, a prompt or a password: callers log ids, names and counts only.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(log_format: str, level: str, stream: TextIO | None = None) -> None:
    renderer: structlog.typing.Processor
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stdout),
        # Not cached: tests swap the configuration (structlog.testing.capture_logs), and the
        # monitor logs rarely enough that the lookup costs nothing.
        cache_logger_on_first_use=False,
    )
