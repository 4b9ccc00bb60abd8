"""Reading the recordings of the real server (tests/recordings, from ../shared/opencode)."""

from __future__ import annotations

from pathlib import Path

from monitor.core.frames import decode_frame, iter_sse_data

CAPTURES = Path(__file__).resolve().parent / "recordings"


def capture_frames(name: str) -> list[object]:
    with open(CAPTURES / name, encoding="utf-8") as lines:
        return [decode_frame(data) for data in iter_sse_data(lines)]
