"""A call nested past the depth `json.loads` reads, against the real `opencode serve`, with
no plugin: the monitor still reads the stream's frames of it and stops the loop (issue 46)."""

from __future__ import annotations

import pytest

from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching, user_texts

pytestmark = pytest.mark.real_server

DEPTH = 3_000


async def test_four_identical_calls_3000_deep_are_stopped_at_the_4th(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("deep")
    calls = script([("read", {"filePath": "README.md"})], 8, delay=MODEL_DELAY, nest=DEPTH)
    await client.prompt_async(session["id"], calls)
    # The monitor's own sign first: before issue 46 it dropped every frame of these calls.
    [detected] = await monitor.wait_event("loop.detected")
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    parts = tool_parts(messages)
    # The server kept the arguments whole: the depth is the server's, not a test's shortcut.
    nested = parts[0]["state"]["input"]["nested"]
    for _ in range(DEPTH - 1):
        [nested] = nested
    assert nested == [1]
    assert len(parts) == 4
    assert monitor.events("frame.malformed") == []
    assert monitor.events("loop.detected") == [detected]
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "cycle",
        4,
        parts[3]["id"],
    )
    assert "1 call (read) repeated 4 times" in user_texts(messages)[1]
