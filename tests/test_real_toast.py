"""The toast at the TUI, against the real `opencode serve`: the server takes the request."""

from __future__ import annotations

import pytest

from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching

pytestmark = pytest.mark.real_server

READ = ("read", {"filePath": "README.md"})
BASH = ("bash", {"command": "echo hi", "description": "print a word"})


async def test_a_stopped_loop_is_toasted_and_the_server_takes_it(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("loop")
    await client.prompt_async(session["id"], script([READ, BASH], 30, delay=MODEL_DELAY))
    await client.wait_idle(session["id"], 60, user_messages=2)
    [posted] = await monitor.wait_event("toast.posted")
    # The server's own answer to the request body we sent: true is "shown".
    assert posted == {**posted, "session_id": session["id"], "answer": True}
    assert monitor.events("toast.failed") == []
    [outcome] = monitor.events("intervention.outcome")
    assert outcome["outcome"] == "aborted"
    code, _ = await monitor.stop()
    assert code == 0
