"""Two monitors on one real `opencode serve` (two `watch`, as a daemon and an `attach` would
be): one intervention per loop, read from the server's own record of the session."""

from __future__ import annotations

import pytest

from monitor.core.feedback import MARK
from monitor.kit.poll import until
from monitor.kit.sandbox import OpencodeServer, tool_parts
from monitor.kit.scripted_model import script
from tests.harness import MODEL_DELAY, start_watching, user_texts
from tests.monitor_process import MonitorProcess

pytestmark = pytest.mark.real_server

READ = ("read", {"filePath": "README.md"})
APPEND = ("bash", {"command": "echo again >> loop.txt", "description": "append a line"})


@pytest.fixture
async def asking_server(opencode_bin, scripted_model):
    async with OpencodeServer(opencode_bin, scripted_model.url, permission={"*": "ask"}) as server:
        yield server


async def two_monitors(start_monitor, server, *flags: str) -> tuple[MonitorProcess, ...]:
    """Two `watch` of `server`: the first acts, the second is its standby (issue 30)."""
    monitors = tuple([await start_watching(start_monitor, server, *flags) for _ in range(2)])
    assert monitors[0].events("monitor.acting") and not monitors[0].events("monitor.standby")
    [standby] = monitors[1].events("monitor.standby")
    assert monitors[0].process is not None
    assert standby["acting_pid"] == monitors[0].process.pid
    return monitors


async def test_two_monitors_stop_a_loop_once_and_give_one_feedback(
    opencode_server, start_monitor, http
):
    acting, standby = await two_monitors(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("loop, two monitors")
    await client.prompt_async(session["id"], script([READ], 12, delay=MODEL_DELAY))
    await client.wait_idle(session["id"], 60, user_messages=2)
    await acting.wait_event("feedback.sent")
    [left] = await standby.wait_event("intervention.outcome")
    messages = await client.messages(session["id"])

    users = user_texts(messages)
    assert len(users) == 2 and users[1].startswith(MARK)  # the prompt, one feedback
    assert len(tool_parts(messages)) == 4
    [stopped] = acting.events("intervention.outcome")
    assert (stopped["outcome"], stopped["call_index"]) == ("aborted", 4)
    # The standby saw the same loop on the same call, and left it to the acting monitor.
    assert (left["outcome"], left["call_index"], left["acting_pid"]) == (
        "standby",
        4,
        acting.process.pid if acting.process else None,
    )
    assert standby.events("feedback.sent") == standby.events("feedback.deferred") == []


async def test_two_monitors_under_approve_refuse_once(asking_server, start_monitor, http):
    acting, standby = await two_monitors(start_monitor, asking_server, "--permissions", "approve")
    client = asking_server.client(http)
    session = await client.create_session("append loop, two monitors")
    await client.prompt_async(session["id"], script([APPEND], 4))
    await client.wait_idle(session["id"], 60)
    monitors = (acting, standby)
    await until(lambda: all(m.events("intervention.outcome") for m in monitors), 10, 0.05)
    # Both are done (asserted below: a refusal, and the standby's record of it; neither
    # posts feedback): the record read now is final.
    messages = await client.messages(session["id"])

    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * 3 + ["error"]
    assert len(user_texts(messages)) == 1  # no feedback message on top of the refusal
    assert not any(
        (m["info"].get("error") or {}).get("name") == "MessageAbortedError" for m in messages
    )
    outcomes = [[e["outcome"] for e in m.events("intervention.outcome")] for m in monitors]
    assert outcomes == [["rejected"], ["standby"]]
    assert [m.events("feedback.sent") for m in monitors] == [[], []]
    # Only the acting monitor answers requests: it approved calls 1-3, the standby none.
    assert len(acting.events("permission.approved")) == 3
    assert standby.events("permission.approved") == []
