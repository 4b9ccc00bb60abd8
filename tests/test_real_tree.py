"""Issue 31's subagent tree rule against the real `opencode serve` 1.18.33: a subagent that
hands its task on to another subagent, again and again (anomalyco/opencode #18100, #25681).

1.18.33 limits nesting itself (`subagent_depth`, 1 by default: "Subagent depth limit reached
(1)"), and only agents allowed the `task` tool nest at all; a person who raises the limit
for an agent of their own gets the runaway the reports show. Here a `recurser` agent with
`subagent_depth` 10 is scripted six levels deep: the monitor stops the tree at its root when
the fourth level appears (`tree_depth` 3), once for the whole tree."""

from __future__ import annotations

import aiohttp
import pytest

from monitor.kit.sandbox import OpencodeServer
from monitor.kit.scripted_model import script
from tests.harness import STATUS_FLAGS, seen_through, start_watching, user_texts

pytestmark = pytest.mark.real_server

RECURSER = {
    "subagent_depth": 10,
    "agent": {
        "recurser": {
            "description": "Hands the task on to another recurser",
            "mode": "subagent",
            "permission": {"task": "allow"},
            "tools": {"task": True},
        }
    },
}


def chain(depth: int) -> str:
    """A script whose subagent runs a script whose subagent ..., `depth` levels down."""
    inner = script([("read", {"filePath": "README.md"})], 1)
    for level in range(depth, 0, -1):
        args = {"description": f"level {level}", "prompt": inner, "subagent_type": "recurser"}
        # A subagent's conversation holds more than its prompt ("loop" runs the pattern all
        # the same); the root's answers the monitor's feedback.
        inner = script(
            [("task", args)], 1, delay=0.3, after_feedback="loop" if level > 1 else "answer"
        )
    return inner


async def sessions_of(server: OpencodeServer, http: aiohttp.ClientSession) -> list[dict]:
    async with http.get(f"{server.url}/session", params={"directory": server.directory}) as r:
        return list(await r.json())


async def test_a_subagent_recursion_is_stopped_at_its_root_once_at_the_fourth_level(
    opencode_bin, scripted_model, start_monitor, http
):
    async with OpencodeServer(opencode_bin, scripted_model.url, config=RECURSER) as server:
        monitor = await start_watching(start_monitor, server)
        client = server.client(http)
        root = await client.create_session("tree")
        await client.prompt_async(root["id"], chain(6))
        [detected] = await monitor.wait_event("loop.detected", timeout=90)
        await monitor.wait_event("intervention.outcome", timeout=60)
        messages = await client.wait_idle(root["id"], 90, user_messages=2)

        sessions = await sessions_of(server, http)
        parent = {s["id"]: s.get("parentID") for s in sessions}

        def depth(session_id: str) -> int:
            n = 0
            while parent.get(session_id):
                session_id, n = parent[session_id], n + 1
            return n

        tripped = detected["part_id"]  # the tree rule names the child that tripped it
        assert (detected["rule"], detected["session_id"], depth(tripped)) == (
            "tree",
            root["id"],
            4,
        )
        assert [d["session_id"] for d in monitor.events("loop.detected")] == [root["id"]]
        [outcome] = monitor.events("intervention.outcome")
        assert (outcome["outcome"], outcome["session_id"]) == ("aborted", root["id"])
        # The abort of the root ends the whole tree: no fifth or sixth level was made.
        assert max(depth(session_id) for session_id in parent) == 4
        assert "depth 4" in user_texts(messages)[1]


def child(n: int) -> str:
    return script([("read", {"filePath": "README.md"})], 1, delay=3.0, answer=f"Part {n} done.")


async def test_a_fan_out_stopped_at_the_21st_child_is_one_intervention_not_two(
    opencode_bin, scripted_model, start_monitor, http
):
    """Issue 43: 25 subagents asked in one step, the tree stopped at the 21st child. The abort
    cancels every `task` call, some started after the decision: their ends ("Task cancelled",
    "Tool execution aborted") are the abort's doing, not a failure loop of the model's.

    Seen here (1.18.33, 2 cores): each task `pending`, its child created, then `running`, so
    tasks 21 to 25 start after the decision; the 25 ends came after the root's idle (late),
    which the daemon never counted. Where they come before it ("Task cancelled", the report's
    3 runs of 4) only tests/test_abort_aftermath.py replays that order, deterministically."""
    # Distinct prompts: the profile leaves a task's `description` out of its identity.
    tasks = [
        ("task", {"description": f"part {n}", "prompt": child(n), "subagent_type": "general"})
        for n in range(1, 26)
    ]
    async with OpencodeServer(opencode_bin, scripted_model.url) as server:
        monitor = await start_watching(start_monitor, server, *STATUS_FLAGS)
        client = server.client(http)
        root = await client.create_session("fan-out")
        await client.prompt_async(root["id"], script(tasks, 25, parallel=25))
        [detected] = await monitor.wait_event("loop.detected", timeout=90)
        await monitor.wait_event("intervention.outcome", timeout=60)
        messages = await client.wait_idle(root["id"], 90, user_messages=2)
        await seen_through(monitor, server, http)

        assert (detected["rule"], detected["session_id"]) == ("tree", root["id"])
        [outcome] = monitor.events("intervention.outcome")
        assert (outcome["outcome"], outcome["interventions"]) == ("aborted", 1)
        # Every task call ended in error, the abort's; none of them is a loop of its own.
        ends = [
            part["state"]
            for message in messages
            for part in message["parts"]
            if part.get("type") == "tool" and part.get("tool") == "task"
        ]
        assert len(ends) == 25 and {state["status"] for state in ends} == {"error"}
        assert [d["rule"] for d in monitor.events("loop.detected")] == ["tree"]
