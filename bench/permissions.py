"""Permission answers: from the server writing `permission.asked` to the monitor's reply arriving.

    python -m bench.permissions [--loops 300] [--interval 0.01]

As `bench.latency`, this process is the server and the monitor runs as an operator runs it
(`python -m monitor watch --permissions approve`), in a process of its own. Every loop is a
new session whose calls ask permission the way `opencode serve` with `"permission": {"*":
"ask"}` does (frames shaped like the recording `permission-gate`): the `running` update of a
`bash` call, then its `permission.asked`; calls 1-3 are approved by the monitor, call 4
completes the loop and is refused. The time of each `permission.asked` is taken just before
it is written, the reply's when its handler starts, both on this process's event loop clock.
The first `--warmup` loops are not counted. `--client floor` runs `bench.floor --mode
refuse` instead of the monitor: it answers the same requests the same way.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from contextlib import suppress

from bench.harness import arrivals, main_of_loops, percentile, watched
from monitor.kit.poll import until
from monitor.testing import FakeOpencode

CALLS = 4
DIRECTORY = "/bench/project"
INPUT = {"command": "echo again >> loop.txt", "description": "append a line"}


def _frame(event_type: str, properties: dict) -> bytes:
    envelope = {"directory": DIRECTORY, "payload": {"type": event_type, "properties": properties}}
    return f"data: {json.dumps(envelope)}\n\n".encode()


def _part(session: str, index: int, call: int, status: str) -> bytes:
    state: dict = {"status": status, "input": INPUT, "time": {"start": 1}}
    if status == "completed":
        state["output"] = ""
    part = {
        "id": f"prt_b{index:06d}c{call}",
        "sessionID": session,
        "messageID": f"msg_b{index:06d}c{call}",
        "type": "tool",
        "tool": "bash",
        "callID": f"call_{call}",
        "state": state,
    }
    return _frame("message.part.updated", {"sessionID": session, "part": part})


def request_id(index: int, call: int) -> str:
    return f"per_b{index:06d}c{call}"


def _asked(session: str, index: int, call: int) -> bytes:
    return _frame(
        "permission.asked",
        {
            "id": request_id(index, call),
            "sessionID": session,
            "permission": "bash",
            "patterns": [INPUT["command"]],
            "metadata": {},
            "always": ["echo *"],
            "tool": {"messageID": f"msg_b{index:06d}c{call}", "callID": f"call_{call}"},
        },
    )


def _replied(session: str, index: int, call: int) -> bytes:
    props = {"sessionID": session, "requestID": request_id(index, call), "reply": "once"}
    return _frame("permission.replied", props)


async def play(server: FakeOpencode, loops: int, interval: float) -> dict[str, float]:
    """Stream `loops` sessions, one every `interval` s; when each `permission.asked` went out."""
    clock = asyncio.get_running_loop().time
    written: dict[str, float] = {}
    started = clock()
    for index in range(loops):
        session = f"ses_b{index:06d}"
        for call in range(CALLS):
            await server.push(_part(session, index, call, "running"))
            written[request_id(index, call)] = clock()
            await server.push(_asked(session, index, call))
            if call < CALLS - 1:
                # Its approval is the monitor's to give; the call then runs and ends.
                await server.push(_replied(session, index, call))
                await server.push(_part(session, index, call, "completed"))
        await asyncio.sleep(max(0.0, started + (index + 1) * interval - clock()))
    return written


async def measure(loops: int, warmup: int, interval: float, client: str = "monitor") -> dict:
    server = FakeOpencode()
    floor = "refuse" if client != "monitor" else None
    async with watched(server, "--permissions", "approve", floor=floor) as monitor:
        written = await play(server, warmup + loops, interval)
        with suppress(TimeoutError):
            await until(
                lambda: len(arrivals(server, "reply")) >= (warmup + loops) * CALLS,
                5,
                what="every reply",
            )
    detected = monitor.log.count('"loop.detected"')
    replies = arrivals(server, "reply")
    approvals, refusals = [], []
    loop_calls_approved = 0
    body_bytes = 0
    for index in range(warmup, warmup + loops):
        for call in range(CALLS):
            answers = replies.get(request_id(index, call), [])
            if not answers:
                continue
            reply = answers[0]
            assert isinstance(reply.body, dict)
            took = (reply.at - written[request_id(index, call)]) * 1000
            if call == CALLS - 1:
                loop_calls_approved += reply.body["reply"] != "reject"
                refusals.append(took)
                body_bytes = len(json.dumps(reply.body))
            else:
                approvals.append(took)
    everything = approvals + refusals
    return {
        "loops": loops,
        "refused": len(refusals),
        "approved": len(approvals),
        "loop_calls_approved": loop_calls_approved,
        "logged": detected,
        "refusal_body_bytes": body_bytes,
        "refusal_p50_ms": statistics.median(refusals),
        "refusal_p99_ms": percentile(refusals, 99),
        "approval_p50_ms": statistics.median(approvals),
        "approval_p99_ms": percentile(approvals, 99),
        "p99_ms": percentile(everything, 99),
        "max_ms": max(everything),
    }


def main(argv: list[str] | None = None) -> None:
    main_of_loops("python -m bench.permissions", measure, 300, 30, 0.01, argv)


if __name__ == "__main__":
    main()
