"""Replay, the pure part: recordings in, detection records out, the live tracker's rules.

Three kinds of recording are read, told apart by their first non-blank line (`sniff_format`):
- an event stream as `watch --record` writes it or as in ../shared/opencode/captures
  (`data:` lines, either stream form), read by the same decoder as the daemon's stream;
- JSON Lines, one event of either stream form per line;
- a session export, the JSON array `GET /session/{id}/message` answers, turned into the
  frames the live stream would have carried for it (`export_frames`).

`bounded_lines` turns the reads of a file into lines of bounded size, `replay_lines` the lines
into records through a `FileReplay`. Opening files, printing and the progress line are the
shell's (monitor/shell/replay.py).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from monitor.core.decisions import Intervene, Outcome, Plan
from monitor.core.export import export_frames
from monitor.core.findings import fields
from monitor.core.frames import MAX_LINE_BYTES, iter_sse_data, loads
from monitor.core.tracker import Detection, Tracker
from monitor.errors import InputError
from monitor.exits import EX_DETECTED, EX_OK, EX_USAGE

__all__ = [
    "FileReplay",
    "Format",
    "RecordingError",
    "Totals",
    "bounded_lines",
    "exit_status",
    "progress_text",
    "replay_lines",
    "sniff_format",
]

_SSE_FIELDS = frozenset({"data", "event", "id", "retry"})


class Format(enum.Enum):
    SSE = "sse"
    JSON_LINES = "jsonl"
    EXPORT = "export"


class RecordingError(InputError, ValueError):
    """The file is not a recording we can read; the message is safe to print."""


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
        # As `watch --dry-run` does: each intervention is carried out at once (nothing is
        # done), and a loop's calls that one stands for are not detections of their own.
        made = [decision for decision in decisions if decision.plan != Plan.DEFER]
        for decision in made:
            self.tracker.outcome(decision, Outcome.DRY_RUN)
        self.detections += len(made)
        return [detection_record(self.file, decision) for decision in made]


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
    return EX_OK


def progress_text(name: str, done: int, total: int | None, frames: int) -> str:
    size = (
        f"{done / 1e6:.1f} MB" if total is None else f"{done / 1e6:.1f} MB / {total / 1e6:.1f} MB"
    )
    return f"{name}: {size}, {frames} frames"


def bounded_lines(reads: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """The lines of a file as text, from its reads of at most `limit` bytes each (what
    `readline(limit)` returns), with the bytes read so far.

    A line longer than `limit` is cut there and the rest skipped, so memory follows `limit`,
    not the longest line; bad UTF-8 is replaced (and fails as JSON later).
    """
    done = 0
    pending = iter(reads)
    for line in pending:
        done += len(line)
        if len(line) == limit and not line.endswith(b"\n"):
            for rest in pending:
                done += len(rest)
                if rest.endswith(b"\n"):
                    break
            # The cut line still ends where the long one did: it fails as JSON, alone.
            line += b"\n"
        yield done, line.decode("utf-8", "replace")


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
            messages = loads("".join(rest))
        except (ValueError, RecursionError):
            raise RecordingError("starts with [ but is not a valid JSON session export") from None
        for frame in export_frames(messages):
            yield from replay.feed_frame(frame)
