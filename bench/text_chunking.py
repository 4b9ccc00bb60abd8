"""How to cut streamed text into units for repetition detection: a measurement.

    python -m bench.text_chunking

Runs every text and reasoning part of the labelled text traces (tests/corpus/*.text-*.sse,
recorded from the real server) through three ways of cutting text, each followed by the same
back-to-back repetition check as monitor/core/rules/text.py (a passage of up to 32 units
written 5 times in a row), and prints, per trace, the delta on which each way finds a loop
(`-`: none):

- `line`: one unit per line;
- `window`: one unit per 64 characters;
- `sentence`: sentences and line ends, without treating code, tables or lists apart;
- `rule`: `TextStream` itself (sentences, code blocks and tables as single units).

The results are in docs/detection.md ("Text loops").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

from monitor.core.events import PartDelta, TextPart, parse_event
from monitor.core.frames import decode_frame, iter_sse_data
from monitor.core.rules.text import MAX_BLOCK, TextStream

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"
REPEATS = 5
WINDOW = 64

Cut = Callable[[str], Iterator[tuple[int, str]]]  # (offset where the unit is complete, unit)


def lines(text: str) -> Iterator[tuple[int, str]]:
    for match in re.finditer(r"[^\n]*\n", text):
        yield match.end(), match.group()


def windows(text: str) -> Iterator[tuple[int, str]]:
    for start in range(0, len(text) - WINDOW + 1, WINDOW):
        yield start + WINDOW, text[start : start + WINDOW]


def sentences(text: str) -> Iterator[tuple[int, str]]:
    last = 0
    for match in re.finditer(r"(?<=[^\d\s][.!?])\s|\n", text):
        yield match.end(), text[last : match.start()]
        last = match.end()


def first_loop(units: Iterator[tuple[int, str]]) -> int | None:
    """The offset at which some passage has been written REPEATS times back to back."""
    seen: list[str] = []
    for offset, unit in units:
        unit = " ".join(unit.split())
        if not re.search(r"\w", unit):
            continue
        seen.append(unit)
        for length in range(1, MAX_BLOCK + 1):
            span = length * REPEATS
            tail = seen[-span:]
            if len(tail) == span and all(tail[i] == tail[i - length] for i in range(length, span)):
                return offset
    return None


def parts(path: Path) -> Iterator[list[str]]:
    """The deltas of each streamed part of a trace, in order."""
    deltas: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as stream:
        for data in iter_sse_data(stream):
            _, event = parse_event(decode_frame(data))
            if isinstance(event, PartDelta):
                deltas.setdefault(event.part_id, []).append(event.delta)
            elif isinstance(event, TextPart) and event.ended and event.part_id in deltas:
                yield deltas.pop(event.part_id)


def chunk_at(deltas: list[str], offset: int) -> int:
    """The delta that brings the text to `offset` characters (offsets never pass its end)."""
    total = 0
    for index, delta in enumerate(deltas, 1):
        total += len(delta)
        if total >= offset:
            return index
    return len(deltas)


def by_rule(deltas: list[str]) -> int | None:
    stream = TextStream(repeats=REPEATS)
    for delta in deltas:
        if (found := stream.feed(delta)) is not None:
            return found.chunk
    return None


CUTS: dict[str, Cut] = {"line": lines, "window": windows, "sentence": sentences}


def main() -> None:
    print(f"{'trace':40} {'line':>6} {'window':>6} {'sentence':>8} {'rule':>6}")
    for path in sorted(CORPUS.glob("*.text-*.sse")):
        found = {name: [] for name in (*CUTS, "rule")}
        for deltas in parts(path):
            text = "".join(deltas)
            for name, cut in CUTS.items():
                offset = first_loop(cut(text))
                found[name].append(None if offset is None else chunk_at(deltas, offset))
            found["rule"].append(by_rule(deltas))
        cells = []
        for values in found.values():
            hits = [str(v) for v in values if v is not None]
            cells.append(",".join(hits) or "-")
        print(f"{path.name:40} {cells[0]:>6} {cells[1]:>6} {cells[2]:>8} {cells[3]:>6}")


if __name__ == "__main__":
    main()
