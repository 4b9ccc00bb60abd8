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


async def summarize(http: Any, server: OpencodeServer, session_id: str) -> None:
    """What `/compact` does: `POST /session/{id}/summarize` with the session's model."""
    url = f"{server.url}/session/{session_id}/summarize"
    body = {"providerID": "fake", "modelID": "looper"}
    params = {"directory": server.directory}
    async with http.post(url, json=body, params=params, headers=server.headers) as response:
        assert response.status == 200, await response.text()


async def summarized(client: Any, session_id: str) -> list[dict[str, Any]] | None:
    """The session's messages once a summary is written and the session is idle."""
    if session_id in await client.status():
        return None
    messages = await client.messages(session_id)
    done = [m for m in messages if m["info"].get("summary") is True and m["info"].get("finish")]
    return messages if done else None


async def test_a_summarize_in_the_middle_of_a_loop_changes_nothing_about_its_call(
    opencode_bin, scripted_model, start_monitor, http
):
    """Issue 44: three identical reads, a person's `/summarize` while the run goes on (the
    run ends), then "Please continue with the task.": the loop is caught at its 4th call,
    the new run's first, as without the summarize (it was the new run's 4th before)."""
    async with OpencodeServer(opencode_bin, scripted_model.url) as server:
        monitor = await start_watching(start_monitor, server)
        client = server.client(http)
        session = await client.create_session("summarized loop")
        # The summary the model writes is the script (`compact_after`: 3 calls before it),
        # so it goes on with the reads after "continue"; a step takes 2 s, time to ask.
        prompt = script([READ_CALL], 12, delay=2.0, compact_after=3)
        await client.prompt_async(session["id"], prompt)

        async def three_reads() -> bool:
            parts = tool_parts(await client.messages(session["id"]))
            return len(parts) == 3 and all(p["state"]["status"] == "completed" for p in parts)

        await until(three_reads, 60, what="three reads")
        await summarize(http, server, session["id"])
        before = await until(lambda: summarized(client, session["id"]), 60, what="the summary")
        assert len(tool_parts(before)) == 3
        await client.prompt_async(session["id"], "Please continue with the task.")
        [detected] = await monitor.wait_event("loop.detected", timeout=90)
        messages = await client.wait_idle(session["id"], 90, user_messages=4)

    parts = tool_parts(messages)
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "cycle",
        4,
        parts[3]["id"],
    )


async def test_a_summarize_between_a_stopped_loop_and_its_relapse_changes_nothing(
    opencode_bin, scripted_model, start_monitor, http
):
    """Issue 44: a loop stopped at its 4th call stays armed for the next run; a person
    compacting the idle session in between uses that run up no more: the same reads asked
    for again are stopped at the first (they ran 3 times before the refusal). Held (`--on-loop
    hold`), so that the next run is the person's, not the feedback's."""
    async with OpencodeServer(opencode_bin, scripted_model.url) as server:
        monitor = await start_watching(start_monitor, server, "--on-loop", "hold")
        client = server.client(http)
        session = await client.create_session("summarized relapse")
        # `compact_after` only so that the summary the model writes is a script.
        prompt = script([READ_CALL], 8, delay=MODEL_DELAY, compact_after=8)
        await client.prompt_async(session["id"], prompt)
        [stopped] = await monitor.wait_event("intervention.outcome", timeout=90)
        await monitor.wait_event("feedback.sent", timeout=60)
        first = await until(lambda: summarized_or_idle(client, session["id"]), 60, what="idle")
        await summarize(http, server, session["id"])
        await until(lambda: summarized(client, session["id"]), 60, what="the summary")
        again = script([READ_CALL], 6, delay=MODEL_DELAY, answer="Read again.")
        await client.prompt_async(session["id"], again)
        detected = await monitor.wait_event("loop.detected", count=2, timeout=90)
        await monitor.wait_event("intervention.outcome", count=2, timeout=90)
        messages = await client.messages(session["id"])

    assert (stopped["outcome"], stopped["call_index"]) == ("held", 4)
    assert len(tool_parts(first)) == 4
    # The relapse is that loop again at its first read, the session's 5th call, in the run
    # after the compaction; nothing of it ran.
    parts = tool_parts(messages)
    assert (detected[1]["rule"], detected[1]["call_index"], detected[1]["part_id"]) == (
        "cycle",
        5,
        parts[4]["id"],
    )
    assert len(parts) == 5


async def summarized_or_idle(client: Any, session_id: str) -> list[dict[str, Any]] | None:
    """The session's messages once it is idle."""
    if session_id in await client.status():
        return None
    return await client.messages(session_id)
