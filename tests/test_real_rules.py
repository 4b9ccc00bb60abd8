"""The rules beside `cycle` against the real `opencode serve`: the call they stop at, the
rule in the log and the metric, the feedback the model reads, no call after the stop."""

from __future__ import annotations

import pytest

from monitor.kit.sandbox import free_loopback_port, tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching, user_texts

pytestmark = pytest.mark.real_server

# The same failure, the command rewritten each time (exit 2, the same output).
REWRITTEN = [
    ("bash", {"command": command, "description": f"List the directory, try {n}"})
    for n, command in enumerate(
        ["ls no-such-dir", "ls -l no-such-dir", "cd . && ls no-such-dir", "ls -a no-such-dir"]
        + ["LC_ALL=C ls no-such-dir"] * 4
    )
]


async def test_same_failure_with_rewritten_commands_stopped_at_the_4th(
    opencode_server, start_monitor, http, measure_overshoot
):
    port = free_loopback_port()
    monitor = await start_watching(
        start_monitor, opencode_server, "--metrics-addr", f"127.0.0.1:{port}"
    )
    client = opencode_server.client(http)
    session = await client.create_session("failure")
    await client.prompt_async(session["id"], script(REWRITTEN, 8, delay=MODEL_DELAY))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    parts = tool_parts(messages)
    assert [p["state"]["input"]["command"] for p in parts] == [
        args["command"] for _, args in REWRITTEN[:4]
    ]
    assert {p["state"]["metadata"]["exit"] for p in parts} == {2}
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "failure",
        4,
        parts[3]["id"],
    )
    assert (detected["cycle_length"], detected["repetitions"], detected["tools"]) == (
        1,
        4,
        ["bash"],
    )
    assert measure_overshoot(messages, [detected["part_id"]]) == 0
    users = user_texts(messages)
    assert len(users) == 2 and "the same error 4 times in a row (bash)" in users[1]
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        metrics = await response.text()
    assert 'opencode_loop_monitor_loops_detected_total{cycle_length="1",rule="failure"} 1.0' in (
        metrics
    )


async def test_retry_with_a_new_description_is_stopped_at_the_4th(
    opencode_server, start_monitor, http
):
    relabelled = [
        ("bash", {"command": "git status --short", "description": f"Check status, try {n}"})
        for n in range(6)
    ]
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("relabelled")
    await client.prompt_async(session["id"], script(relabelled, 6, delay=MODEL_DELAY))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    assert len(tool_parts(messages)) == 4
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"]) == ("cycle", 4)
    assert "1 call (bash) repeated 4 times" in user_texts(messages)[1]
