"""The guard on the real OpenCode 2.2.5 (`@opencode/cli`), with the commands a user types.

2.2.5 has no loop check of its own (tests/test_real_v2_kit.py: 8 identical reads all run).
Each test drives a real `opencode serve` of 2.2.5, isolated, with the scripted model
(monitor/kit/scripted_model.py, which speaks 2.x's `read {path}` and `shell {command}`), and
the monitor's console script; every assertion reads the server's own record of the session
(`/api/session/{id}/message`) or the monitor's JSON log.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from monitor.core.feedback import MARK
from monitor.kit.sandbox import OpencodeServer2, ProjectClient2, free_loopback_port, tool_calls
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from tests.harness import MODEL_DELAY, seen_idle
from tests.real_v2 import (
    answers,
    no_refused_request,
    users,
    watching,
    watching_with_the_plugin,
)

pytestmark = pytest.mark.real_server

READ = ("read", {"path": "README.md"})


async def test_watch_with_a_url_and_a_password_stops_an_8_read_loop_at_call_4_once(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
) -> None:
    monitor = await watching(start_monitor, opencode2_server)
    [detected] = monitor.events("server.detected")
    assert (detected["server"], detected["version"]) == ("opencode 2.2.5: 2.x API", "2.2.5")
    assert detected["stream"] == f"{opencode2_server.url}/api/event"
    session = await opencode2_client.create_session("loop")
    await opencode2_client.prompt(session["id"], script([READ], 8, delay=MODEL_DELAY))
    # The interrupted run, then the feedback's run, in which the model answers.
    record = await opencode2_client.wait_idle(session["id"], 60, runs=2)

    calls = tool_calls(record)
    assert [call["name"] for call in calls] == ["read"] * 4  # no call after the 4th
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["outcome"], outcome["channel"], outcome["rule"]) == (
        "aborted",
        "abort",
        "cycle",
    )
    assert outcome["part_id"].endswith(":" + calls[3]["id"])
    assert outcome["session_id"] == session["id"]
    [feedback] = monitor.events("feedback.sent")
    assert feedback["session_id"] == session["id"]
    said = users(record)
    assert len(said) == 2 and said[1].startswith(MARK)
    assert "1 call (read) repeated 4 times" in said[1]
    assert answers(record)[-1] == DEFAULT_ANSWER
    assert [item["outcome"] for item in record if item["type"] == "idle"] == [
        "interrupted",
        "succeeded",
    ]
    no_refused_request(monitor)
    assert opencode2_server.password not in monitor.output()


async def test_ordinary_work_on_2_2_5_gets_no_intervention(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
    http: aiohttp.ClientSession,
) -> None:
    for n in range(8):
        (opencode2_server.project / f"file-{n}.md").write_text(f"file {n}\n")
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(start_monitor, opencode2_server, "--metrics-addr", address)
    session = await opencode2_client.create_session("varied")
    pattern = [("read", {"path": f"file-{n}.md"}) for n in range(8)]
    await opencode2_client.prompt(session["id"], script(pattern, 8))
    record = await opencode2_client.wait_idle(session["id"], 60)
    # The monitor has read the run's end: a positive sign before asserting it did nothing.
    await seen_idle(http, address, session["id"])

    assert [call["state"]["input"]["path"] for call in tool_calls(record)] == [
        f"file-{n}.md" for n in range(8)
    ]
    assert monitor.events("loop.detected") == [] and monitor.events("intervention.outcome") == []
    assert users(record) == users(record)[:1]


async def test_with_plugin_install_the_4th_call_is_refused_in_band_on_any_port(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
) -> None:
    # Not 4096: before, the 2.x plugin asked there whatever its server's port, found no
    # monitor, and the daemon interrupted the run its own rule had saved.
    assert not opencode2_server.url.endswith(":4096")
    monitor = await watching_with_the_plugin(start_monitor, opencode2_server)
    session = await opencode2_client.create_session("plugin")
    # A model that heeds a refusal (answers in the same run), and one that does not.
    await opencode2_client.prompt(session["id"], script([READ], 8, delay=MODEL_DELAY, heed=True))
    record = await opencode2_client.wait_idle(session["id"], 90)

    calls = tool_calls(record)
    # Refused before it ran; the model read the refusal and answered in the same run.
    assert [call["state"]["status"] for call in calls] == ["completed"] * 3 + ["error"]
    refusal = calls[3]["state"]["error"]["message"]
    assert refusal.startswith(MARK) and "1 call (read) repeated 4 times" in refusal
    assert answers(record) == [DEFAULT_ANSWER] and len(users(record)) == 1
    assert [item["outcome"] for item in record if item["type"] == "idle"] == ["succeeded"]
    # One intervention: the refusal, never an interrupt or a feedback on top of it.
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["outcome"], outcome["via"], outcome["call_index"]) == ("blocked", "plugin", 4)
    assert outcome["call_id"] == calls[3]["id"]
    assert monitor.events("feedback.sent") == []

    # A model that ignores each refusal: refused again at 5, then held (the ladder's third
    # step), the run interrupted, the hold's feedback waiting in the inbox for a person.
    other = await opencode2_client.create_session("deaf")
    await opencode2_client.prompt(other["id"], script([READ], 8, delay=MODEL_DELAY))
    record = await opencode2_client.wait_idle(other["id"], 90)
    # No call ran after the 3rd. A call the model asked for while the hold's interrupt was
    # on its way is refused too (seen once at a load of 8): the same loop, no new intervention.
    statuses = [call["state"]["status"] for call in tool_calls(record)]
    assert statuses[:6] == ["completed"] * 3 + ["error"] * 3 and set(statuses[3:]) == {"error"}
    outcomes = [o for o in monitor.events("intervention.outcome") if o["session_id"] == other["id"]]
    assert [(o["outcome"], o["call_index"]) for o in outcomes][:3] == [
        ("blocked", 4),
        ("blocked", 5),
        ("held", 6),
    ]
    assert [o["outcome"] for o in outcomes[3:]] in ([], ["deferred"])
    no_refused_request(monitor)
