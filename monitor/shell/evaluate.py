"""`evaluate DIR...`: replay labelled traces and print how each rule did (monitor/core/evaluate.py).

A directory stands for the `*.sse` files in it, in name order; a file is taken as it is.
Each trace gets its own tracker, as in `replay`. Exit status: 0 every loop caught at its
labelled call and no false alarm, 1 otherwise, 2 a trace could not be read or has no label.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from monitor.core.evaluate import (
    LabelError,
    Result,
    all_right,
    legit_firings,
    parse_label,
    set_table,
    table,
    trace_line,
)
from monitor.core.findings import RULES
from monitor.core.replay import FileReplay, RecordingError, replay_lines
from monitor.core.tracker import Detection
from monitor.exits import EX_MISJUDGED, EX_USAGE
from monitor.shell.replay import read_lines

if TYPE_CHECKING:
    from monitor.config import Settings

__all__ = ["evaluate_paths", "replay_run", "run_evaluate"]

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


def run_evaluate(settings: Settings, paths: list[str], cache: str | None = None) -> int:
    """Labelled traces, or a corpus with sets (a folder holding sets.json and traj/)."""
    from monitor.config import detection_of

    detection = detection_of(settings)
    status = 0
    for root in (Path(p) for p in paths if is_set_corpus(Path(p))):
        where = None if cache is None else Path(cache)
        status = max(status, evaluate_corpus(root, detection, cache=where, out=sys.stdout))
    traces = [p for p in paths if not is_set_corpus(Path(p))]
    if traces:
        status = max(status, evaluate_paths(traces, detection, out=sys.stdout, err=sys.stderr))
    return status


# --- a corpus of real runs with labelled sets (../shared/realtraj) -------------------------

# Bumped whenever what a cached file result holds or how it is computed changes.
_CACHE_VERSION = "3"

Fired = dict[str, list[int]]


def is_set_corpus(path: Path) -> bool:
    return path.is_dir() and (path / "sets.json").is_file() and (path / "traj").is_dir()


def replay_run(path: Path, detection: Detection) -> Fired:
    """One run of the corpus (JSON Lines): where each rule fired (the tracker starts the
    run's rules over after each, as after an intervention)."""
    with path.open("rb") as stream:
        frames = (json.loads(line) for line in stream if line.strip())
        return replay_frames(path.name, frames, detection)


def replay_frames(name: str, frames: Iterable[object], detection: Detection) -> Fired:
    """`replay_run` over frames already read."""
    replay = FileReplay(name, detection)
    fired: Fired = {}
    for frame in frames:
        for record in replay.feed_frame(frame):
            fired.setdefault(record["rule"], []).append(record["position"])
    return fired


def cached_run(path: Path, detection: Detection, cache: Path | None) -> Fired:
    """`replay_run`, kept in `cache` (one pickle per run and settings) when given: replaying
    the 948 real runs takes minutes, reading them back seconds."""
    if cache is None:
        return replay_run(path, detection)
    info = path.stat()
    key = f"{path.resolve()}:{info.st_size}:{info.st_mtime_ns}:{detection!r}:{_CACHE_VERSION}"
    entry = cache / (hashlib.sha256(key.encode()).hexdigest() + ".pickle")
    try:
        with entry.open("rb") as stream:
            loaded: Fired = pickle.load(stream)  # noqa: S301 (our own cache)
            return loaded
    except (OSError, pickle.UnpicklingError, EOFError):
        pass
    result = replay_run(path, detection)
    cache.mkdir(parents=True, exist_ok=True)
    temporary = entry.with_suffix(f".{os.getpid()}.tmp")
    with temporary.open("wb") as stream:
        pickle.dump(result, stream)
    temporary.replace(entry)
    return result


def evaluate_corpus(root: Path, detection: Detection, *, cache: Path | None, out: IO[str]) -> int:
    """Every run of the corpus under the rules; the table per rule and set, then every firing
    on a legit set. Exit status 0 (nothing to compare with)."""
    sets: dict[str, list[str]] = json.loads((root / "sets.json").read_text("utf-8"))
    fired = {
        f"traj/{path.name}": cached_run(path, detection, cache)
        for path in sorted((root / "traj").glob("*.jsonl"))
    }
    rules = [rule for rule in RULES if rule != "doom_loop"]
    out.write("\n".join(set_table(fired, sets, rules, rules)) + "\n\n")
    out.write("\n".join(legit_firings(fired, sets, rules)) + "\n")
    return 0
