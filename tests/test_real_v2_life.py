"""The life of an intervention on the real OpenCode 2.2.5 (`@opencode/cli`): held, counted,
attached, shared by two monitors, carried across a restart and a cut stream, refused at the
permission gate, and shown by `status`.

Each test drives a real, isolated `opencode serve` of 2.2.5 with the scripted model
(monitor/kit/scripted_model.py, which speaks 2.x's `read {path}`) and the monitor's console
script given the server's password, as a user runs it. Assertions read the server's own record
(`/api/session/{id}/message`, and `/inbox` where a message waits without a run), its `idle`
items (one per run end: `interrupted` is one interrupt), and the monitor's JSON log or
`/status`. The 1.18.33 tests they follow: test_real_watch.py, test_real_status.py,
test_real_attach.py, test_real_monitors.py, test_real_engine.py, test_real_permissions.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from monitor.core.feedback import HOLD_NOTE, MARK
from monitor.kit.poll import until
from monitor.kit.sandbox import OpencodeServer2, ProjectClient2, free_loopback_port, tool_calls
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from tests.harness import MODEL_DELAY, CuttableProxy, status
from tests.real_v2 import answers, no_refused_request, users, watching

pytestmark = pytest.mark.real_server

READ = ("read", {"path": "README.md"})
ASK_ALL = [{"action": "*", "resource": "*", "effect": "ask"}]
PERSON = "ok, read the other file"


def run_ends(record: list[dict[str, Any]]) -> list[str]:
    """How each run ended: `interrupted` (an interrupt) or `succeeded`."""
    return [item["outcome"] for item in record if item.get("type") == "idle"]


def credentials(server: OpencodeServer2) -> dict[str, str]:
    return {"OPENCODE_SERVER_PASSWORD": server.password}


def watch_args(url: str, *flags: str) -> list[str]:
    return ["watch", "--url", url, "--log-format", "json", *flags]


async def status_json(address: str) -> dict[str, Any]:
    code, out = await status(address, "--json")
    assert code == 0, out
    answer: dict[str, Any] = json.loads(out)
    return answer


async def session_state(address: str, session_id: str) -> str | None:
    """The session's state on the monitor's /status (`busy`, `idle`, `held`), if listed."""
    answer = await status_json(address)
    return next(
        (s["state"] for s in answer["sessions"] if s["session_id"] == session_id),
        None,
    )


async def until_state(address: str, session_id: str, state: str) -> None:
    async def there() -> bool:
        return await session_state(address, session_id) == state

    await until(there, 30, 0.1, f"session {session_id} {state} on /status")


async def calls_made(client: ProjectClient2, session_id: str, count: int) -> None:
    """Wait until the session's record holds `count` tool calls."""

    async def enough() -> bool:
        return len(tool_calls(await client.messages(session_id))) >= count

    await until(enough, 60, 0.05, f"{count} calls in session {session_id}")


# Holds.


async def test_on_loop_hold_keeps_the_feedback_in_the_inbox_until_a_person_writes(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(
        start_monitor, opencode2_server, "--on-loop", "hold", "--metrics-addr", address
    )
    client = opencode2_client
    session = (await client.create_session("held"))["id"]
    await client.prompt(session, script([READ], 8, delay=MODEL_DELAY))
    [sent] = await monitor.wait_event("feedback.sent", timeout=60)
    assert (sent["session_id"], sent["hold"]) == (session, True)
    record = await client.wait_idle(session, 60)
    await until_state(address, session, "held")

    assert [call["name"] for call in tool_calls(record)] == ["read"] * 4
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["outcome"], outcome["channel"], outcome["call_index"]) == ("held", "abort", 4)
    assert outcome["part_id"].endswith(":" + tool_calls(record)[3]["id"])
    # Posted with `resume: false`: no run started, the feedback waits in the inbox, not in
    # the record; one interrupt.
    assert run_ends(record) == ["interrupted"] and len(users(record)) == 1
    [waiting] = await client.inbox(session)
    text = waiting["payload"]["text"]
    assert text.startswith(MARK) and text.endswith(HOLD_NOTE)
    assert "1 call (read) repeated 4 times" in text
    assert session not in await client.active()

    # A person writes, as the TUI sends it: a run takes both messages in, the hold ends.
    await client.prompt(session, PERSON)
    record = await client.wait_idle(session, 60, runs=2)
    await until_state(address, session, "idle")
    assert users(record)[1:] == [text, PERSON]
    assert answers(record) == [DEFAULT_ANSWER] and run_ends(record) == ["interrupted", "succeeded"]
    assert await client.inbox(session) == []
    assert len(monitor.events("intervention.outcome")) == len(monitor.events("feedback.sent")) == 1
    assert (await status_json(address))["totals"]["held"] == 0
    no_refused_request(monitor)


async def test_max_interventions_2_holds_the_third_loop_until_a_person_writes(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(
        start_monitor,
        opencode2_server,
        "--max-interventions",
        "2",
        "--metrics-addr",
        address,
        "--log-level",
        "debug",
    )
    client = opencode2_client
    session = (await client.create_session("stubborn"))["id"]
    # After each feedback the model loops again: the ladder's third step holds.
    await client.prompt(session, script([READ], 8, delay=MODEL_DELAY, after_feedback="loop"))
    sent = await monitor.wait_event("feedback.sent", count=3, timeout=90)
    record = await client.wait_idle(session, 60, runs=3)
    await until_state(address, session, "held")

    outcomes = monitor.events("intervention.outcome")
    assert [(o["outcome"], o["escalated"], o["call_index"]) for o in outcomes] == [
        ("aborted", False, 4),
        ("aborted", False, 5),
        ("held", True, 6),
    ]
    assert [s["hold"] for s in sent] == [False, False, True]
    # 4 calls, then one in each run a feedback started: the loop stays armed across runs.
    calls = tool_calls(record)
    assert len(calls) == 6
    assert [o["part_id"].rsplit(":", 1)[1] for o in outcomes] == [c["id"] for c in calls[3:]]
    assert run_ends(record) == ["interrupted"] * 3
    said = users(record)
    assert len(said) == 3 and all(s.startswith(MARK) for s in said[1:])
    assert not any(s.endswith(HOLD_NOTE) for s in said)
    [waiting] = await client.inbox(session)
    assert waiting["payload"]["text"].startswith(MARK)
    assert waiting["payload"]["text"].endswith(HOLD_NOTE)

    # A person's message, stored only (so that the scripted model does not loop again):
    # the hold ends, nothing runs.
    await client.prompt(session, PERSON, resume=False)
    await until_state(address, session, "idle")
    assert [item["payload"]["text"] for item in await client.inbox(session)][1:] == [PERSON]
    assert len(monitor.events("intervention.outcome")) == 3
    assert session not in await client.active()
    no_refused_request(monitor)


async def test_max_interventions_0_holds_the_first_loop(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(
        start_monitor, opencode2_server, "--max-interventions", "0", "--metrics-addr", address
    )
    client = opencode2_client
    session = (await client.create_session("held at once"))["id"]
    await client.prompt(session, script([READ], 8, delay=MODEL_DELAY))
    [sent] = await monitor.wait_event("feedback.sent", timeout=60)
    record = await client.wait_idle(session, 60)
    await until_state(address, session, "held")

    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["outcome"], outcome["escalated"], outcome["call_index"]) == ("held", True, 4)
    assert sent["hold"] is True and len(tool_calls(record)) == 4
    assert run_ends(record) == ["interrupted"] and len(users(record)) == 1
    [waiting] = await client.inbox(session)
    assert waiting["payload"]["text"].endswith(HOLD_NOTE)
    assert (await status_json(address))["totals"] == {
        "sessions": 1,
        "busy": 0,
        "held": 1,
        "interventions": 1,
    }


# Attach.


def attach_args(server: OpencodeServer2, session_id: str) -> list[str]:
    return ["attach", session_id, "--url", server.url, "--log-format", "json"]


async def test_attach_to_a_2x_session_mid_run_stops_it_at_its_4th_call_and_ends_at_deletion(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    client = opencode2_client
    session = (await client.create_session("slow loop"))["id"]
    # A second between calls: the monitor's start takes about one.
    await client.prompt(session, script([READ], 12, delay=1.0))
    await calls_made(client, session, 1)
    monitor = start_monitor(
        *attach_args(opencode2_server, session), env=credentials(opencode2_server)
    )
    [found] = await monitor.wait_event("attach.found")
    assert (found["session_id"], found["engine"]) == (session, 2)
    assert found["directory"] == opencode2_server.directory
    assert found["server"] == "opencode 2.2.5: 2.x API"
    [seeded] = await monitor.wait_event("session.seeded")
    assert seeded["session_id"] == session and 1 <= seeded["calls"] <= 3

    record = await client.wait_idle(session, 60, runs=2)
    calls = tool_calls(record)
    assert len(calls) == 4  # the calls before the attach counted: stopped at the 4th
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["outcome"], outcome["call_index"]) == ("aborted", 4)
    assert outcome["part_id"].endswith(":" + calls[3]["id"])
    said = users(record)
    assert len(said) == 2 and "1 call (read) repeated 4 times" in said[1]
    assert answers(record) == [DEFAULT_ANSWER] and run_ends(record) == ["interrupted", "succeeded"]
    assert len(monitor.events("feedback.sent")) == 1

    await client.delete_session(session)
    assert await monitor.wait_exit(15) == 0
    assert [r["session_id"] for r in monitor.events("attach.session_deleted")] == [session]
    no_refused_request(monitor)


async def test_attach_to_a_session_2_2_5_does_not_have_exits_66(
    opencode2_server: OpencodeServer2, start_monitor: Any
) -> None:
    missing = "ses_0000000000000000000000000"
    monitor = start_monitor(
        *attach_args(opencode2_server, missing), env=credentials(opencode2_server)
    )
    assert await monitor.wait_exit(15) == 66
    assert monitor.stderr_path.read_text().splitlines() == [
        f"opencode-loop-monitor: session {missing} not found on {opencode2_server.url}"
    ]
    assert monitor.stdout_path.read_text() == ""


# Two monitors, a restart, a cut stream.


async def test_two_monitors_of_one_2x_server_stop_a_loop_once(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    acting = await watching(start_monitor, opencode2_server)
    standby = await watching(start_monitor, opencode2_server)
    assert acting.events("monitor.acting") and not acting.events("monitor.standby")
    [waiting] = standby.events("monitor.standby")
    assert acting.process is not None and waiting["acting_pid"] == acting.process.pid
    client = opencode2_client
    session = (await client.create_session("loop, two monitors"))["id"]
    await client.prompt(session, script([READ], 8, delay=MODEL_DELAY))
    record = await client.wait_idle(session, 60, runs=2)
    [left] = await standby.wait_event("intervention.outcome")

    calls = tool_calls(record)
    assert len(calls) == 4
    [stopped] = acting.events("intervention.outcome")
    assert (stopped["outcome"], stopped["call_index"]) == ("aborted", 4)
    assert (left["outcome"], left["call_index"], left["acting_pid"]) == (
        "standby",
        4,
        acting.process.pid,
    )
    assert stopped["part_id"] == left["part_id"] and stopped["part_id"].endswith(calls[3]["id"])
    said = users(record)
    assert len(said) == 2 and said[1].startswith(MARK)  # one feedback
    assert run_ends(record) == ["interrupted", "succeeded"]  # one interrupt
    assert len(acting.events("feedback.sent")) == 1
    assert standby.events("feedback.sent") == standby.events("feedback.deferred") == []


async def test_a_monitor_killed_and_started_again_mid_loop_stops_it_once_at_its_4th_call(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    first = await watching(start_monitor, opencode2_server)
    client = opencode2_client
    session = (await client.create_session("loop across a restart"))["id"]
    await client.prompt(session, script([READ], 12, delay=1.0))
    await calls_made(client, session, 2)
    first.kill()  # SIGKILL: nothing said, nothing handed over
    second = await watching(start_monitor, opencode2_server)
    # The calls so far read back from the record (2.2.5 has no history route).
    [seeded] = second.events("session.seeded")
    assert seeded["session_id"] == session and 2 <= seeded["calls"] <= 3

    record = await client.wait_idle(session, 60, runs=2)
    calls = tool_calls(record)
    assert len(calls) == 4
    assert first.events("intervention.outcome") == []
    # Each call counted once: the read-back's and the stream's are the same calls.
    [outcome] = second.events("intervention.outcome")
    assert (outcome["outcome"], outcome["call_index"]) == ("aborted", 4)
    assert outcome["part_id"].endswith(":" + calls[3]["id"])
    said = users(record)
    assert len(said) == 2 and "1 call (read) repeated 4 times" in said[1]
    assert run_ends(record) == ["interrupted", "succeeded"]
    assert len(second.events("feedback.sent")) == 1


@pytest.fixture
async def proxy(opencode2_server: OpencodeServer2) -> AsyncIterator[CuttableProxy]:
    """A loopback TCP proxy in front of the server, closed at teardown."""
    assert opencode2_server.port is not None
    proxy = CuttableProxy(opencode2_server.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_a_loop_whose_stream_is_cut_is_stopped_once_after_the_reconnect(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
    proxy: CuttableProxy,
) -> None:
    url = f"http://127.0.0.1:{proxy.port}"
    monitor = start_monitor(*watch_args(url), env=credentials(opencode2_server))
    await monitor.wait_event("stream.resynced")
    client = opencode2_client
    session = (await client.create_session("loop, stream cut"))["id"]
    await client.prompt(session, script([READ], 12, delay=0.5))
    await calls_made(client, session, 2)
    proxy.cut()  # the 3rd and 4th calls happen while the monitor is away
    await monitor.wait_event("stream.disconnected")
    await calls_made(client, session, 4)
    proxy.mend()
    record = await client.wait_idle(session, 60, runs=2)
    await monitor.wait_event("feedback.sent")

    calls = tool_calls(record)
    # Stopped once, at its 4th call, read back from the record after the reconnect.
    outcome, *later = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["outcome"], outcome["call_index"]) == (
        session,
        "aborted",
        4,
    )
    assert outcome["part_id"].endswith(":" + calls[3]["id"])
    assert [o["outcome"] for o in later] in ([], ["deferred"])
    said = users(record)
    assert len(said) == 2 and said[1].startswith(MARK)
    assert run_ends(record) == ["interrupted", "succeeded"]
    resynced = monitor.events("stream.resynced")
    # 2.2.5 has no history route: the busy session's run is read back from its record.
    assert len(resynced) == 2 and (resynced[1]["busy"], resynced[1]["seeded"]) == (1, 1)
    assert len(monitor.events("feedback.sent")) == 1


# The permission gate.


async def replies(
    client: ProjectClient2, http: aiohttp.ClientSession, session_id: str, calls: set[str]
) -> None:
    """A person at the TUI: approves (`once`) the requests of these calls as they come."""
    answered: set[str] = set()
    base = f"{client.url}/api/session/{session_id}/permission"
    while answered != calls:
        async with http.get(base, headers=dict(client.headers)) as response:
            asked = (await response.json())["data"]
        for request in asked:
            if request["source"]["id"] in calls - answered:
                async with http.post(
                    f"{base}/{request['id']}/reply",
                    json={"decision": "once"},
                    headers=dict(client.headers),
                ) as reply:
                    assert reply.status == 204, await reply.text()
                answered.add(request["source"]["id"])
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["approve", "gate"])
async def test_the_gate_refuses_the_4th_calls_request_before_it_runs_and_the_run_goes_on(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
    http: aiohttp.ClientSession,
    mode: str,
) -> None:
    monitor = await watching(
        start_monitor, opencode2_server, "--permissions", mode, "--log-level", "debug"
    )
    client = opencode2_client
    session = (await client.create_session("asks", permissions=ASK_ALL))["id"]
    await client.prompt(session, script([READ], 4))
    person = None
    if mode == "gate":  # the other requests are a person's to answer
        person = asyncio.create_task(replies(client, http, session, {"call_0", "call_1", "call_2"}))
    try:
        record = await client.wait_idle(session, 60)
    finally:
        if person is not None:
            person.cancel()
    [outcome] = await monitor.wait_event("intervention.outcome")

    calls = tool_calls(record)
    assert [call["state"]["status"] for call in calls] == ["completed"] * 3 + ["error"]
    error = calls[3]["state"]["error"]
    assert error["type"] == "permission.rejected"
    assert (
        error["message"].startswith(MARK) and "1 call (read) repeated 4 times" in error["message"]
    )
    assert (outcome["outcome"], outcome["channel"], outcome["call_index"]) == (
        "rejected",
        "permission",
        4,
    )
    assert outcome["part_id"].endswith(":" + calls[3]["id"])
    # The run went on: the model read the refusal and answered, no interrupt, no feedback.
    assert run_ends(record) == ["succeeded"] and answers(record) == [DEFAULT_ANSWER]
    assert len(users(record)) == 1 and monitor.events("feedback.sent") == []
    assert monitor.events("toast.failed") == []  # 2.2.5 has no TUI route: none sent
    approved = monitor.events("permission.approved")
    assert len(approved) == (3 if mode == "approve" else 0)
    no_refused_request(monitor)


# Status.


async def test_status_names_opencode_2_2_5_and_counts_the_intervention(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(start_monitor, opencode2_server, "--metrics-addr", address)
    client = opencode2_client
    session = (await client.create_session("loop"))["id"]
    await client.prompt(session, script([READ], 8, delay=MODEL_DELAY))
    await client.wait_idle(session, 60, runs=2)
    await monitor.wait_event("feedback.sent")
    await until_state(address, session, "idle")

    answer = await status_json(address)
    assert answer["url"] == opencode2_server.url
    assert answer["stream"]["state"] == "connected"
    assert answer["stream"]["server"] == "opencode 2.2.5: 2.x API"
    [entry] = [s for s in answer["sessions"] if s["session_id"] == session]
    assert (entry["interventions"], entry["directory"]) == (1, opencode2_server.directory)
    assert answer["totals"]["interventions"] == 1 and answer["totals"]["held"] == 0

    code, table = await status(address)
    assert code == 0
    lines = table.splitlines()
    assert lines[0] == f"monitor 0.1.0 watching {opencode2_server.url}"
    assert lines[1].startswith("stream: connected to opencode 2.2.5 (2.x API), ")
    assert any(line.startswith(session + "  ") for line in lines)
