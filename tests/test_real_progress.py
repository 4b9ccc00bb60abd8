"""The progress rules and budgets against the real `opencode serve`, with the live monitor:
an edit/rerun loop whose check never changes stopped by `no_progress`, a test-edit-test run
whose output changes left alone, a long paging cycle stopped by `revisit`, a narrated run
left alone by `text_steps`, and a run stopped at its step budget."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching, user_texts

pytestmark = pytest.mark.real_server

CHECK = "FAILED check_total: expected 3, got 2"


def bash(command: str) -> tuple[str, dict[str, Any]]:
    return ("bash", {"command": command, "description": "Run a step"})


async def run(opencode_server, http, title: str, pattern, *, say: str = "", users: int = 1):
    """The session's messages once the scripted run (and the feedback's, if any) is over."""
    client = opencode_server.client(http)
    session = await client.create_session(title)
    prompt = script(pattern, len(pattern), delay=MODEL_DELAY, say=say)
    await client.prompt_async(session["id"], prompt)
    return await client.wait_idle(session["id"], 120, user_messages=users)


def outputs(messages: list[dict]) -> list[str]:
    return [p["state"].get("output") for p in tool_parts(messages)]


async def test_an_edit_rerun_loop_with_the_same_result_is_stopped_at_the_5th_run(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    pattern = [bash(f"printf '{CHECK}\\n' > check.txt")]
    for i in range(8):
        pattern += [bash(f"printf 'v{i}' > src.txt"), bash("cat check.txt")]
    messages = await run(opencode_server, http, "no-progress", pattern, users=2)
    parts = tool_parts(messages)
    # the check's runs are calls 3, 5, 7, 9, 11: the 5th, after changes, is the loop
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "no_progress",
        11,
        parts[10]["id"],
    )
    assert detected["finding"] == "the same result from bash 5 times, with 4 changes in between"
    assert len(parts) == 11 and outputs(messages)[2:11:2] == [f"{CHECK}\n"] * 5
    assert "Find that out before you edit again" in user_texts(messages)[1]


async def test_a_test_edit_test_run_whose_output_changes_is_left_alone(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    pattern = []
    for i in range(8):
        pattern += [bash(f"printf '{8 - i} failed' > result.txt"), bash("cat result.txt")]
    messages = await run(opencode_server, http, "progress", pattern)
    assert outputs(messages)[1::2] == [f"{8 - i} failed" for i in range(8)]
    assert monitor.events("loop.detected") == []


async def test_paging_through_15_views_over_and_over_is_stopped_as_a_revisit(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    views = 15
    pattern = [bash("seq 1 1500 > big.txt")] + [
        ("read", {"filePath": "big.txt", "offset": (k % views) * 100 + 1, "limit": 100})
        for k in range(3 * views)
    ]
    messages = await run(opencode_server, http, "paging", pattern, users=2)
    # call 1 writes, 2-16 are new views, the 12th revisit is call 16 + 12
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"]) == ("revisit", 28)
    assert detected["tools"] == ["read"]
    assert len(tool_parts(messages)) == 28
    assert "Nothing has changed since you read it" in user_texts(messages)[1]


async def test_narration_before_15_different_reads_is_left_alone(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    setup = bash('for i in $(seq 0 14); do echo "def x$i(): pass" > x$i.py; done')
    pattern = [setup] + [("read", {"filePath": f"x{k}.py"}) for k in range(15)]
    messages = await run(
        opencode_server, http, "narrated", pattern, say="Let's look at the X method:"
    )
    texts = [p["text"] for m in messages for p in m["parts"] if p.get("type") == "text"]
    assert texts.count("Let's look at the X method:") >= 15
    assert len(tool_parts(messages)) == 16
    assert monitor.events("loop.detected") == []


async def test_a_run_is_stopped_at_its_step_budget(opencode_server, start_monitor, http):
    monitor = await start_watching(start_monitor, opencode_server, "--run-budget", "steps=10")
    pattern = [bash(f"echo step {i}") for i in range(30)]
    messages = await run(opencode_server, http, "budget", pattern, users=2)
    [detected] = monitor.events("loop.detected")
    assert detected["rule"] == "budget"
    assert detected["finding"] == "the run's budget of 10 steps was reached (10 steps spent)"
    # stopped at the update that ends the 10th step: its call may have run, no later one
    assert 9 <= len(tool_parts(messages)) <= 10
    assert "Write a short summary" in user_texts(messages)[1]
