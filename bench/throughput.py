"""Throughput: frames per second read from a local server that streams as fast as it can.

Two commands, each its own process so the server and the reader never share a core:

    python -m bench.throughput serve FRAMES [--corpus tools|text]  # prints its URL, streams
    python -m bench.throughput read READER URL   # reads one stream, prints one JSON line

Readers, from least to most work per frame:

- `baseline`: aiohttp line reading and `json.loads` of each event's data, nothing else;
- `sse-client`: aiohttp-sse-client's EventSource and `json.loads` of each event's data;
- `watch`: the whole daemon, `Watch` in dry-run mode (EventStream, decoding, tracker,
  decisions logged rather than acted on).

Every reader times from the response headers to the end of the stream, and checks that it
saw what the server sent (the frame count, or for `watch` the number of loops decided).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib.util
import io
import json
import os
import pstats
import signal
import sys
import time
from collections.abc import Callable

import aiohttp
import structlog
from aiohttp import web

from bench.corpus import CORPORA, frame_data, sse_bytes
from monitor.config import Settings, detection_of, load_settings
from monitor.core.decisions import Outcome, Plan
from monitor.core.tracker import Tracker
from monitor.shell.notify import Notifier
from monitor.shell.stream import READ_BUFSIZE
from monitor.shell.watch import Watch

CHUNK = 256 * 1024
# The sse-client reader is a reference, measured while the library is installed.
HAS_SSE_CLIENT = importlib.util.find_spec("aiohttp_sse_client") is not None
READERS = ("baseline", "sse-client", "watch") if HAS_SSE_CLIENT else ("baseline", "watch")


def bench_settings(url: str, dry_run: bool = True) -> Settings:
    """The daemon's defaults, as `watch --url URL [--dry-run]` resolves them."""
    return load_settings({"url": url, "dry_run": dry_run}, {}, isatty=False)


# -- the server --------------------------------------------------------------------------


def _interventions(data: list[str], reported: bool) -> int:
    """The interventions a dry-run daemon logs on `data`; `reported`: each one's outcome comes
    back before the next frame."""
    tracker = Tracker(detection_of(bench_settings("http://unused")))
    made = 0
    for item in data:
        for decision in tracker.feed_data(item).decisions:
            if decision.plan != Plan.DEFER:
                made += 1
                if reported:
                    tracker.outcome(decision, Outcome.DRY_RUN)
    return made


def serve(count: int, corpus_name: str = "tools") -> None:
    data = frame_data(count, *CORPORA[corpus_name])
    payload = sse_bytes(data)
    # What the daemon should decide on these frames, for the `watch` reader to check against:
    # a loop's later calls are the same intervention while it is under way (`loop.again`,
    # not `loop.detected`), and the dry run reports each one carried out in a task of its
    # own, so the count lies between every outcome coming at once and none coming.
    info = {
        "frames": len(data),
        "bytes": len(payload),
        "decisions": [_interventions(data, reported) for reported in (False, True)],
    }

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        view = memoryview(payload)
        for start in range(0, len(payload), CHUNK):
            await response.write(view[start : start + CHUNK])
        await response.write_eof()
        return response

    async def corpus(request: web.Request) -> web.Response:
        return web.json_response(info)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"healthy": True})

    app = web.Application()
    app.router.add_get("/global/event", stream)
    app.router.add_get("/event", stream)

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"version": "2.2.5", "pid": os.getpid(), "urls": []})

    if corpus_name == "engine":
        # A server of the new engine's API only: `watch` finds it so and reads `/api/event`.
        app.router.add_get("/api/event", stream)
        app.router.add_get("/api/health", health)
    if corpus_name == "v2":
        # OpenCode 2.2.5: `/api/info` says so, and `/api/event` is read.
        app.router.add_get("/api/event", stream)
        app.router.add_get("/api/info", server_info)
    app.router.add_get("/corpus", corpus)

    async def serve_forever() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve_forever())


# -- the readers --------------------------------------------------------------------------


class Timer:
    """Wall time, and this process's CPU time: the CPU time is what other load on the
    machine disturbs least, so both are reported."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def result(self, **fields: int) -> dict:
        return {
            **fields,
            "seconds": time.perf_counter() - self.wall,
            "cpu_seconds": time.process_time() - self.cpu,
        }


def http_client() -> aiohttp.ClientSession:
    # The daemon's own buffer size for every reader, so they differ only in parsing.
    return aiohttp.ClientSession(read_bufsize=READ_BUFSIZE)


async def read_baseline(url: str) -> dict:
    async with http_client() as http:
        async with http.get(url + "/global/event", headers={"Accept": "text/event-stream"}) as r:
            timer = Timer()
            frames = 0
            data: list[bytes] = []
            async for line in r.content:
                if line.startswith(b"data:"):
                    data.append(line[5:].strip())
                elif line in (b"\n", b"\r\n") and data:
                    json.loads(b"\n".join(data))
                    data.clear()
                    frames += 1
            return timer.result(frames=frames)


class _End(Exception):
    pass


async def read_sse_client(url: str) -> dict:
    from aiohttp_sse_client.client import READY_STATE_CONNECTING, EventSource

    holder: list[EventSource] = []

    def on_error() -> None:
        # After a clean end the library would wait and reconnect: stop it here instead.
        if holder and holder[0].ready_state == READY_STATE_CONNECTING:
            raise _End

    frames = 0
    async with http_client() as http:
        source = EventSource(
            url + "/global/event", session=http, max_connect_retry=0, on_error=on_error
        )
        holder.append(source)
        try:
            async with source:
                timer = Timer()
                async for event in source:
                    json.loads(event.data)
                    frames += 1
        except _End:
            pass
    return timer.result(frames=frames)


class _Clock(Notifier):
    """Notes when the stream connects and when it ends, through the daemon's status lines."""

    __slots__ = ("on_status",)

    def __init__(self, on_status: Callable[[str], None]) -> None:
        super().__init__(None)
        self.on_status = on_status

    def status(self, text: str) -> None:
        self.on_status(text)


def _count_loops(counter: list[int]) -> structlog.typing.Processor:
    def processor(logger: object, method: str, event: dict) -> dict:
        if event.get("event") == "loop.detected":
            counter[0] += 1
        raise structlog.DropEvent

    return processor


async def read_watch(url: str) -> dict:
    loops = [0]
    structlog.configure(
        processors=[_count_loops(loops)],
        wrapper_class=structlog.make_filtering_bound_logger(0),
        cache_logger_on_first_use=False,
    )
    timers: list[Timer] = []
    result: dict = {}
    reasons: list[str] = []

    def on_status(text: str) -> None:
        if text == "streaming events":
            timers.append(Timer())
        elif text.startswith("reconnecting: "):
            result.update(timers[0].result())
            reasons.append(text.removeprefix("reconnecting: "))
            # The daemon's own way to stop: as an operator would, with SIGTERM.
            signal.raise_signal(signal.SIGTERM)

    watch = Watch(bench_settings(url), notifier=_Clock(on_status))
    await watch.run()
    if reasons != ["stream ended"]:
        raise SystemExit(f"watch reader: stream did not end cleanly: {reasons}")
    # Counted after the run: a decision is logged by its own task, after the frame.
    return {**result, "loops": loops[0]}


READ = {"baseline": read_baseline, "sse-client": read_sse_client, "watch": read_watch}


def corpus_info(url: str) -> dict:
    """What the server streams (`GET /corpus`), fetched before timing anything."""

    async def fetch() -> dict:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/corpus") as response:
                return await response.json()

    return asyncio.run(fetch())


def read(reader: str, url: str, profile: bool = False) -> dict:
    info = corpus_info(url)
    if not profile:
        result = asyncio.run(READ[reader](url))
    else:
        profiler = cProfile.Profile()
        result = profiler.runcall(asyncio.run, READ[reader](url))
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        result["profile"] = out.getvalue()
    frames = result.setdefault("frames", info["frames"])
    fewest, most = info["decisions"]
    if frames != info["frames"] or not fewest <= result.get("loops", fewest) <= most:
        raise SystemExit(f"{reader} reader: read {result}, server sent {info}")
    result["fps"] = frames / result["seconds"]
    result["cpu_fps"] = frames / result["cpu_seconds"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve")
    serve_parser.add_argument("frames", type=int)
    serve_parser.add_argument("--corpus", choices=tuple(CORPORA), default="tools")
    read_parser = commands.add_parser("read")
    read_parser.add_argument("reader", choices=READERS)
    read_parser.add_argument("url")
    read_parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.frames, args.corpus)
    else:
        json.dump(read(args.reader, args.url, args.profile), sys.stdout)
        print()


if __name__ == "__main__":
    main()
