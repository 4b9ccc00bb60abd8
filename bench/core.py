"""The core alone: frames per CPU second through `Tracker.feed_data`, no socket, no loop.

    python -m bench.core [--frames 100000] [--rounds 3]

Feeds the throughput corpus (bench/corpus.py) to one tracker with the daemon's settings and
reports the best of `rounds` runs by CPU time, beside the floor measured in the same process
on the same data: `json.loads` of each frame, the least any reader does. Without the stream
and the event loop, a change to the core shows here undiluted; to compare two versions of
the core, run this file with the other version first on `PYTHONPATH` (the corpus is the same).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from bench.corpus import frame_data
from bench.throughput import bench_settings
from monitor.config import detection_of
from monitor.core.tracker import Tracker


def cpu_seconds(run: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def measure(frames: int, rounds: int) -> dict[str, float]:
    data = frame_data(frames)

    def floor() -> None:
        for item in data:
            json.loads(item)

    def core() -> None:
        tracker = Tracker(detection_of(bench_settings("http://127.0.0.1:9")))
        for item in data:
            tracker.feed_data(item)

    floor_s, core_s = cpu_seconds(floor, rounds), cpu_seconds(core, rounds)
    return {
        "frames": len(data),
        "floor_fps": round(len(data) / floor_s),
        "core_fps": round(len(data) / core_s),
        "core_over_floor": round(floor_s / core_s, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.frames, args.rounds)))


if __name__ == "__main__":
    main()
