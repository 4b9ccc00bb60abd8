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


async def test_two_monitors_stop_a_loop_once_and_give_one_feedback(
    opencode_server, start_monitor, http
):
    monitors = [await start_watching(start_monitor, opencode_server) for _ in range(2)]
    client = opencode_server.client(http)
    session = await client.create_session("loop, two monitors")
    await client.prompt_async(session["id"], script([READ], 12, delay=MODEL_DELAY))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    def settled(monitor: MonitorProcess) -> bool:
        """It posted the feedback, or left it to the other monitor (before or after the
        abort): its part of the intervention is over."""
        outcomes = monitor.events("intervention.outcome")
        deferred = any(o["outcome"] == "deferred" for o in outcomes)
        return bool(
            deferred or monitor.events("feedback.sent") or monitor.events("feedback.deferred")
        )

    await until(lambda: all(settled(m) for m in monitors), 30, 0.05)
    messages = await client.messages(session["id"])

    users = user_texts(messages)
    assert len(users) == 2 and users[1].startswith(MARK)  # the prompt, one feedback
    assert len(tool_parts(messages)) == 4
    outcomes = [m.events("intervention.outcome") for m in monitors]
    assert [len(o) for o in outcomes] == [1, 1]
    sent = [len(m.events("feedback.sent")) for m in monitors]
    assert sorted(sent) == [0, 1]
    other = monitors[sent.index(0)]
    [deferred] = other.events("intervention.outcome")
    # Deferred before acting, or aborted at the same moment and deferred the feedback.
    assert deferred["outcome"] == "deferred" or other.events("feedback.deferred")


async def test_two_monitors_under_approve_refuse_once(asking_server, start_monitor, http):
    monitors = [
        await start_watching(start_monitor, asking_server, "--permissions", "approve")
        for _ in range(2)
    ]
    client = asking_server.client(http)
    session = await client.create_session("append loop, two monitors")
    await client.prompt_async(session["id"], script([APPEND], 4))
    await client.wait_idle(session["id"], 60)
    await until(lambda: all(m.events("intervention.outcome") for m in monitors), 10, 0.05)
    # Both are done (asserted below: a refusal, and the other's refusal deferred to; neither
    # posts feedback): the record read now is final.
    messages = await client.messages(session["id"])

    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * 3 + ["error"]
    assert len(user_texts(messages)) == 1  # no feedback message on top of the refusal
    assert not any(
        (m["info"].get("error") or {}).get("name") == "MessageAbortedError" for m in messages
    )
    outcomes = sorted(
        (e["outcome"], e.get("reason")) for m in monitors for e in m.events("intervention.outcome")
    )
    assert outcomes == [("deferred", "call already refused"), ("rejected", None)]
    assert [m.events("feedback.sent") for m in monitors] == [[], []]
