"""Memory: what the tracker holds per session once every session has a full history.

    python -m bench.memory rss|tracemalloc [--sessions 10000] [--calls 32] [--arg-bytes 2048]
                                           [--reads]
    python -m bench.memory rss|tracemalloc --parts 4096

Fills one `Tracker` (the daemon's default settings) with `sessions` sessions, each making
`calls` different `write` calls whose arguments are about `arg-bytes` long, fed as the
decoded `running` and `completed` updates the server sends (no loop, so no history is ever
cleared); with `--reads`, `read` calls with different answers instead, the progress rules'
worst case (every call a check and a remembered call). Then it reports the growth per
session: `rss` from /proc/self/statm, what the operating system sees, including allocator
slack; `tracemalloc` the Python objects that stay allocated. Run each in a fresh process:
tracemalloc inflates the resident size.

With `--parts N` it measures text instead: N text parts streaming at once (the tracker holds
at most `MAX_STREAMING_PARTS`), each fed a few hundred deltas of different sentences and then
left in the middle of a long sentence, the most a part holds; the growth per part.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tracemalloc
from collections.abc import Callable

from monitor.config import detection_of, load_settings
from monitor.core.texts import MAX_STREAMING_PARTS
from monitor.core.tracker import Tracker

DIRECTORY = "/home/dev/project"


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tool_update(
    session: str, part: str, status: str, args: dict, tool: str = "write", output: str = ""
) -> dict:
    state: dict = {"status": status, "input": args, "time": {"start": 1795991774368}}
    if status == "completed":
        state["output"] = output or "Wrote file successfully."
    return {
        "directory": DIRECTORY,
        "project": "global",
        "payload": {
            "type": "message.part.updated",
            "properties": {
                "sessionID": session,
                "part": {
                    "id": part,
                    "messageID": f"msg_{session}",
                    "sessionID": session,
                    "type": "tool",
                    "tool": tool,
                    "callID": part,
                    "state": state,
                },
            },
        },
    }


def fill(tracker: Tracker, sessions: int, calls: int, arg_bytes: int, reads: bool = False) -> None:
    """Write calls (each a change: the progress rules keep nothing), or with `reads` read
    calls with different answers: every one a check for `no_progress` and a remembered call
    for `revisit`, their worst case."""
    filler = "x" * arg_bytes
    for s in range(sessions):
        session = f"ses_{s:08d}memorybenchAAAAAA"  # as long as a real id (30 characters)
        for c in range(calls):
            part = f"prt_{s:08d}{c:03d}memorybenchAAA"
            # A new string per call, as each decoded frame brings its own.
            path = f"{DIRECTORY}/src/module_{c}.py"
            if reads:
                args, tool, output = {"filePath": path}, "read", f"{c}\n" + filler
            else:
                args, tool, output = {"filePath": path, "content": f"{c}\n" + filler}, "write", ""
            for status in ("running", "completed"):
                if tracker.feed(tool_update(session, part, status, args, tool, output)).decisions:
                    raise AssertionError("the benchmark's calls must not loop")


def text_frames(session: str, part: str) -> tuple[dict, list[dict]]:
    """A text part's first update, and deltas: 40 different sentences, then 500 characters
    of a sentence that has not ended yet."""
    props = {"sessionID": session, "messageID": f"msg_{session}", "partID": part}
    start = {
        "type": "message.part.updated",
        "properties": {
            "sessionID": session,
            "part": {**props, "id": part, "type": "text", "text": "", "time": {"start": 1}},
        },
    }
    text = "".join(f"Sentence {n} of part {part} says something new. " for n in range(40))
    text += "and then a sentence that goes on " * 15
    deltas = [
        {"type": "message.part.delta", "properties": {**props, "field": "text", "delta": piece}}
        for piece in (text[i : i + 12] for i in range(0, len(text), 12))
    ]
    return start, deltas


def measure_parts(how: str, parts: int) -> dict:
    if parts > MAX_STREAMING_PARTS:
        raise SystemExit(f"parts must be at most {MAX_STREAMING_PARTS}")
    settings = load_settings({"url": "http://unused"}, {}, isatty=False)
    tracker = Tracker(detection_of(settings))
    frames = [
        text_frames(f"ses_{p:08d}memorybenchAAAAAA", f"prt_{p:08d}memorybenchAAAA")
        for p in range(parts)
    ]
    gc.collect()
    size: Callable[[], int] = resident_bytes
    if how == "tracemalloc":
        tracemalloc.start()

        def size() -> int:
            return tracemalloc.get_traced_memory()[0]

    before = size()
    for start, deltas in frames:
        tracker.feed(start)
        for frame in deltas:
            if tracker.feed(frame).decisions:
                raise AssertionError("the benchmark's text must not loop")
    gc.collect()
    grown = size() - before
    return {"how": how, "parts": parts, "bytes_per_part": grown / parts}


def measure(how: str, sessions: int, calls: int, arg_bytes: int, reads: bool = False) -> dict:
    settings = load_settings({"url": "http://unused"}, {}, isatty=False)
    tracker = Tracker(detection_of(settings))
    fill(tracker, 1, calls, arg_bytes)  # warm up code paths and interned names
    tracker.forget("ses_00000000memorybenchAAAAAA")
    if calls > tracker.detection.history:
        raise SystemExit(f"calls must be at most the history ({tracker.detection.history})")
    gc.collect()
    size: Callable[[], int]
    if how == "tracemalloc":
        tracemalloc.start()

        def size() -> int:
            return tracemalloc.get_traced_memory()[0]
    else:
        size = resident_bytes
    before = size()
    fill(tracker, sessions, calls, arg_bytes, reads)
    gc.collect()
    grown = size() - before
    tracked = tracker.active_sessions
    full = all(tracker.history_length(sid) == calls for sid in tracker.running())
    if tracked != sessions or not full:
        raise SystemExit(f"expected {sessions} full histories, found {tracked} (full: {full})")
    return {
        "how": how,
        "sessions": sessions,
        "calls": calls,
        "reads": reads,
        "bytes_per_session": grown / sessions,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument("how", choices=("rss", "tracemalloc"))
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--arg-bytes", type=int, default=2048)
    parser.add_argument("--parts", type=int, default=0)
    parser.add_argument(
        "--reads", action="store_true", help="read calls with different answers (see fill)"
    )
    args = parser.parse_args(argv)
    if args.parts:
        print(json.dumps(measure_parts(args.how, args.parts)))
    else:
        measured = measure(args.how, args.sessions, args.calls, args.arg_bytes, args.reads)
        print(json.dumps(measured))


if __name__ == "__main__":
    main()
