"""Structured logs: one JSON object per line on stdout, or a console rendering on a terminal.

Every event the monitor logs is listed in docs/logs.md. Nothing here ever receives a tool
argument, a tool output, a prompt or a password: callers log ids, names and counts only.

Names come from the stream and can be anything, so every line is bounded here, whatever the
caller passed: each string is cleaned as the feedback cleans tool names and cut to
`STRING_MAX` characters, each list to `LIST_MAX` items, and a line still longer than
`LINE_MAX` (journald splits lines at 48 KiB, which breaks the JSON) is replaced by its event,
level and time with `truncated_chars`.

The guard never waits for its log: `watch` and `attach` hand each rendered line to a
`LogWriter`, a thread of its own behind a bounded queue. When whoever reads stdout stalls (a
`| less` left open, a log shipper that hangs), lines beyond the queue are dropped and counted
(`lines_dropped`, the metric `log_lines_dropped_total`), and one `log.dropped` line says how
many once the writer can write again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

from monitor.core.feedback import clean_tool_name
from monitor.core.throttle import Throttle

__all__ = [
    "LogWriter",
    "LoopErrors",
    "configure_logging",
    "lines_dropped",
    "logging_off_the_loop",
]

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


class LoopErrors:
    """An event loop exception handler that logs each kind of error once per interval."""

    def __init__(
        self, every: float = LOOP_ERROR_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._throttle = Throttle(every)
        self._clock = clock

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        error = type(exc).__name__ if exc is not None else ""
        if isinstance(exc, OSError) and exc.strerror:
            error = exc.strerror
        count = self._throttle.due(f"{context.get('message', '')}: {error}", self._clock())
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


# Lines waiting for the writer: about 2 MB at the usual few hundred bytes a line, minutes of
# what a busy monitor logs. Beyond, a line is dropped and counted, never waited for.
QUEUE_LINES = 4096
# At exit, how long the lines still queued get to be written (`monitor.stopped` is among
# them): within the 5 s a SIGTERM may take (monitor.shell.timing.DRAIN_S).
FLUSH_S = 0.5
# How long the writer waits at a time for a non-blocking descriptor to take more.
WRITABLE_WAIT_S = 1.0
_STOP = object()


class LogWriter:
    """Writes log lines to a stream on a thread of its own, behind a bounded queue.

    A small writer thread with a `queue.Queue`, rather than the standard library's
    `QueueHandler`/`QueueListener`: structlog renders each line itself and writes it to a
    file, with no `logging.Logger` in between, so going through the standard library would
    add a `LogRecord` and the handlers' locks to every line on the event loop; and a full
    `QueueHandler` queue reports an error (a traceback on stderr) per line where this counts
    it and moves on. `put` never blocks: a line the queue has no room for is dropped and
    counted, and the next time the queue is empty the writer logs `log.dropped` with how
    many went since the last such line.

    Lines go to the stream's file descriptor with `os.write`, not through the stream's
    buffer: a write that blocks then holds no lock of the stream that the interpreter's exit
    (or anything else writing to stdout) would wait for.
    """

    def __init__(self, stream: TextIO, capacity: int = QUEUE_LINES) -> None:
        self.stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (OSError, ValueError, AttributeError):  # no descriptor (e.g. StringIO)
            self._fd = None
        self._queue: queue.Queue[object] = queue.Queue(capacity)
        # Counted apart, summed to read: `_full` by whichever thread logs (under the lock,
        # taken only when a line is dropped), `_failed` by the writer alone.
        self._full = 0  # lines the queue had no room for
        self._failed = 0  # lines a write failed for: a closed pipe
        self._lock = threading.Lock()
        self._said = 0  # of the dropped, how many a `log.dropped` line has told of
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    @property
    def dropped(self) -> int:
        """Lines dropped so far: no room in the queue, or a write that failed."""
        return self._full + self._failed

    def start(self) -> LogWriter:
        self._thread.start()
        return self

    def put(self, line: str) -> None:
        if self._closed:
            if threading.get_ident() == self._thread.ident:
                self._write(line)  # the writer's own last `log.dropped`, at exit
            else:
                self._drop()
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._drop()

    def _drop(self) -> None:
        with self._lock:
            self._full += 1

    def close(self, timeout: float = FLUSH_S) -> bool:
        """Write what is queued, waiting at most `timeout`; True when all of it was written.
        Lines logged afterwards are dropped: a stalled reader must not hold the exit."""
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (line := self._queue.get()) is not _STOP:
            self._write(str(line))
            if self.dropped > self._said and self._queue.empty():
                self._say_dropped()  # the reader is back: what it missed
        if self.dropped > self._said:
            self._say_dropped()  # at exit, written at once (see `put`)

    def _say_dropped(self) -> None:
        count = self.dropped - self._said
        self._said += count
        # Rendered as every other line is; it goes through the queue, which is empty now.
        log.warning("log.dropped", count=count, total=self.dropped)

    def _write(self, line: str) -> None:
        if self._fd is None:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError, AttributeError):  # closed, or None (no stdout)
                self._failed += 1
            return
        data = memoryview((line + "\n").encode("utf-8", "backslashreplace"))
        while data:
            try:
                data = data[os.write(self._fd, data) :]
            except BlockingIOError:  # someone made the descriptor non-blocking
                select.select([], [self._fd], [], WRITABLE_WAIT_S)
            except OSError:  # the reader is gone (EPIPE), or the descriptor is
                self._failed += 1
                return


class _Queued:
    """structlog's logger for a `LogWriter`: every method hands the rendered line on."""

    def __init__(self, writer: LogWriter) -> None:
        put = writer.put
        self.msg = self.log = self.debug = self.info = self.warn = self.warning = put
        self.err = self.error = self.exception = self.critical = self.fatal = self.failure = put


_writer: LogWriter | None = None


def lines_dropped() -> int:
    """Log lines dropped by the writer logging goes through now (0 when it writes itself)."""
    return 0 if _writer is None else _writer.dropped


def configure_logging(
    log_format: str,
    level: str,
    stream: TextIO | None = None,
    observe: Callable[[Mapping[str, Any]], None] | None = None,
    environ: Mapping[str, str] = os.environ,
    writer: LogWriter | None = None,
) -> None:
    """Log at `level` and above to `stream` (stdout by default), or through `writer` (which
    writes to its own stream) off the calling thread.

    `observe`, if given, sees every record from info up, whatever `level` says: the demo
    tells its story from them while the file keeps only what was asked for. When `stream`
    is the journal (`environ` JOURNAL_STREAM), each line starts with its syslog priority.
    """
    global _writer
    _writer = writer
    stream = writer.stream if writer is not None else stream or sys.stdout
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
        logger_factory=structlog.PrintLoggerFactory(stream)
        if writer is None
        else lambda *_: _Queued(writer),
        # Not cached: tests swap the configuration (structlog.testing.capture_logs), and the
        # monitor logs rarely enough that the lookup costs nothing.
        cache_logger_on_first_use=False,
    )


@contextlib.contextmanager
def logging_off_the_loop(log_format: str, level: str) -> Iterator[LogWriter]:
    """Log to stdout through a `LogWriter` while the block runs (`watch`, `attach`); at its
    end, what is still queued is written within `FLUSH_S`."""
    writer = LogWriter(sys.stdout).start()
    configure_logging(log_format, level, writer=writer)
    try:
        yield writer
    finally:
        writer.close()
