"""`evaluate DIR...`: replay labelled traces and print how each rule did (monitor/core/evaluate.py).

A directory stands for the `*.sse` files in it, in name order; a file is taken as it is.
Each trace gets its own tracker, as in `replay`. Exit status: 0 every loop caught at its
labelled call and no false alarm, 1 otherwise, 2 a trace could not be read or has no label.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from monitor.core.evaluate import LabelError, Result, all_right, parse_label, table, trace_line
from monitor.core.replay import FileReplay, RecordingError, replay_lines
from monitor.core.tracker import Detection
from monitor.exits import EX_MISJUDGED, EX_USAGE
from monitor.shell.replay import read_lines

if TYPE_CHECKING:
    from monitor.config import Settings

PROG = "opencode-loop-monitor evaluate"


def trace_paths(paths: Iterable[str]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        found += sorted(path.glob("*.sse")) if path.is_dir() else [path]
    return found


def evaluate_trace(path: Path, detection: Detection) -> Result:
    """Replay one labelled trace; raises OSError, LabelError or RecordingError."""
    with path.open("rb") as stream:
        label = parse_label(stream.readline().decode("utf-8", "replace"))
        stream.seek(0)
        replay = FileReplay(str(path), detection)
        for record in replay_lines(read_lines(stream, lambda done: None), replay):
            return Result(path.name, label, record["rule"], record["position"])
    return Result(path.name, label)


def evaluate_paths(
    paths: Iterable[str], detection: Detection, *, out: IO[str], err: IO[str]
) -> int:
    results = []
    failed = False
    for path in trace_paths(paths):
        try:
            result = evaluate_trace(path, detection)
        except OSError as error:
            err.write(f"{PROG}: cannot read {path}: {error.strerror or error}\n")
            failed = True
            continue
        except (LabelError, RecordingError) as error:
            err.write(f"{PROG}: {path}: {error}\n")
            failed = True
            continue
        results.append(result)
        out.write(trace_line(result) + "\n")
    if results:  # a table of nothing under the errors would read as a result
        out.write("\n" + "\n".join(table(results)) + "\n")
    if failed:
        return EX_USAGE
    return 0 if all_right(results) else EX_MISJUDGED


def run_evaluate(settings: Settings, paths: list[str]) -> int:
    from monitor.config import detection_of

    return evaluate_paths(paths, detection_of(settings), out=sys.stdout, err=sys.stderr)
