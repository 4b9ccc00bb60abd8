"""A run's life against the real `opencode serve` (no plugin, nothing asks permission): the
server ends every run with two idle events, and they end one run."""

from __future__ import annotations

import pytest

from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching

pytestmark = pytest.mark.real_server

APPEND = ("bash", {"command": "echo x >> out.txt", "description": "append a line"})


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
