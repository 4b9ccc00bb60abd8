"""Issue 26 against the real `opencode serve` with the monitor's plugin: a finding made after
its call ran (no progress, a spent budget, the same failure) refuses the session's next call
in band, the model answers in the same run; no abort, no feedback message. A run that ends
before a next call gets the feedback stored for the next time, nothing aborted."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.core.feedback import MARK
from monitor.kit.sandbox import OpencodeServer, tool_parts
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from tests.harness import MODEL_DELAY, opencode_run, start_watching, user_texts
from tests.monitor_process import MonitorProcess

pytestmark = pytest.mark.real_server

CHECK = "FAILED check_total: expected 3, got 2"
REFUSED = MARK + "this call was refused and did not run, because of what your last calls did: "


def bash(command: str) -> tuple[str, dict[str, Any]]:
    return ("bash", {"command": command, "description": "Run a step"})


async def run(server: OpencodeServer, http, title: str, pattern, users: int = 1):
    client = server.client(http)
    session = await client.create_session(title)
    await client.prompt_async(session["id"], script(pattern, len(pattern), delay=MODEL_DELAY))
    return session, await client.wait_idle(session["id"], 120, user_messages=users)


def refused_in_band(monitor: MonitorProcess, session, messages, rule: str, calls: int) -> dict:
    """Asserts the run's last call was refused with the feedback and the model answered in
    the same run; the refusal's text."""
    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * (calls - 1) + ["error"]
    error = parts[-1]["state"]["error"]
    assert error.startswith(REFUSED)
    assert [m["info"]["role"] for m in messages].count("user") == 1  # no feedback message
    assert all(m["info"].get("error") is None for m in messages)  # no abort
    assert [p["text"] for p in messages[-1]["parts"] if p["type"] == "text"] == [DEFAULT_ANSWER]
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["rule"]) == (session["id"], rule)
    assert (outcome["outcome"], outcome["via"]) == ("blocked", "plugin")
    assert monitor.events("feedback.sent") == []
    return {"error": error, **outcome}


async def test_a_no_progress_loop_is_refused_at_its_next_call(
    plugin_server, start_monitor, http, socket_path
):
    monitor = await start_watching(
        start_monitor, plugin_server, "--plugin-socket", str(socket_path)
    )
    pattern = [bash(f"printf '{CHECK}\\n' > check.txt")]
    for i in range(5):
        pattern += [bash(f"printf 'v{i}' > src.txt"), bash("cat check.txt")]
    pattern += [bash("printf 'v5' > src.txt")]  # the 12th: refused, never written
    session, messages = await run(plugin_server, http, "no progress", pattern)
    refused = refused_in_band(monitor, session, messages, "no_progress", 12)
    assert refused["call_index"] == 11  # found on the 5th check's outcome
    assert "the same result from bash 5 times, with 4 changes in between" in refused["error"]
    assert "Find that out before you edit again" in refused["error"]
    assert (plugin_server.project / "src.txt").read_text() == "v4"


async def test_a_spent_budget_refuses_the_next_call(
    plugin_server, start_monitor, http, socket_path
):
    monitor = await start_watching(
        start_monitor, plugin_server, "--plugin-socket", str(socket_path), "--run-budget", "steps=3"
    )
    pattern = [bash(f"echo step {i} >> steps.txt") for i in range(4)]
    session, messages = await run(plugin_server, http, "budget", pattern)
    refused = refused_in_band(monitor, session, messages, "budget", 4)
    assert "the run's budget of 3 steps was reached (3 steps spent)" in refused["error"]
    assert "Write a short summary" in refused["error"]
    lines = (plugin_server.project / "steps.txt").read_text().splitlines()
    assert lines == ["step 0", "step 1", "step 2"]


async def test_opencode_run_on_a_failure_loop_prints_no_abort(
    plugin_server, opencode_bin, start_monitor, socket_path
):
    monitor = await start_watching(
        start_monitor, plugin_server, "--plugin-socket", str(socket_path)
    )
    failing = [bash(f"ls missing-{n}") for n in range(5)]
    code, output = await opencode_run(plugin_server, opencode_bin, script(failing, 5))
    assert code == 0, output
    assert "did not run" in output and "Aborted" not in output
    assert output.rstrip().endswith(DEFAULT_ANSWER)
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["rule"], outcome["outcome"], outcome["call_index"]) == ("failure", "blocked", 4)


async def test_a_run_that_ends_before_a_next_call_gets_the_feedback_for_the_next_time(
    plugin_server, start_monitor, http, socket_path
):
    monitor = await start_watching(
        start_monitor, plugin_server, "--plugin-socket", str(socket_path)
    )
    failing = [bash(f"ls missing-{n}") for n in range(4)]  # then the model answers
    session, messages = await run(plugin_server, http, "failures, then an answer", failing)
    [outcome] = await monitor.wait_event("intervention.outcome")
    assert (outcome["rule"], outcome["outcome"], outcome["call_index"]) == ("failure", "nudged", 4)
    assert outcome["late"] == "run ended before the abort"
    await monitor.wait_event("feedback.sent")
    client = plugin_server.client(http)
    messages = await client.messages(session["id"])
    users = user_texts(messages)
    assert len(users) == 2 and users[1].startswith(MARK)  # stored, no new turn
    assert messages[-1]["info"]["role"] == "user"
    assert all(m["info"].get("error") is None for m in messages)  # nothing aborted
    assert [p["state"]["status"] for p in tool_parts(messages)] == ["completed"] * 4
