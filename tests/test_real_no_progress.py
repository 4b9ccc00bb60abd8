"""Issue 31's `no_progress` loop of real edits against the real `opencode serve` with the
monitor's plugin installed: the model edits one file, another line each time (no edit rewrites
a line an earlier one added), and reruns a check whose output never changes. The finding is
made on the 5th rerun's outcome, after it ran, and the plugin's question before the next call
refuses that call in band: the model reads the refusal and answers in the same run (no abort,
no feedback message, one intervention). Its legitimate twin, the same unrelated check after
edits of three files in turn, is left alone."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.core.feedback import MARK
from monitor.kit.sandbox import OpencodeServer, tool_parts
from monitor.kit.scripted_model import DEFAULT_ANSWER, script
from tests.harness import MODEL_DELAY, STATUS_FLAGS, seen_idle, start_watching, user_texts

pytestmark = pytest.mark.real_server

REFUSED = MARK + "this call was refused and did not run, because of what your last calls did: "
ERROR = "ValueError: bad total"
# Imports the module the edits change, then fails the same way whatever they did.
CHECK_PY = f"import sys\n\nimport calc\n\nprint({ERROR!r})\nsys.exit(1 + 0 * calc.a0)\n"
CALC_PY = "".join(f"a{k} = 0\n" for k in range(10))
LINT = "2 warnings (unused import in legacy/old.py)"
LINT_PY = f"print({LINT!r})\n"

Call = tuple[str, dict[str, Any]]


def bash(command: str) -> Call:
    return ("bash", {"command": command, "description": "Run the check"})


def edit(path: str, old: str, new: str) -> Call:
    return ("edit", {"filePath": path, "oldString": old, "newString": new})


async def run(server: OpencodeServer, http, title: str, pattern: list[Call]):
    """The session and its messages once the scripted run is over (the model's answer)."""
    client = server.client(http)
    session = await client.create_session(title)
    await client.prompt_async(session["id"], script(pattern, len(pattern), delay=MODEL_DELAY))
    return session, await client.wait_idle(session["id"], 120)


async def test_rewrites_of_one_line_with_the_same_check_result_are_refused_in_band(
    plugin_server, start_monitor, http, socket_path
):
    """Run the check, then rewrite `a0 = k` to `a0 = k+1` for k = 0, 1, ..., each followed by
    the check again (issue 44: what the real loops of this shape do, coming back to the text
    they touched; a list worked through line by line is progress, tests/test_progress_rules).
    The first edit is a place new to the run (the check's count starts over from it), every
    later one rewrites the line an earlier edit wrote: the check's 5th rerun (call 11)
    completes the loop, and the next call (call 12, the rewrite to `a0 = 6`) is refused in
    band, never applied."""
    (plugin_server.project / "check.py").write_text(CHECK_PY)
    (plugin_server.project / "calc.py").write_text(CALC_PY)
    monitor = await start_watching(
        start_monitor, plugin_server, "--plugin-socket", str(socket_path)
    )
    check = bash("python3 check.py")
    pattern = [check]
    for k in range(5):
        pattern += [edit("calc.py", f"a0 = {k}", f"a0 = {k + 1}"), check]
    pattern += [edit("calc.py", "a0 = 5", "a0 = 6")]  # the 12th: refused, never applied
    session, messages = await run(plugin_server, http, "one line rewritten", pattern)

    parts = tool_parts(messages)
    assert [(p["tool"], p["state"]["status"]) for p in parts] == [
        *[("bash", "completed"), ("edit", "completed")] * 5,
        ("bash", "completed"),
        ("edit", "error"),
    ], monitor.output()
    checks = [p for p in parts if p["tool"] == "bash"]
    # The check ran 6 times (calls 1, 3, ..., 11), failing the same way every time.
    assert [(c["state"]["output"], c["state"]["metadata"]["exit"]) for c in checks] == [
        (f"{ERROR}\n", 1)
    ] * 6
    [detected] = monitor.events("loop.detected")
    assert (detected["session_id"], detected["rule"]) == (session["id"], "no_progress")
    assert detected["call_index"] == 11  # the check's 5th rerun (its 6th run)
    assert detected["part_id"] == checks[5]["id"]
    # One change per edit: the server's own signals of an edit (`file.edited`) are that edit.
    assert detected["finding"] == "the same result from bash 5 times, with 4 changes in between"

    refused = parts[11]
    assert refused["state"]["input"] == pattern[11][1]
    error = refused["state"]["error"]
    assert error.startswith(REFUSED + "the same result from bash 5 times"), error
    assert "Find that out before you edit again" in error
    assert (plugin_server.project / "calc.py").read_text() == CALC_PY.replace(
        "a0 = 0\n", "a0 = 5\n"
    )  # rewritten five times, the sixth never applied
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["rule"]) == (session["id"], "no_progress")
    assert (outcome["outcome"], outcome["via"], outcome["call_index"]) == ("blocked", "plugin", 11)
    # In band: no abort, no feedback message; the model read the refusal and answered.
    assert len(user_texts(messages)) == 1
    assert all(m["info"].get("error") is None for m in messages)
    assert [p["text"] for p in messages[-1]["parts"] if p["type"] == "text"] == [DEFAULT_ANSWER]
    assert monitor.events("feedback.sent") == []


async def test_edits_of_three_files_in_turn_with_the_same_unrelated_check_are_left_alone(
    plugin_server, start_monitor, http, socket_path
):
    """tests/corpus/w-legit-distinct-edits-same-check.sse for real: one TODO after another,
    in m0.py, m1.py, m2.py in turn, each edit followed by a lint whose output (2 warnings
    elsewhere) never changes. Every call runs and nothing is detected, asserted once the
    monitor has seen the session go idle."""
    todos = 10
    for m in range(3):
        body = "".join(f"# TODO {i}: validate\n" for i in range(m, todos, 3))
        (plugin_server.project / f"m{m}.py").write_text(body)
    (plugin_server.project / "lint.py").write_text(LINT_PY)
    monitor = await start_watching(
        start_monitor, plugin_server, "--plugin-socket", str(socket_path), *STATUS_FLAGS
    )
    [listening] = await monitor.wait_event("metrics.listening")
    lint = bash("python3 lint.py")
    pattern: list[Call] = []
    for i in range(todos):
        pattern += [edit(f"m{i % 3}.py", f"# TODO {i}: validate", f"check_{i}(value)"), lint]
    session, messages = await run(plugin_server, http, "one TODO after another", pattern)
    await seen_idle(http, f"{listening['host']}:{listening['port']}", session["id"])

    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * len(pattern)
    assert [p["state"]["output"] for p in parts if p["tool"] == "bash"] == [f"{LINT}\n"] * todos
    for m in range(3):
        body = (plugin_server.project / f"m{m}.py").read_text()
        assert body == "".join(f"check_{i}(value)\n" for i in range(m, todos, 3))
    assert monitor.events("loop.detected") == []
    assert monitor.events("intervention.outcome") == []
    assert len(user_texts(messages)) == 1
    assert [p["text"] for p in messages[-1]["parts"] if p["type"] == "text"] == [DEFAULT_ANSWER]
