"""The progress rules (no_progress, revisit, text_steps_echo, step budget) on what the real
`opencode serve` records: each scenario runs through the scripted model with no monitor, and
the session's stored parts, replayed as the `message.part.updated` frames they were, go
through the standalone rules (monitor/core/evaluate.py). Once the rules are wired into the
tracker these switch to the live monitor and assert the stop instead."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.core.evaluate import ProgressFacts, ProgressSettings, RunEnd, Step, run_progress
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY

pytestmark = pytest.mark.real_server

CHECK = "FAILED check_total: expected 3, got 2"


def bash(command: str) -> tuple[str, dict[str, Any]]:
    return ("bash", {"command": command, "description": "Run a step"})


def steps_of(messages: list[dict[str, Any]]) -> list[Step]:
    """The stored parts as the frames the server streamed for them, through the adapter."""
    facts = ProgressFacts()
    steps: list[Step] = []
    for message in messages:
        for part in message["parts"]:
            frame = {
                "type": "message.part.updated",
                "properties": {"sessionID": part["sessionID"], "part": part},
            }
            step = facts.feed(frame)
            if step is not None:
                steps.append(step)
    return [*steps, RunEnd()]


async def run(opencode_server, http, title: str, pattern, say: str = "") -> list[dict]:
    client = opencode_server.client(http)
    session = await client.create_session(title)
    prompt = script(pattern, len(pattern), delay=MODEL_DELAY, say=say)
    await client.prompt_async(session["id"], prompt)
    messages = await client.wait_idle(session["id"], 120)
    tools = [p for m in messages for p in m["parts"] if p.get("type") == "tool"]
    assert len(tools) == len(pattern)
    assert all(p["state"]["status"] == "completed" for p in tools)
    return messages


def outputs(messages: list[dict]) -> list[str]:
    return [p["state"]["output"] for m in messages for p in m["parts"] if p.get("type") == "tool"]


async def test_edit_rerun_with_the_same_result_is_no_progress_at_the_5th_run(opencode_server, http):
    pattern = [bash(f"printf '{CHECK}\\n' > check.txt")]
    for i in range(8):
        pattern += [bash(f"printf 'v{i}' > src.txt"), bash("cat check.txt")]
    messages = await run(opencode_server, http, "no-progress", pattern)
    assert outputs(messages)[2::2] == [f"{CHECK}\n"] * 8
    fired = run_progress(steps_of(messages), ProgressSettings())
    # the check's runs are calls 3, 5, 7, 9, 11: the 5th after changes
    assert fired["no_progress"] == [11]
    assert fired["revisit"] == []


async def test_test_edit_test_whose_output_changes_is_left_alone(opencode_server, http):
    pattern = []
    for i in range(8):
        pattern += [bash(f"printf '{8 - i} failed' > result.txt"), bash("cat result.txt")]
    messages = await run(opencode_server, http, "progress", pattern)
    assert outputs(messages)[1::2] == [f"{8 - i} failed" for i in range(8)]
    fired = run_progress(steps_of(messages), ProgressSettings())
    assert {rule: at for rule, at in fired.items() if at} == {}


async def test_paging_through_15_views_over_and_over_is_a_revisit_loop(opencode_server, http):
    views = 15
    pattern = [bash("seq 1 1500 > big.txt")] + [
        ("read", {"filePath": "big.txt", "offset": (k % views) * 100 + 1, "limit": 100})
        for k in range(3 * views)
    ]
    messages = await run(opencode_server, http, "paging", pattern)
    reads = outputs(messages)[1:]
    assert len(set(reads)) == views and reads[:views] == reads[views : 2 * views]
    fired = run_progress(steps_of(messages), ProgressSettings())
    # call 1 writes, 2-16 are new views, the 12th revisit is call 16 + 12
    assert fired["revisit"][0] == 28
    assert fired["no_progress"] == []


async def test_narration_before_15_different_reads_is_left_alone(opencode_server, http):
    setup = bash('for i in $(seq 0 14); do echo "def x$i(): pass" > x$i.py; done')
    pattern = [setup] + [("read", {"filePath": f"x{k}.py"}) for k in range(15)]
    messages = await run(
        opencode_server, http, "narrated", pattern, say="Let's look at the X method:"
    )
    texts = [p["text"] for m in messages for p in m["parts"] if p.get("type") == "text"]
    assert texts.count("Let's look at the X method:") >= 15
    fired = run_progress(steps_of(messages), ProgressSettings())
    assert {rule: at for rule, at in fired.items() if at} == {}


async def test_a_long_run_reaches_its_step_budget(opencode_server, http):
    pattern = [bash(f"echo step {i}") for i in range(30)]
    messages = await run(opencode_server, http, "budget", pattern)
    fired = run_progress(steps_of(messages), ProgressSettings(run_steps=25))
    assert fired["budget_steps"] == [25]
    assert run_progress(steps_of(messages), ProgressSettings())["budget_steps"] == []
