"""Time the plugin's hook adds to a tool call, measured inside the real OpenCode binary's Bun.

`python -m bench.plugin` (about half a minute). The opencode binary is a compiled Bun; with
BUN_BE_BUN=1 it runs scripts, so a small harness imports the very plugin `plugin install`
writes and times its `tool.execute.before` hook, call after call, against:
- the daemon: the watch daemon's endpoint (DecideServer) judging with the tracker, each call
  a new one (no loop, so every call is allowed after the whole judgement);
- the floor: a bare aiohttp handler on a Unix socket that answers `allow` at once;
- the daemon down (no socket: connection refused) and hung (accepts, never answers).
Prints JSON: p50/p99 per case in ms, and the daemon's p99 gap over the floor and its ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import tempfile
from pathlib import Path

from aiohttp import web

from monitor.core.tracker import Tracker
from monitor.kit.sandbox import default_cache_dir, find_or_install_opencode
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import PluginEndpoint
from monitor.shell.plugin_install import render

HARNESS = """
const [plugin, calls, warmup] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])]
const mod = await import(plugin)
const hooks = await mod.default.server({ directory: "/home/dev/project" })
const hook = hooks["tool.execute.before"]
const times = []
for (let i = 0; i < warmup + calls; i++) {
  const started = performance.now()
  await hook({ tool: "bash", sessionID: "ses_bench" + (i % 7), callID: "call_" + i },
             { args: { command: "echo " + i, description: "bench" } })
  if (i >= warmup) times.push(performance.now() - started)
}
console.log(JSON.stringify(times))
"""


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_harness(binary: Path, plugin: Path, harness: Path, calls: int, warmup: int):
    process = await asyncio.create_subprocess_exec(
        str(binary), "run", str(harness), str(plugin), str(calls), str(warmup),
        env={**os.environ, "BUN_BE_BUN": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await process.communicate()
    return json.loads(out)


async def floor_server(path: Path) -> web.AppRunner:
    async def allow(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"verdict": "allow"})

    app = web.Application()
    app.router.add_post("/v1/decide", allow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    return runner


async def main(calls: int, rounds: int) -> dict[str, object]:
    binary = find_or_install_opencode(default_cache_dir())
    folder = Path(tempfile.mkdtemp(prefix="olm-bench-"))
    harness = folder / "harness.ts"
    harness.write_text(HARNESS)
    cases: dict[str, list[float]] = {"daemon": [], "floor": [], "down": [], "hung": []}
    paths = {name: folder / f"{name}.sock" for name in cases}
    for name, path in paths.items():
        (folder / f"{name}.ts").write_text(render(PluginEndpoint(path)))
    tracker = Tracker()
    daemon = DecideServer(
        PluginEndpoint(paths["daemon"]),
        lambda call: tracker.judge(call).verdict,
        lambda call, verdict: None,
        lambda refused: None,
    )
    await daemon.start()
    floor = await floor_server(paths["floor"])
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(paths["hung"]))
    hung.listen(1024)
    try:
        # Alternating rounds: a burst of load elsewhere on the machine hits both alike.
        for _ in range(rounds):
            for name in ("daemon", "floor"):
                cases[name] += await run_harness(binary, folder / f"{name}.ts", harness, calls, 50)
        for name in ("down", "hung"):
            cases[name] += await run_harness(binary, folder / f"{name}.ts", harness, 10, 0)
    finally:
        hung.close()
        await floor.cleanup()
        await daemon.close()
    figures: dict[str, object] = {
        name: {
            "calls": len(times),
            "p50_ms": round(statistics.median(times), 3),
            "p99_ms": round(quantile(times, 0.99), 3),
        }
        for name, times in cases.items()
    }
    daemon_p99 = quantile(cases["daemon"], 0.99)
    floor_p99 = quantile(cases["floor"], 0.99)
    figures["daemon_minus_floor_p99_ms"] = round(daemon_p99 - floor_p99, 3)
    figures["daemon_over_floor_p99"] = round(daemon_p99 / floor_p99, 2)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.calls, args.rounds)), indent=2))
