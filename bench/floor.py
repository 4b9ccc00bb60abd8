"""The floor of the latency benchmarks: a bare aiohttp client that does the least the monitor does.

    python -m bench.floor --url URL --mode abort|abort-read|refuse

It runs in a process of its own, as the monitor does, opens the same `/global/event` stream,
splits it into `data:` lines and decodes each event with `json.loads`, and acts on the frame
the monitor acts on, identified by the benchmarks' own ids (the loop's 4th call ends in
`c3`), with the request the monitor sends:

- `abort` (`bench.latency`): at the 4th call's `running` update, `POST /session/ID/abort`;
- `abort-read`: the same, after `GET /session/ID/message?limit=20` as the monitor reads the
  session's newest messages before every abort (another monitor may have stopped the loop);
- `refuse` (`bench.permissions`): at each `permission.asked`, `POST /permission/ID/reply`,
  `once` for calls 1-3 and for the 4th `reject` with a message the size of the monitor's.

No tracking, no rules, no logs: what is left is reading, decoding and one HTTP request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import aiohttp

MODES = ("abort", "abort-read", "refuse")
LOOP_CALL = "c3"
# The monitor's refusal carries its feedback: 457 bytes of JSON in `bench.permissions`.
REJECT_MESSAGE = "x" * 423
RECENT_MESSAGES = 20
Request = tuple[str, str, dict[str, Any] | None]


def action(frame: dict[str, Any], mode: str) -> Request | None:
    """The request (method, path, JSON body) `frame` calls for in `mode`, or None."""
    payload = frame.get("payload", frame)
    properties = payload.get("properties", {})
    if mode == "refuse":
        request_id = properties.get("id", "")
        if payload.get("type") != "permission.asked":
            return None
        reply = "reject" if request_id.endswith(LOOP_CALL) else "once"
        body: dict[str, Any] = {"reply": reply}
        if reply == "reject":
            body["message"] = REJECT_MESSAGE
        return "POST", f"/permission/{request_id}/reply", body
    part = properties.get("part", {})
    if (
        payload.get("type") == "message.part.updated"
        and part.get("type") == "tool"
        and part.get("state", {}).get("status") == "running"
        and part.get("id", "").endswith(LOOP_CALL)
    ):
        return "POST", f"/session/{part['sessionID']}/abort", None
    return None


async def send(
    http: aiohttp.ClientSession, request: Request, query: dict[str, str], read: bool
) -> None:
    method, path, body = request
    if read:
        recent = {**query, "limit": str(RECENT_MESSAGES)}
        async with http.get(path.removesuffix("abort") + "message", params=recent) as response:
            await response.json()
    async with http.request(method, path, params=query, json=body) as response:
        await response.read()


async def follow(url: str, mode: str) -> None:
    """Read `url`'s `/global/event` until it ends, acting on each frame that calls for it."""
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=None)) as http:
        async with http.get("/global/event") as stream:
            data: list[bytes] = []
            async for line in stream.content:
                if line.startswith(b"data:"):
                    data.append(line[5:].strip())
                    continue
                if line.strip() or not data:
                    continue
                frame = json.loads(b"\n".join(data))
                data = []
                request = action(frame, mode)
                if request is None:
                    continue
                directory = frame.get("directory")
                query = {"directory": directory} if isinstance(directory, str) else {}
                # As the monitor does: the request goes out beside the stream, never blocking it.
                task = asyncio.create_task(send(http, request, query, mode == "abort-read"))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    args = parser.parse_args(argv)
    asyncio.run(follow(args.url, args.mode))


if __name__ == "__main__":
    main()
