"""Issue 31's compaction against the real `opencode serve` 1.18.33: a loop that goes on across
a compaction is one loop, caught on the same call as without it; a new task after it is not.

The scripted model's step that makes the 2nd call reports a usage far past the model's
context limit (`compact_after`), so the server compacts the session after that call, in the
middle of the run: its request for a summary, the summary, a synthetic "continue" message,
`session.compacted`, and the run goes on with no idle between (docs/detection.md,
"Compaction"). The loop's 3rd and 4th calls come after it."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.kit.poll import until
from monitor.kit.sandbox import OpencodeServer, opencode_config, tool_parts
from monitor.kit.scripted_model import script
from tests.frames_factory import READ
from tests.harness import MODEL_DELAY, STATUS_FLAGS, seen_through, start_watching

pytestmark = pytest.mark.real_server

READ_CALL = ("read", READ)


def small_context(model_url: str) -> dict[str, Any]:
    """The sandbox's provider, its model given a context limit the scripted usage passes."""
    provider = opencode_config(model_url)["provider"]
    provider["fake"]["models"]["looper"]["limit"] = {"context": 10000, "output": 1000}
    return {"provider": provider}


def summaries(messages: list[dict[str, Any]]) -> list[int]:
    """The positions of the compaction summaries among the session's tool parts: how many
    calls ran before each."""
    found, calls = [], 0
    for message in messages:
        if message["info"].get("summary") is True:
            found.append(calls)
        calls += sum(part.get("type") == "tool" for part in message["parts"])
    return found


async def test_a_loop_across_a_compaction_is_caught_at_its_fourth_call(
    opencode_bin, scripted_model, start_monitor, http
):
    config = small_context(scripted_model.url)
    async with OpencodeServer(opencode_bin, scripted_model.url, config=config) as server:
        monitor = await start_watching(start_monitor, server)
        client = server.client(http)
        session = await client.create_session("compacted loop")
        prompt = script([READ_CALL], 12, delay=MODEL_DELAY, compact_after=2)
        await client.prompt_async(session["id"], prompt)
        [detected] = await monitor.wait_event("loop.detected", timeout=90)
        [outcome] = await monitor.wait_event("intervention.outcome", timeout=60)
        # The prompt, the compaction's two messages, the feedback.
        messages = await client.wait_idle(session["id"], 90, user_messages=4)

    parts = tool_parts(messages)
    assert summaries(messages) == [2]  # compacted between the 2nd and the 3rd call
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "cycle",
        4,
        parts[3]["id"],
    )
    assert (outcome["outcome"], outcome["call_index"]) == ("aborted", 4)
    assert len(monitor.events("intervention.outcome")) == 1
    assert len(parts) == 4  # nothing ran after the 4th call


async def test_attached_after_a_compaction_counts_the_calls_before_it(
    opencode_bin, scripted_model, start_monitor, http
):
    config = small_context(scripted_model.url)
    async with OpencodeServer(opencode_bin, scripted_model.url, config=config) as server:
        client = server.client(http)
        session = await client.create_session("attached after compaction")
        prompt = script([READ_CALL], 20, delay=1.0, compact_after=2)
        await client.prompt_async(session["id"], prompt)

        async def compacted() -> list[dict[str, Any]] | None:
            messages = await client.messages(session["id"])
            return messages if summaries(messages) == [2] else None

        await until(compacted, 90, what="the compaction")
        monitor = start_monitor(
            "attach", session["id"], "--url", server.url, "--log-format", "json"
        )
        [seeded] = await monitor.wait_event("session.seeded")
        # The run read back is the whole run: the two calls before the compaction count.
        assert seeded["calls"] >= 2
        [outcome] = await monitor.wait_event("intervention.outcome", timeout=90)
        messages = await client.wait_idle(session["id"], 90, user_messages=4)

    parts = tool_parts(messages)
    assert (outcome["outcome"], outcome["call_index"], outcome["part_id"]) == (
        "aborted",
        4,
        parts[3]["id"],
    )


async def test_a_new_task_after_a_compaction_is_a_new_run(
    opencode_bin, scripted_model, start_monitor, http
):
    config = small_context(scripted_model.url)
    async with OpencodeServer(opencode_bin, scripted_model.url, config=config) as server:
        monitor = await start_watching(start_monitor, server, *STATUS_FLAGS)
        client = server.client(http)
        session = await client.create_session("task after compaction")
        await client.prompt_async(session["id"], script([READ_CALL], 3, compact_after=2))
        first = await client.wait_idle(session["id"], 90, user_messages=3)
        assert summaries(first) == [2] and len(tool_parts(first)) == 3
        # The same three reads again, asked for by a person: a run of its own.
        await client.prompt_async(session["id"], script([READ_CALL], 3, answer="Read again."))
        messages = await client.wait_idle(session["id"], 90, user_messages=4)
        await seen_through(monitor, server, http)

    assert len(tool_parts(messages)) == 6
    assert monitor.events("loop.detected") == []
