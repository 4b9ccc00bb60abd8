"""Replay: the live tracker run offline over recordings, to try thresholds on real traces.

Three kinds of recording are read, told apart by their first non-blank line:
- an event stream as `watch --record` writes it or as in ../shared/opencode/captures
  (`data:` lines, either stream form), read by the same decoder as the daemon's stream;
- JSON Lines, one event of either stream form per line;
- a session export, the JSON array `GET /session/{id}/message` answers, turned into the
  frames the live stream would have carried for it (`export_frames`).

The core (`sniff_format`, `FileReplay`, the records; `export_frames` in monitor/core/export.py) is
pure and synchronous;
`replay_files` is the thin shell that reads files, prints JSON lines and draws the progress
line. Streams are read a line at a time, so memory follows the largest frame and the number
of sessions, not the size of the file; only a session export, being one JSON document, is
read whole.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from monitor.core.decisions import Intervene
from monitor.core.export import export_frames
from monitor.core.findings import fields
from monitor.core.frames import MAX_LINE_BYTES, iter_sse_data
from monitor.core.tracker import Detection, Tracker
from monitor.exits import EX_DETECTED, EX_PIPE, EX_USAGE

if TYPE_CHECKING:
    from monitor.config import Settings

PROG = "opencode-loop-monitor replay"

PROGRESS_INTERVAL_S = 0.2  # at most five redraws a second: drawing must not cost the replay

_SSE_FIELDS = frozenset({"data", "event", "id", "retry"})


class Format(enum.Enum):
    SSE = "sse"
    JSON_LINES = "jsonl"
    EXPORT = "export"


class RecordingError(ValueError):
    """The file is not a recording we can read; the message is safe to print."""


class _Unreadable(Exception):
    """Opening or reading the file failed. Kept apart from OSError, which writing the output
    raises too (a closed pipe), and which is not the file's fault."""


# --- the pure core -------------------------------------------------------------------------


def sniff_format(first_line: str) -> Format:
    """Which kind of recording starts with this (first non-blank) line."""
    text = first_line.lstrip("\ufeff").strip()
    if text.startswith("["):
        return Format.EXPORT
    # A comment (`: ...`) or any SSE field; the server only sends `data:`, other writers may
    # add the rest.
    if text.startswith(":") or text.partition(":")[0] in _SSE_FIELDS:
        return Format.SSE
    if text.startswith("{"):
        try:
            is_object = isinstance(json.loads(text), dict)
        except (ValueError, RecursionError):
            is_object = False
        if is_object:
            return Format.JSON_LINES
        raise RecordingError(
            "the first line starts with { but is not a whole JSON object "
            "(JSON Lines needs one event per line)"
        )
    raise RecordingError(
        "not a recording: expected an event stream (data: lines), JSON Lines of events, "
        "or a session export (a JSON array)"
    )


def detection_record(file: str, decision: Intervene) -> dict[str, Any]:
    """The output line of one detection; never the tool arguments or outputs."""
    return {
        "event": "loop.detected",
        "rule": str(decision.rule),
        "file": file,
        "session_id": decision.session_id,
        "part_id": decision.part_id,
        "position": decision.position,
        **fields(decision.finding),
    }


class FileReplay:
    """One recording through its own tracker: feed it frames, get detection records.

    Each file gets a fresh tracker because recordings are independent: carrying one's history
    into the next would join the end of one run to the start of another (or count a run twice
    when its `/event` and `/global/event` recordings are replayed together), and positions
    would no longer be call numbers within the file's session.
    """

    def __init__(self, file: str, detection: Detection) -> None:
        self.file = file
        # Not armed: a recording's run never saw the stops replay reports, so an armed loop
        # would report every later call of it; replay says where the monitor steps in.
        self.tracker = Tracker(dataclasses.replace(detection, armed_runs=0))
        self.frames = 0
        self.detections = 0

    @property
    def malformed(self) -> int:
        return self.tracker.malformed_total

    @property
    def sessions(self) -> int:
        return self.tracker.sessions_seen

    def feed_data(self, data: str) -> list[dict[str, Any]]:
        """Take the data of one event, as an SSE event's data or a line of JSON Lines."""
        self.frames += 1
        return self._records(self.tracker.feed_data(data).decisions)

    def feed_frame(self, frame: object) -> list[dict[str, Any]]:
        """Take one frame of `export_frames` (a decoded frame, or a `Malformed`)."""
        self.frames += 1
        return self._records(self.tracker.feed(frame).decisions)

    def _records(self, decisions: Sequence[Intervene]) -> list[dict[str, Any]]:
        self.detections += len(decisions)
        return [detection_record(self.file, decision) for decision in decisions]


@dataclass(frozen=True, slots=True)
class Totals:
    """The summary line: `files` counts files read to the end; the rest counts all frames read."""

    files: int = 0
    frames: int = 0
    malformed: int = 0
    sessions: int = 0
    detections: int = 0

    def add(self, replay: FileReplay, *, complete: bool) -> Totals:
        return Totals(
            files=self.files + complete,
            frames=self.frames + replay.frames,
            malformed=self.malformed + replay.malformed,
            sessions=self.sessions + replay.sessions,
            detections=self.detections + replay.detections,
        )

    def record(self) -> dict[str, Any]:
        return {
            "event": "replay.summary",
            "files": self.files,
            "frames": self.frames,
            "malformed": self.malformed,
            "sessions": self.sessions,
            "detections": self.detections,
        }


def exit_status(totals: Totals, *, failed: bool, fail_on_detect: bool) -> int:
    # A file error wins over a detection: the result is incomplete, so "clean" or "found"
    # would both claim more than was checked.
    if failed:
        return EX_USAGE
    if fail_on_detect and totals.detections:
        return EX_DETECTED
    return 0


def progress_text(name: str, done: int, total: int | None, frames: int) -> str:
    size = (
        f"{done / 1e6:.1f} MB" if total is None else f"{done / 1e6:.1f} MB / {total / 1e6:.1f} MB"
    )
    return f"{name}: {size}, {frames} frames"


# --- the shell -----------------------------------------------------------------------------


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
    """Lines of a binary stream as text; bad UTF-8 is replaced (and fails as JSON later)."""
    done = 0
    while line := _readline(stream):
        done += len(line)
        if len(line) == MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := _readline(stream)) and not rest.endswith(b"\n"):
                done += len(rest)
            done += len(rest)
            # The cut line still ends where the long one did: it fails as JSON, alone.
            line += b"\n"
        on_read(done)
        yield line.decode("utf-8", "replace")


def replay_lines(lines: Iterator[str], replay: FileReplay) -> Iterator[dict[str, Any]]:
    """Sniff the format from the first non-blank line, then feed every frame to `replay`."""
    head: list[str] = []
    for line in lines:
        # A byte order mark, as some Windows editors write, is not part of the first line.
        head.append(line if head else line.lstrip("\ufeff"))
        if head[-1].strip():
            break
    else:
        return  # an empty file is an empty recording (a `--record` that saw nothing yet)
    kind = sniff_format(head[-1])
    rest = itertools.chain(head, lines)
    if kind is Format.SSE:
        for data in iter_sse_data(rest):
            yield from replay.feed_data(data)
    elif kind is Format.JSON_LINES:
        for line in rest:
            if line.strip():
                yield from replay.feed_data(line)
    else:
        # One JSON document: it has to be read whole.
        try:
            messages = json.loads("".join(rest))
        except (ValueError, RecursionError):
            raise RecordingError("starts with [ but is not a valid JSON session export") from None
        for frame in export_frames(messages):
            yield from replay.feed_frame(frame)


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
