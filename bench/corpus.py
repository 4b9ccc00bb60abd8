"""The frames the throughput benchmark streams: the recordings of the real server, repeated.

Each replay of a recording gets its own session, message and part ids, so the tracker sees
thousands of distinct sessions instead of one session replayed; the recordings are loop
tests, so every replay also carries a few loops and the tracker decides now and then.
Replays are interleaved in groups, as the runs of several sessions are on a live server.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

from monitor.core.frames import iter_sse_data

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "recordings"
# The delta-heavy stream: the text-loop traces of the real server, where streamed text and
# reasoning chunks (`message.part.delta`) are most of the frames.
TEXT_TRACES = Path(__file__).resolve().parents[1] / "tests" / "corpus"
# The 2.x stream: the new session engine of the real 1.18.33 as `/api/event` sends it
# (tests/recordings/engine), the same loops as events instead of part updates.
# The 2.2.5 stream: the real OpenCode 2.2.5's `/api/event` (tests/recordings/v2.2.5: loops
# of reads and shell calls, the plugin's refusals, permission requests, its heartbeats).
CORPORA = {
    "tools": (CAPTURES, "*.sse"),
    "text": (TEXT_TRACES, "*.text-*.sse"),
    "engine": (CAPTURES / "engine", "*.api.sse"),
    "v2": (CAPTURES / "v2.2.5", "*.sse"),
}
# Sessions running at once: replays interleaved frame by frame.
CONCURRENT = 8
_ID = re.compile(r"\b((?:ses|msg|prt)_[A-Za-z0-9]+)")


def recordings(captures: Path = CAPTURES, pattern: str = "*.sse") -> list[list[str]]:
    """The data of every event of every recording, one list per recording."""
    out = []
    for path in sorted(captures.glob(pattern)):
        with open(path, encoding="utf-8") as lines:
            out.append(list(iter_sse_data(lines)))
    return out


def _replays(recorded: list[list[str]]) -> Iterator[list[str]]:
    for n in itertools.count():
        for frames in recorded:
            yield [_ID.sub(rf"\1x{n}", data) for data in frames]


def frame_data(count: int, captures: Path = CAPTURES, pattern: str = "*.sse") -> list[str]:
    """`count` event payloads built from the recordings (deterministic)."""
    replays = _replays(recordings(captures, pattern))
    out: list[str] = []
    while len(out) < count:
        group = [next(replays) for _ in range(CONCURRENT)]
        for row in itertools.zip_longest(*group):
            out.extend(data for data in row if data is not None)
    return out[:count]


def sse_bytes(data: list[str]) -> bytes:
    """The stream as the server writes it: one `data:` line and a blank line per event."""
    return "".join(f"data: {item}\n\n" for item in data).encode()
