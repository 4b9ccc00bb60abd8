"""A run's life against the real `opencode serve` (no plugin, nothing asks permission): the
server ends every run with two idle events, and they end one run."""

from __future__ import annotations

import pytest

from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import APPEND, MODEL_DELAY, stalled_through_a_loop, start_watching

pytestmark = pytest.mark.real_server


async def test_a_stopped_loop_repeated_in_the_next_run_is_stopped_by_its_first_repetition(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("appends")
    # After the monitor's feedback the model runs the same loop again from its start.
    await client.prompt_async(
        session["id"], script([APPEND], 8, delay=MODEL_DELAY, after_feedback="loop")
    )
    first, again = (await monitor.wait_event("loop.detected", count=2, timeout=90))[:2]
    messages = await client.messages(session["id"])
    users = [n for n, m in enumerate(messages) if m["info"]["role"] == "user"]
    assert len(users) >= 2
    # The first tool call of the run the feedback started is the one stopped.
    run_two = tool_parts(messages[users[1] :])
    assert first["call_index"] == 4
    assert again["part_id"] == run_two[0]["id"]
    assert again["rule"] == first["rule"] == "cycle"


# Stopped longer than the stream's 25 s read limit (a loaded machine), the monitor drops the
# frames waiting in its socket and the loop is never read: the run must be short.
@pytest.mark.alone
async def test_a_monitor_stopped_during_a_loop_and_resumed_after_its_run_aborts_nothing(
    opencode_server, start_monitor, http
):
    """SIGSTOP while an 8-call loop runs (no plugin): the run ends with the model's answer.
    Resumed, the monitor reads the loop from the stream it missed: one intervention, whose
    run ended by itself, so no abort and one feedback, stored without an answer."""
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await stalled_through_a_loop(monitor, opencode_server, http)
    out = opencode_server.project / "out.txt"
    assert out.read_text().splitlines() == ["x"] * 8
    [outcome] = await monitor.wait_event("intervention.outcome", timeout=60)
    assert (outcome["outcome"], outcome["late"]) == ("nudged", "run ended before the abort")
    await monitor.wait_event("feedback.sent", timeout=30)
    messages = await client.messages(session["id"])
    assert all(m["info"].get("error") is None for m in messages)  # nothing aborted
    assert [m["info"]["role"] for m in messages].count("user") == 2
    assert messages[-1]["info"]["role"] == "user"  # the feedback started no run
    assert len(monitor.events("loop.detected")) == 1
