"""Run every benchmark and print one table: `python -m bench.run` (about two minutes).

Each measurement runs in a fresh process: the throughput server in one of its own for the
whole run, each throughput reader, the latency run (server here, monitor in a child) and
each memory run. The throughput readers take turns, round after round, in a rotating
order, so a burst of load on this shared machine hits all of them alike; what the table
reports are medians, and the ratio is the median of each round's own ratio.

`--profile` adds one profiled run of the whole pipeline (cProfile, top entries by own
time); it is slower than the others and not part of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from bench.throughput import READERS
from monitor.core.texts import MAX_STREAMING_PARTS

ROOT = Path(__file__).resolve().parents[1]
# Where the real-server suite may leave its figure (see docs/performance.md).
OVERSHOOT_ENV = "BENCH_OVERSHOOT"
OVERSHOOT_SOURCE = "run the real-server tests first (pytest -m real_server)"
# Written by the real-server tests (tests/conftest.py, measure_overshoot).
OVERSHOOT_FILE = Path(__file__).resolve().parents[1] / ".cache" / "overshoot.jsonl"
TEXT_OVERSHOOT_FILE = OVERSHOOT_FILE.parent / "text-overshoot.jsonl"
# Latency rounds; each round runs the monitor and its floors (`bench.floor`) in turn, and the
# table shows the monitor's run with the median p99, so one burst of load elsewhere on the
# machine does not decide the figure, and the median of each round's ratio to the floor.
LATENCY_RUNS = 3
# `floor-read` reads the session's newest messages before the abort, as the monitor does.
LATENCY_CLIENTS = ["monitor", "floor", "floor-read"]
PERMISSION_CLIENTS = ["monitor", "floor"]


def python(*args: str) -> dict:
    """Run `python -m ...` from the repository root; its last output line is JSON."""
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    model = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "aiohttp": installed("aiohttp"),
        "aiohttp-sse-client": installed("aiohttp-sse-client"),
        "load": " ".join(f"{load:.2f}" for load in os.getloadavg()),
    }


def throughput(
    frames: int, rounds: int, profile: bool, corpus: str = "tools"
) -> tuple[dict, str | None]:
    """Each reader's results, round by round; and the profile of one more pipeline run."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.throughput", "serve", str(frames), "--corpus", corpus],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url:
            raise SystemExit("the throughput server did not start")
        runs: dict[str, list[dict]] = {reader: [] for reader in READERS}
        for round_ in range(rounds):
            shift = round_ % len(READERS)
            for reader in READERS[shift:] + READERS[:shift]:
                runs[reader].append(python("bench.throughput", "read", reader, url))
            print(
                f"  round {round_ + 1}/{rounds} (frames/s): "
                + ", ".join(f"{reader} {done[-1]['fps']:,.0f}" for reader, done in runs.items()),
                file=sys.stderr,
            )
        profiled = None
        if profile:
            profiled = python("bench.throughput", "read", "watch", url, "--profile")["profile"]
    finally:
        server.terminate()
        server.wait()
    return runs, profiled


def ratio(
    runs: dict[str, list[dict]], reader: str, key: str, base: str = "baseline"
) -> tuple[float, float, float]:
    """Median, lowest and highest over the rounds of `reader`'s figure over `base`'s."""
    each = [r[key] / b[key] for r, b in zip(runs[reader], runs[base], strict=True)]
    return statistics.median(each), min(each), max(each)


def alternated(module: str, clients: list[str], key: str, *args: str) -> dict[str, list[dict]]:
    """Each client's runs of `module`, `LATENCY_RUNS` rounds, the clients taking turns in an
    order rotated every round (as the throughput readers do)."""
    runs: dict[str, list[dict]] = {client: [] for client in clients}
    for round_ in range(LATENCY_RUNS):
        shift = round_ % len(clients)
        for client in clients[shift:] + clients[:shift]:
            runs[client].append(python(module, *args, "--client", client))
        print(
            f"  round {round_ + 1}/{LATENCY_RUNS} ({key}): "
            + ", ".join(f"{client} {done[-1][key]:.2f}" for client, done in runs.items()),
            file=sys.stderr,
        )
    return runs


def median_run(runs: list[dict]) -> dict:
    """The run with the median p99."""
    return sorted(runs, key=lambda run: run["p99_ms"])[len(runs) // 2]


def floor_rows(
    what: str, runs: dict[str, list[dict]], p50: str, p99: str
) -> list[tuple[str, str, str, str]]:
    """The floors' figures beside the monitor's: their p50 / p99, and the monitor's over each."""
    rows = []
    for floor in runs:
        if floor == "monitor":
            continue
        run = median_run(runs[floor])
        rows.append(
            (
                f"{what} latency p50 / p99, {floor} (median run)",
                f"{run[p50]:.2f} / {run[p99]:.2f} ms",
                "",
                "",
            )
        )
    for floor in runs:
        if floor == "monitor":
            continue
        mid, tail = (ratio(runs, "monitor", key, floor) for key in (p50, p99))
        rows.append(
            (
                f"{what}: monitor / {floor}, p50; p99 (median of rounds)",
                f"{mid[0]:.2f}x (rounds {mid[1]:.2f}-{mid[2]:.2f}); "
                f"{tail[0]:.2f}x (rounds {tail[1]:.2f}-{tail[2]:.2f})",
                "",
                "",
            )
        )
    return rows


def overshoot() -> tuple[str, str]:
    """The real-server figure: $BENCH_OVERSHOOT, or what the last test run left behind."""
    value = os.environ.get(OVERSHOOT_ENV, "").strip()
    if value and Path(value).is_file():
        value = Path(value).read_text(encoding="utf-8").strip()
    if value:
        return f"{value} calls", "yes" if value == "0" else "NO"
    if not OVERSHOOT_FILE.is_file():
        return OVERSHOOT_SOURCE, ""
    records = [json.loads(line) for line in OVERSHOOT_FILE.read_text().splitlines() if line]
    if not records:
        return OVERSHOOT_SOURCE, ""
    calls = sum(r["overshoot"] for r in records)
    loops = sum(r["loops"] for r in records)
    tests = len({r["test"] for r in records})
    return f"{calls} calls after {loops} loops ({tests} real-server tests)", (
        "yes" if calls == 0 else "NO"
    )


def text_overshoot() -> str:
    """What tests/test_real_text.py left behind: per text loop, the deltas the server stored
    after the one the monitor decided on."""
    if not TEXT_OVERSHOOT_FILE.is_file():
        return "run pytest tests/test_real_text.py first"
    records = [json.loads(line) for line in TEXT_OVERSHOOT_FILE.read_text().splitlines() if line]
    return ", ".join(f"{r['past']} ({r['test']})" for r in records) or "none recorded"


def table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("measure", "result", "goal", "met")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loops", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)

    print("machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"throughput: {args.frames:,} frames x {args.rounds} rounds...", file=sys.stderr)
    runs, profiled = throughput(args.frames, args.rounds, args.profile)
    print(
        f"throughput, delta-heavy: {args.frames:,} frames x {args.rounds} rounds...",
        file=sys.stderr,
    )
    text_runs, _ = throughput(args.frames, args.rounds, False, "text")
    print(
        f"throughput, 2.x stream: {args.frames:,} frames x {args.rounds} rounds...", file=sys.stderr
    )
    engine_runs, _ = throughput(args.frames, args.rounds, False, "engine")
    print(
        f"throughput, 2.2.5 stream: {args.frames:,} frames x {args.rounds} rounds...",
        file=sys.stderr,
    )
    v2_runs, _ = throughput(args.frames, args.rounds, False, "v2")
    print(f"latency: {LATENCY_RUNS} rounds x {args.loops} loops...", file=sys.stderr)
    aborts = alternated("bench.latency", LATENCY_CLIENTS, "p99_ms", "--loops", str(args.loops))
    latency = median_run(aborts["monitor"])
    print(f"permission answers: {LATENCY_RUNS} rounds...", file=sys.stderr)
    refusals = alternated("bench.permissions", PERMISSION_CLIENTS, "refusal_p99_ms")
    answer = median_run(refusals["monitor"])
    print(f"memory: {args.sessions:,} sessions...", file=sys.stderr)
    rss = python("bench.memory", "rss", "--sessions", str(args.sessions))
    traced = python("bench.memory", "tracemalloc", "--sessions", str(args.sessions))
    # The progress rules' worst case: every call a check and a remembered call.
    reads = python("bench.memory", "rss", "--reads", "--sessions", str(args.sessions))
    parts = python("bench.memory", "rss", "--parts", str(MAX_STREAMING_PARTS))

    rows = []
    for reader, label in (
        ("baseline", "baseline reader: aiohttp lines + json.loads"),
        ("sse-client", "reference: aiohttp-sse-client + json.loads"),
        ("watch", "whole pipeline: Watch, dry run"),
    ):
        if reader not in runs:
            continue
        wall = statistics.median(r["fps"] for r in runs[reader])
        cpu = statistics.median(r["cpu_fps"] for r in runs[reader])
        rows.append((label, f"{wall:,.0f} frames/s ({cpu:,.0f} per CPU second)", "", ""))
    for reader in ("sse-client", "watch"):
        if reader not in runs:
            continue
        wall_ratio, low, high = ratio(runs, reader, "fps")
        cpu_ratio = ratio(runs, reader, "cpu_fps")[0]
        goal = reader == "watch"
        rows.append(
            (
                f"{reader} / baseline, median of rounds",
                f"{wall_ratio:.2f} (rounds {low:.2f}-{high:.2f}; by CPU time {cpu_ratio:.2f})",
                ">= 1.0" if goal else "",
                ("yes" if wall_ratio >= 1.0 else "NO") if goal else "",
            )
        )
    text_ratio, text_low, text_high = ratio(text_runs, "watch", "fps")
    rows.append(
        (
            "delta-heavy stream: watch (text rules on) / baseline",
            f"{text_ratio:.2f} (rounds {text_low:.2f}-{text_high:.2f}; by CPU time "
            f"{ratio(text_runs, 'watch', 'cpu_fps')[0]:.2f})",
            ">= 1.0",
            "yes" if text_ratio >= 1.0 else "NO",
        )
    )
    engine_ratio, engine_low, engine_high = ratio(engine_runs, "watch", "fps")
    rows.append(
        (
            "2.x stream (new engine, /api/event): watch / baseline",
            f"{engine_ratio:.2f} (rounds {engine_low:.2f}-{engine_high:.2f}; by CPU time "
            f"{ratio(engine_runs, 'watch', 'cpu_fps')[0]:.2f})",
            ">= 1.0",
            "yes" if engine_ratio >= 1.0 else "NO",
        )
    )
    v2_ratio, v2_low, v2_high = ratio(v2_runs, "watch", "fps")
    rows.append(
        (
            "2.2.5 stream (OpenCode 2.2.5's /api/event): watch / baseline",
            f"{v2_ratio:.2f} (rounds {v2_low:.2f}-{v2_high:.2f}; by CPU time "
            f"{ratio(v2_runs, 'watch', 'cpu_fps')[0]:.2f})",
            ">= 1.0",
            "yes" if v2_ratio >= 1.0 else "NO",
        )
    )
    per_session = rss["bytes_per_session"]
    per_part = parts["bytes_per_part"]
    rows += [
        (
            "abort latency p50 / p99, monitor (median run)",
            f"{latency['p50_ms']:.2f} / {latency['p99_ms']:.2f} ms (p99 runs: "
            + ", ".join(f"{run['p99_ms']:.2f}" for run in aborts["monitor"])
            + f"; max {latency['max_ms']:.1f}; {latency['aborted']}/{latency['loops']} aborted)",
            "< 2 ms",
            "yes" if latency["p99_ms"] < 2 and latency["aborted"] == latency["loops"] else "NO",
        ),
        *floor_rows("abort", aborts, "p50_ms", "p99_ms"),
        (
            "permission answer p50: refusal / approval (median run)",
            f"{answer['refusal_p50_ms']:.2f} / {answer['approval_p50_ms']:.2f} ms",
            "",
            "",
        ),
        (
            "permission answer p99, asked to reply (median run)",
            f"{answer['p99_ms']:.2f} ms (runs: "
            + ", ".join(f"{run['p99_ms']:.2f}" for run in refusals["monitor"])
            + f"; {answer['refused']}/{answer['loops']} loops refused, "
            + f"{answer['loop_calls_approved']} loop calls approved)",
            "< 5 ms",
            "yes"
            if answer["p99_ms"] < 5
            and answer["refused"] == answer["loops"]
            and answer["loop_calls_approved"] == 0
            else "NO",
        ),
        *floor_rows("refusal", refusals, "refusal_p50_ms", "refusal_p99_ms"),
        (
            f"memory per session, RSS ({rss['sessions']:,} x {rss['calls']} calls of 2 KB)",
            f"{per_session:,.0f} B",
            "< 2 KB",
            "yes" if per_session < 2048 else "NO",
        ),
        ("memory per session, tracemalloc", f"{traced['bytes_per_session']:,.0f} B", "", ""),
        (
            f"memory per session, RSS, {reads['calls']} reads with different answers",
            f"{reads['bytes_per_session']:,.0f} B",
            "< 2 KB",
            "yes" if reads["bytes_per_session"] < 2048 else "NO",
        ),
        ("overshoot on the real server", overshoot()[0], "0", overshoot()[1]),
        (
            f"memory per streaming text part, RSS ({parts['parts']:,} parts)",
            f"{per_part:,.0f} B",
            "< 16 KB",
            "yes" if per_part < 16 * 1024 else "NO",
        ),
        ("text loops: deltas streamed past detection, real server", text_overshoot(), "", ""),
    ]
    print(table(rows))
    print(f"load average at the end: {machine()['load']}")
    if profiled is not None:
        print("\nprofile of the watch pipeline (cProfile, by own time):\n" + profiled)


if __name__ == "__main__":
    main()
