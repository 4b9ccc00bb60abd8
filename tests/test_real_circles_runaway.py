"""Issue 26's new shapes against the real `opencode serve`: searches in circles (rule
`circles`) and a `while true` bash call (rule `runaway`), each stopped at its call with the
feedback the model reads."""

from __future__ import annotations

import pytest

from monitor.kit.sandbox import tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching, user_texts

pytestmark = pytest.mark.real_server

# Ten different searches for what is not there: `find` prints nothing (exit 0), `ls` of a
# missing name fails (exit 2), each naming its own name, so neither `cycle` nor `failure`
# sees a repeat.
SEARCHES = [
    ("bash", {"command": f"find . -name 'nosuch{n}*'"})
    if n % 2
    else ("bash", {"command": f"ls nosuch{n}"})
    for n in range(12)
]


async def test_searches_that_find_nothing_are_stopped_as_circles(
    opencode_server, start_monitor, http
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("circles")
    await client.prompt_async(session["id"], script(SEARCHES, 12, delay=MODEL_DELAY))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    parts = tool_parts(messages)
    assert [p["state"]["metadata"]["exit"] for p in parts[:10]] == [2, 0] * 5
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["call_index"], detected["part_id"]) == (
        "circles",
        10,
        parts[9]["id"],
    )
    assert (
        "10 of the last 10 calls (bash) were searches that found nothing new"
        in (user_texts(messages)[1])
    )


async def test_a_while_true_bash_call_is_stopped_as_it_streams(
    opencode_server, start_monitor, http
):
    forever = [("bash", {"command": "bash -c 'while true; do echo same line; sleep 0.01; done'"})]
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("runaway")
    await client.prompt_async(session["id"], script(forever, 1, delay=MODEL_DELAY))
    # Well within bash's own 2 minutes: the monitor stops it as it streams.
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    [part] = tool_parts(messages)
    # the abort ended it long before bash's own timeout (2 minutes)
    took = (part["state"]["time"]["end"] - part["state"]["time"]["start"]) / 1000
    print(
        "DEBUG took", took, part["state"]["status"], part["state"].get("metadata", {}).get("exit")
    )
    assert took < 20
    [detected] = monitor.events("loop.detected")
    assert (detected["rule"], detected["part_id"]) == ("runaway", part["id"])
    assert "one bash call kept printing the same line without end" in user_texts(messages)[1]
