"""Replay, the shell: open the recordings, print the detection lines, draw the progress line.

The decoding and the tracker run in the pure core (monitor/core/replay.py). Streams are read a
line at a time, so memory follows the largest frame and the number of sessions, not the size
of the file; only a session export, being one JSON document, is read whole.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING

from monitor.core.frames import MAX_LINE_BYTES
from monitor.core.replay import (
    FileReplay,
    RecordingError,
    Totals,
    bounded_lines,
    exit_status,
    progress_text,
    replay_lines,
)
from monitor.core.tracker import Detection
from monitor.exits import EX_PIPE

if TYPE_CHECKING:
    from monitor.config import Settings

__all__ = ["Progress", "read_lines", "replay_files", "run_replay"]

PROG = "opencode-loop-monitor replay"

PROGRESS_INTERVAL_S = 0.2  # at most five redraws a second: drawing must not cost the replay


class _Unreadable(Exception):
    """Opening or reading the file failed. Kept apart from OSError, which writing the output
    raises too (a closed pipe), and which is not the file's fault."""


class Progress:
    """One status line redrawn in place on a terminal; silent when `enabled` is false.

    `shares_screen`: the output lines go to the same terminal, so the status line must be
    erased before each of them. Otherwise it stays up, or dense detections would erase it
    right after every redraw and it would never be seen.
    """

    def __init__(
        self,
        stream: IO[str],
        *,
        enabled: bool,
        shares_screen: bool = False,
        clock: Callable[[], float] = time.monotonic,
        interval: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self._stream = stream
        self._enabled = enabled
        self._shares_screen = shares_screen
        self._clock = clock
        self._interval = interval
        self._drawn_at = float("-inf")
        self._visible = False

    def update(self, name: str, done: int, total: int | None, frames: int) -> None:
        if not self._enabled:
            return
        now = self._clock()
        if now - self._drawn_at < self._interval:
            return
        self._drawn_at = now
        # \r back to the start, \x1b[K erases what a longer previous line left behind.
        self._stream.write(f"\r{progress_text(name, done, total, frames)}\x1b[K")
        self._stream.flush()
        self._visible = True

    def before_output(self) -> None:
        if self._shares_screen:
            self.clear()

    def clear(self) -> None:
        """Erase the line (at the end of a file)."""
        if self._visible:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._visible = False


def _readline(stream: IO[bytes]) -> bytes:
    try:
        return stream.readline(MAX_LINE_BYTES)
    except OSError as error:
        raise _Unreadable(error.strerror or str(error)) from None


def read_lines(stream: IO[bytes], on_read: Callable[[int], None]) -> Iterator[str]:
    """The lines of a binary stream, cut at MAX_LINE_BYTES; `on_read` gets the bytes read."""
    reads = iter(lambda: _readline(stream), b"")
    for done, line in bounded_lines(reads, MAX_LINE_BYTES):
        on_read(done)
        yield line


def _open(path: str, stdin: IO[bytes]) -> tuple[IO[bytes], int | None]:
    """The stream to read and its size, when it has one (not stdin, a pipe or a FIFO)."""
    if path == "-":
        return stdin, None
    try:
        stream = open(path, "rb")
    except OSError as error:
        raise _Unreadable(error.strerror or str(error)) from None
    info = os.fstat(stream.fileno())
    return stream, info.st_size if stat.S_ISREG(info.st_mode) else None


def _replay_file(replay: FileReplay, stdin: IO[bytes], out: IO[str], progress: Progress) -> None:
    """Replay one file, printing its detections as they come.

    Raises _Unreadable or RecordingError for the file; OSError only for the output.
    """
    path = replay.file
    stream, total = _open(path, stdin)

    def on_read(done: int) -> None:
        progress.update(path, done, total, replay.frames)

    try:
        for record in replay_lines(read_lines(stream, on_read), replay):
            progress.before_output()
            out.write(json.dumps(record) + "\n")
    finally:
        if stream is not stdin:
            stream.close()
        progress.clear()


def replay_files(
    paths: Iterable[str],
    detection: Detection,
    *,
    out: IO[str],
    err: IO[str],
    isatty: bool,
    out_isatty: bool = False,
    fail_on_detect: bool = False,
    stdin: IO[bytes] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Replay each file, print a line per detection and a summary; return the exit status.

    `-` reads standard input. A file that cannot be read, or is not a recording, gets one
    line on `err` and the others are still replayed; the status is then EX_USAGE. `isatty`
    (whether `err` is a terminal) switches the progress line on; `out_isatty` tells it that
    `out` shares that terminal.
    """
    progress = Progress(err, enabled=isatty, shares_screen=out_isatty, clock=clock)
    totals = Totals()
    failed = False
    for path in paths:
        replay = FileReplay(path, detection)
        complete = False
        try:
            _replay_file(replay, stdin if stdin is not None else sys.stdin.buffer, out, progress)
            complete = True
        except _Unreadable as error:
            failed = True
            err.write(f"{PROG}: cannot read {path}: {error}\n")
        except RecordingError as error:
            failed = True
            err.write(f"{PROG}: {path}: {error}\n")
        # A file that failed partway still counts what was read: its detections are printed.
        totals = totals.add(replay, complete=complete)
    out.write(json.dumps(totals.record()) + "\n")
    out.flush()
    return exit_status(totals, failed=failed, fail_on_detect=fail_on_detect)


def run_replay(settings: Settings, paths: list[str], *, fail_on_detect: bool) -> int:
    from monitor.config import detection_of

    try:
        return replay_files(
            paths,
            detection_of(settings),
            out=sys.stdout,
            err=sys.stderr,
            isatty=sys.stderr.isatty(),
            out_isatty=sys.stdout.isatty(),
            fail_on_detect=fail_on_detect,
        )
    except BrokenPipeError:
        # `replay ... | head -1`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again, as the Python docs on SIGPIPE advise.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_PIPE
