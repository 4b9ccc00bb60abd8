"""Issue 31's workspace signal against the real `opencode serve` 1.18.33: the server's own
snapshot of the project at each step tells an edit/revert loop from progress.

The scripted model edits `x = 1` to `x = 2` with the `edit` tool, runs the check, puts the
file back with a script (`python3 revert.py`: no argument says it writes), runs the check
again, round after round; the check prints the same failure every time. By the calls'
arguments only every other check follows a change (the edit), so they would count the 5th
stall at call 18; the steps' snapshots show the workspace going back and forth between the
same two states, and `no_progress` stops the run at the check's 5th run (call 10), before
`cycle` would (call 12). The test reads the same stream as the monitor and replays it without
the snapshots: then nothing is caught in those 10 calls, so the decision came from the
server's measure. The
same measure on the new engine (`/api` sessions) stops a script that flips x.py by no sign in
its command."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from monitor.core.tracker import Detection, Tracker
from monitor.kit.poll import until
from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, Engine, start_watching, user_texts

pytestmark = pytest.mark.real_server

FAILURE = "FAILED check_total: expected 3, got 2"
CHECK = ("bash", {"command": "python3 check.py", "description": "Run the check"})
EDIT = ("edit", {"filePath": "x.py", "oldString": "x = 1", "newString": "x = 2"})
REVERT = ("bash", {"command": "python3 revert.py", "description": "Put x.py back"})
REVERT_PY = "open('x.py', 'w').write('x = 1\\n')\n"


async def read_stream(url: str, frames: list[dict[str, Any]], connected: asyncio.Event) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(f"{url}/event") as r:
        async for line in r.content:
            if line.startswith(b"data: "):
                frames.append(json.loads(line[6:]))
                connected.set()


def without_snapshots(frame: dict[str, Any]) -> dict[str, Any]:
    part = frame.get("properties", {}).get("part")
    if isinstance(part, dict) and "snapshot" in part:
        part = {key: value for key, value in part.items() if key != "snapshot"}
        return {**frame, "properties": {**frame["properties"], "part": part}}
    return frame


def first_decision(frames: list[dict[str, Any]]) -> tuple[str, int] | None:
    tracker = Tracker(Detection())
    for frame in frames:
        for decision in tracker.feed(frame).decisions:
            return decision.rule, decision.call_index
    return None


def finished_calls(frames: list[dict[str, Any]]) -> int:
    return sum(
        1
        for f in frames
        if f.get("type") == "message.part.updated"
        and f["properties"]["part"].get("type") == "tool"
        and f["properties"]["part"]["state"]["status"] in ("completed", "error")
    )


async def test_an_edit_revert_loop_is_stopped_by_the_servers_snapshots_at_the_10th_call(
    opencode_server, start_monitor, http
):
    project = opencode_server.project
    (project / "x.py").write_text("x = 1\n")
    (project / "check.py").write_text(f"import sys\nprint({FAILURE!r})\nsys.exit(1)\n")
    (project / "revert.py").write_text(REVERT_PY)
    frames: list[dict[str, Any]] = []
    connected = asyncio.Event()
    reader = asyncio.create_task(read_stream(opencode_server.url, frames, connected))
    try:
        await asyncio.wait_for(connected.wait(), 30)
        monitor = await start_watching(start_monitor, opencode_server)
        client = opencode_server.client(http)
        session = await client.create_session("edit-revert")
        pattern = [EDIT, CHECK, REVERT, CHECK] * 4
        await client.prompt_async(session["id"], script(pattern, 16, delay=MODEL_DELAY))
        messages = await client.wait_idle(session["id"], 120, user_messages=2)
        await until(lambda: finished_calls(frames) >= 10, 30, what="the 10th call on our stream")
    finally:
        reader.cancel()

    parts = tool_parts(messages)
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "no_progress",
        10,
        parts[9]["id"],
    )
    assert detected["finding"] == "the same result from bash 5 times, with 4 changes in between"
    [outcome] = monitor.events("intervention.outcome")
    assert outcome["session_id"] == session["id"]
    assert len(parts) == 10 and (project / "x.py").read_text() == "x = 2\n"
    assert [p["state"]["output"] for p in parts[1::2]] == [f"{FAILURE}\n"] * 5
    assert len(user_texts(messages)) == 2

    # Every step of the run carried the workspace's snapshot: two states, back and forth.
    steps = [
        f["properties"]["part"]
        for f in frames
        if f.get("type") == "message.part.updated"
        and f["properties"]["part"].get("sessionID") == session["id"]
        and f["properties"]["part"].get("type") in ("step-start", "step-finish")
    ]
    assert steps and all(len(p["snapshot"]) == 40 for p in steps)
    assert len({p["snapshot"] for p in steps}) == 2
    # The stream replayed: the same decision; without the snapshots, none in these 10 calls.
    assert first_decision(frames) == ("no_progress", 10)
    assert first_decision([without_snapshots(f) for f in frames]) is None


def flip(attempt: int) -> tuple[str, dict[str, Any]]:
    """A script that writes x.py by no sign in its command (to the arguments, a check too),
    run with another option each time (so the calls form no cycle)."""
    return ("bash", {"command": f"python3 flip.py --attempt {attempt}", "description": "Flip"})


FLIP_SCRIPT = """\
x = 2 if open("x.py").read() == "x = 1\\n" else 1
open("x.py", "w").write(f"x = {x}\\n")
print(f"now x = {x}")
"""


async def test_the_new_engines_snapshots_stop_a_flip_that_no_command_shows(
    opencode_server, start_monitor, http
):
    """The same measure on 1.18.33's `/api` engine (`session.next.step.started`'s
    `snapshot`): a script that switches x.py between two states, the check after each run.
    By the commands nothing changes (plain reruns: no rule would fire); by the snapshots the
    check answers the same in states it already answered in."""
    project = opencode_server.project
    (project / "x.py").write_text("x = 1\n")
    (project / "flip.py").write_text(FLIP_SCRIPT)
    (project / "check.py").write_text(f"import sys\nprint({FAILURE!r})\nsys.exit(1)\n")
    monitor = await start_watching(start_monitor, opencode_server)
    engine = Engine(opencode_server, http)
    session = await engine.create_session()
    await engine.prompt(
        session, script([c for i in range(8) for c in (flip(i), CHECK)], 16, delay=MODEL_DELAY)
    )
    messages = await engine.wait_answered(session, 120, user_messages=2)

    parts = tool_parts(messages)
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "no_progress",
        10,
        parts[9]["id"],
    )
    # the new engine's record adds the exit status on a line of its own
    assert [p["state"]["output"].splitlines()[0] for p in parts[:4]] == [
        "now x = 2",
        FAILURE,
        "now x = 1",
        FAILURE,
    ]
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["outcome"]) == (session, "aborted")
    assert 10 <= len(parts) <= 11
