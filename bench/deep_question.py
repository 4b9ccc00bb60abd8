"""A plugin question nested deeper than `json.loads` reads: its cost beside a floor.

    python -m bench.deep_question [--repeat 7]

Three bodies of 1 MiB, each read by `plugin_protocol.read_body` and judged by a fresh
`Tracker` (what the endpoint does on the event loop): 524,000 levels of `[`, 174,000
levels of `{"a":` (both read again by monitor/core/deep_json.py after `json.loads` gives up),
and the floor, a flat list of strings of the same size that `json.loads` reads. Prints the
median and range of each step, and the medians as ratios to the floor's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from monitor.core.plugin_protocol import PluginCall, read_body
from monitor.core.tracker import Tracker

_HEAD = (
    b'{"session_id": "ses_dd4d5c831ffemmgMvdYdtbM3cW", "call_id": "c", "tool": "bash", '
    b'"directory": "/p", "args": {"d": '
)
_LEVELS = (1 << 20) // 2 - 200


def bodies() -> dict[str, bytes]:
    n = _LEVELS
    flat = json.dumps(["x" * 60] * (n // 32)).encode()
    return {
        "floor (flat)": _HEAD + flat + b"}}",
        "arrays": _HEAD + b"[" * n + b"1" + b"]" * n + b"}}",
        "objects": _HEAD + b'{"a":' * (n // 3) + b"1" + b"}" * (n // 3) + b"}}",
    }


def measure(body: bytes, repeat: int) -> tuple[list[float], list[float]]:
    reads, judged = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        call = read_body(body)
        reads.append(time.perf_counter() - start)
        assert isinstance(call, PluginCall)
        start = time.perf_counter()
        Tracker().judge(call)
        judged.append(time.perf_counter() - start)
    return reads, judged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    floor: tuple[float, float] | None = None
    for name, body in bodies().items():
        reads, judged = measure(body, repeat)
        medians = statistics.median(reads), statistics.median(judged)
        floor = floor or medians
        print(
            f"{name}: {len(body):,} B; read {medians[0] * 1000:.1f} ms "
            f"({min(reads) * 1000:.0f}-{max(reads) * 1000:.0f}, {medians[0] / floor[0]:.0f}x), "
            f"judged {medians[1] * 1000:.1f} ms "
            f"({min(judged) * 1000:.0f}-{max(judged) * 1000:.0f}, {medians[1] / floor[1]:.0f}x)"
        )


if __name__ == "__main__":
    main()
