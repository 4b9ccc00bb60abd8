"""Every detection rule on the real OpenCode 2.2.5 (`@opencode/cli`), as on 1.18.33.

The 1.18.33 tests each of these follows: tests/test_real_rules.py (failure),
tests/test_real_circles_runaway.py (circles, runaway), tests/test_real_text.py (text loops),
tests/test_real_progress.py (revisit, budgets), tests/test_real_no_progress.py and
tests/test_real_in_band.py (no_progress refused in band by the plugin), tests/test_real_tree.py
(subagent trees); `cycle` is tests/test_real_v2_guard.py's. Each drives a real, isolated
`opencode serve` of 2.2.5 with the scripted model (which speaks 2.x's `read {path}`,
`shell {command}`, `edit {path, oldString, newString}`, `subagent {agent, description,
prompt}`) and the monitor's console script, and asserts on the server's own record of the
session (`/api/session/{id}/message`) and the monitor's JSON log: the call it stops at, the
rule, the feedback the model reads, no call after the stop, the model's answer.

The rules know 2.x's `shell` as `bash` (core/profile.py `server_call`); the decision, its log
and the feedback name it as 2.x does, `shell`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from monitor.core.feedback import MARK
from monitor.kit.sandbox import OpencodeServer2, ProjectClient2, free_loopback_port, tool_calls
from monitor.kit.scripted_model import DEFAULT_ANSWER, ScriptedModel, script
from tests.corpus.record_text import (
    PARAGRAPH,
    REASONING,
    code_block,
    different_lines,
    numbered_list,
    table,
)
from tests.harness import MODEL_DELAY, seen_idle
from tests.monitor_process import MonitorProcess
from tests.real_v2 import (
    answers,
    no_refused_request,
    users,
    watching,
    watching_with_the_plugin,
)

pytestmark = pytest.mark.real_server

Call = tuple[str, dict[str, Any]]
Record = list[dict[str, Any]]


def shell(command: str) -> Call:
    return ("shell", {"command": command})


def edit(path: str, old: str, new: str) -> Call:
    return ("edit", {"path": path, "oldString": old, "newString": new})


async def run(
    client: ProjectClient2,
    title: str,
    pattern: list[Call],
    *,
    runs: int = 1,
    delay: float = MODEL_DELAY,
    **fields: Any,
) -> tuple[str, Record]:
    """A session made to follow `pattern` once, and its record once its `runs`-th run (2: the
    feedback's, after an interrupt) is over."""
    session = await client.create_session(title)
    prompt = script(pattern, len(pattern), delay=delay, **fields)
    await client.prompt(session["id"], prompt)
    return session["id"], await client.wait_idle(session["id"], 120, runs=runs)


def stopped(
    monitor: MonitorProcess,
    session_id: str,
    record: Record,
    rule: str,
    answer: str = DEFAULT_ANSWER,
) -> dict[str, Any]:
    """The one intervention: the run interrupted at a call of `rule`'s, the feedback posted
    and answered in a second run; the loop's `loop.detected`."""
    [detected] = monitor.events("loop.detected")
    [outcome] = monitor.events("intervention.outcome")
    assert (detected["session_id"], detected["rule"]) == (session_id, rule)
    assert (outcome["session_id"], outcome["rule"], outcome["outcome"]) == (
        session_id,
        rule,
        "aborted",
    )
    [feedback] = monitor.events("feedback.sent")
    assert feedback["session_id"] == session_id
    said = users(record)
    assert len(said) == 2 and said[1].startswith(MARK)
    assert answers(record)[-1] == answer
    assert [item["outcome"] for item in record if item["type"] == "idle"] == [
        "interrupted",
        "succeeded",
    ]
    no_refused_request(monitor)
    assert monitor.events("frame.malformed") == []  # every 2.2.5 frame of the run typed
    return detected


# failure: the same failure, the command rewritten each time (ls exits 2, the same error).
REWRITTEN = [
    shell(command)
    for command in ["ls no-such-dir", "ls -l no-such-dir", "cd . && ls no-such-dir"]
    + ["ls -a no-such-dir"] * 5
]


async def test_the_same_shell_failure_rewritten_is_stopped_at_the_4th_call(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    monitor = await watching(start_monitor, opencode2_server)
    session_id, record = await run(opencode2_client, "failure", REWRITTEN, runs=2)

    calls = tool_calls(record)
    assert [call["state"]["input"]["command"] for call in calls[:3]] == [
        args["command"] for _, args in REWRITTEN[:3]
    ]
    # The 4th was interrupted as it ran or just after; none after it.
    assert len(calls) == 4 and calls[3]["state"]["input"] == REWRITTEN[3][1]
    # 2.x carries the shell's exit in the result's metadata.
    assert [call["state"]["metadata"]["exit"] for call in calls[:3]] == [2] * 3
    detected = stopped(monitor, session_id, record, "failure")
    assert (detected["call_index"], detected["cycle_length"], detected["repetitions"]) == (4, 1, 4)
    assert detected["part_id"].endswith(":" + calls[3]["id"]) and detected["tools"] == ["shell"]
    assert "the same error 4 times in a row (shell)" in users(record)[1]


async def test_a_poll_that_waits_is_a_loop_only_past_its_allowance(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    # The same shell call answered "queued" again and again: waiting, not stopped at the 4th
    # as a cycle but at the allowance (`--wait-calls`, 20 by default; 6 here to be quick).
    monitor = await watching(start_monitor, opencode2_server, "--wait-calls", "6")
    poll = [shell("sleep 0.1 && echo 'job 4711: queued'")]
    session_id, record = await run(opencode2_client, "wait", poll * 10, runs=2)

    calls = tool_calls(record)
    assert len(calls) == 6 and [call["state"]["metadata"]["exit"] for call in calls[:5]] == [0] * 5
    detected = stopped(monitor, session_id, record, "wait")
    assert (detected["call_index"], detected["repetitions"]) == (6, 6)
    assert "1 call (shell) repeated 6 times while waiting" in users(record)[1]


# circles: searches for what is not there, each naming its own name, so neither `cycle` nor
# `failure` sees a repeat (`find` prints nothing, exit 0; `ls` of a missing name, exit 2).
SEARCHES = [
    shell(f"find . -name 'nosuch{n}*'") if n % 2 else shell(f"ls nosuch{n}") for n in range(12)
]


async def test_searches_that_find_nothing_are_stopped_as_circles_at_the_10th(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    monitor = await watching(start_monitor, opencode2_server)
    session_id, record = await run(opencode2_client, "circles", SEARCHES, runs=2)

    calls = tool_calls(record)
    assert len(calls) == 10
    assert [call["state"]["metadata"]["exit"] for call in calls[:9]] == [2, 0] * 4 + [2]
    detected = stopped(monitor, session_id, record, "circles")
    assert detected["call_index"] == 10 and detected["part_id"].endswith(":" + calls[9]["id"])
    assert (
        "10 of the last 10 calls (shell) were searches that found nothing new" in users(record)[1]
    )


async def test_a_while_true_shell_call_is_stopped_past_its_bound(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    # 2.2.5 says nothing of a running shell's output on the stream (`tool.progress` names
    # its process only): the call's time bound, from its `tool.called`, is what stops it.
    monitor = await watching(start_monitor, opencode2_server, "--call-seconds", "3")
    forever = [shell("while true; do sleep 0.2; done")]
    session_id, record = await run(opencode2_client, "runaway", forever, runs=2)

    [call] = tool_calls(record)
    assert call["state"]["status"] == "error"  # interrupted
    took = (call["time"]["completed"] - call["time"]["ran"]) / 1000
    assert 3 <= took < 30  # far within the shell's own timeout
    detected = stopped(monitor, session_id, record, "runaway")
    assert detected["part_id"].endswith(":" + call["id"]) and detected["call_index"] == 1
    assert "one shell call was still running after 3 s" in users(record)[1]


# Text loops: the scripted model streams its answer in deltas of CHUNK characters.
CHUNK = 12
GAP = 0.004  # seconds between deltas


def text_script(**fields: Any) -> str:
    return script([("read", {"path": "README.md"})], 0, chunk=CHUNK, chunk_delay=GAP, **fields)


class Deltas:
    """The text deltas of one session as `/api/event` carries them, read beside the monitor:
    2.2.5 sends the model's stream in deltas of its own (the 12-character chunks gathered
    into a few hundred characters each), so where a text loop completes is told by them."""

    def __init__(self, server: OpencodeServer2, http: aiohttp.ClientSession) -> None:
        self.server, self.http = server, http
        # (session id, "text" or "reasoning") -> its deltas, in order
        self.texts: dict[tuple[str, str], list[str]] = {}
        self.connected = asyncio.Event()

    async def follow(self) -> None:
        async with self.http.get(
            f"{self.server.url}/api/event",
            headers=self.server.headers,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as response:
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                frame = json.loads(line[len("data: ") :])
                self.connected.set()  # the first frame: server.connected
                kind = frame["type"].removeprefix("session.").removesuffix(".delta")
                if kind in ("text", "reasoning") and frame["type"].endswith(".delta"):
                    data = frame["data"]
                    key = (data["sessionID"], kind)
                    self.texts.setdefault(key, []).append(data["delta"])

    def completing(self, session_id: str, kind: str, length: int) -> int:
        """The delta (counted from 1) that brings the session's text or reasoning to `length`
        characters."""
        total = 0
        for n, delta in enumerate(self.texts[session_id, kind], 1):
            total += len(delta)
            if total >= length:
                return n
        raise AssertionError(f"the text never reached {length} characters")


def reasoning(record: Record) -> list[str]:
    return [
        entry["text"]
        for item in record
        if item.get("type") == "assistant"
        for entry in item.get("content", [])
        if entry.get("type") == "reasoning"
    ]


# How soon the stream is stopped depends on the monitor and the server getting the CPU at once.
@pytest.mark.alone
@pytest.mark.parametrize("kind", ["text", "reasoning"])
async def test_a_passage_streamed_again_and_again_is_stopped_at_its_5th_copy(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
    http: aiohttp.ClientSession,
    kind: str,
) -> None:
    deltas = Deltas(opencode2_server, http)
    following = asyncio.create_task(deltas.follow())
    if kind == "text":
        prompt, repeated, units = text_script(answer=PARAGRAPH, repeat=300), PARAGRAPH, 4
    else:
        prompt = text_script(answer="Found it.", reasoning=REASONING, reasoning_repeat=300)
        repeated, units = REASONING, 2
    try:
        await asyncio.wait_for(deltas.connected.wait(), 30)
        monitor = await watching(start_monitor, opencode2_server)
        session = await opencode2_client.create_session("text loop")
        await opencode2_client.prompt(session["id"], prompt)
        record = await opencode2_client.wait_idle(session["id"], 60, runs=2)
    finally:
        following.cancel()

    # The model answers the feedback with its scripted answer once, not repeating it.
    answer = PARAGRAPH if kind == "text" else "Found it."
    detected = stopped(monitor, session["id"], record, "text_repeat", answer=answer)
    assert detected["tools"] == []
    assert (detected["cycle_length"], detected["repetitions"]) == (units, 5)
    # The 5th copy completes on this delta (its first character after it, as on 1.x).
    completing = deltas.completing(session["id"], kind, 5 * len(repeated) - 1)
    assert detected["call_index"] == completing
    looped = (answers if kind == "text" else reasoning)(record)[0]
    assert looped.startswith(repeated * 5)
    assert len(looped) < 30 * len(repeated)  # stopped within a tenth of its 300 copies
    said = users(record)[1]
    where = "answer" if kind == "text" else "reasoning"
    assert f"in your {where} you wrote the same passage of {units} sentences 5 times in a row" in (
        said
    )
    assert repeated.split(".")[0] not in said  # named, never quoted
    assert answers(record)[-1:] == [answer] and len(monitor.events("loop.detected")) == 1


async def test_long_legitimate_answers_are_streamed_to_their_end(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
    http: aiohttp.ClientSession,
) -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(start_monitor, opencode2_server, "--metrics-addr", address)
    texts = {
        "different lines": different_lines(),
        "code block": code_block(),
        "table": table(),
        "numbered list": numbered_list(),
    }
    sessions = {name: (await opencode2_client.create_session(name))["id"] for name in texts}
    await asyncio.gather(
        *(
            opencode2_client.prompt(sessions[name], text_script(answer=texts[name]))
            for name in texts
        )
    )
    for name, text in texts.items():
        record = await opencode2_client.wait_idle(sessions[name], 60)
        assert answers(record) == [text], name  # streamed to its end
        assert len(users(record)) == 1, name
        await seen_idle(http, address, sessions[name])  # the monitor read the whole answer
    assert monitor.events("loop.detected") == [] and monitor.events("intervention.outcome") == []


async def test_paging_through_15_views_over_and_over_is_stopped_as_a_revisit(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    monitor = await watching(start_monitor, opencode2_server)
    views = 15
    pattern = [shell("seq 1 1500 > big.txt")] + [
        ("read", {"path": "big.txt", "offset": (k % views) * 100 + 1, "limit": 100})
        for k in range(3 * views)
    ]
    session_id, record = await run(opencode2_client, "paging", pattern, runs=2)

    calls = tool_calls(record)
    # Call 1 writes, calls 2-16 are new views, the 12th revisit is call 16 + 12.
    assert len(calls) == 28
    assert [call["state"]["status"] for call in calls[:27]] == ["completed"] * 27
    detected = stopped(monitor, session_id, record, "revisit")
    assert (detected["call_index"], detected["tools"]) == (28, ["read"])
    assert detected["part_id"].endswith(":" + calls[27]["id"])
    assert "Nothing has changed since you read it" in users(record)[1]


async def test_narration_before_15_different_reads_is_left_alone(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    start_monitor: Any,
    http: aiohttp.ClientSession,
) -> None:
    # `text_steps` leaves the same words at each step alone when the calls they precede differ.
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await watching(start_monitor, opencode2_server, "--metrics-addr", address)
    setup = shell('for i in $(seq 0 14); do echo "def x$i(): pass" > x$i.py; done')
    pattern = [setup] + [("read", {"path": f"x{k}.py"}) for k in range(15)]
    narration = "Let's look at the X method:"
    session_id, record = await run(opencode2_client, "narrated", pattern, delay=0, say=narration)
    await seen_idle(http, address, session_id)  # the monitor read the run to its end

    assert [call["state"]["status"] for call in tool_calls(record)] == ["completed"] * 16
    assert answers(record) == [narration] * 16 + [DEFAULT_ANSWER]
    assert monitor.events("loop.detected") == [] and len(users(record)) == 1


async def test_a_run_is_stopped_at_its_step_budget(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    monitor = await watching(start_monitor, opencode2_server, "--run-budget", "steps=10")
    pattern = [shell(f"echo step {n}") for n in range(30)]
    session_id, record = await run(opencode2_client, "budget", pattern, runs=2)

    detected = stopped(monitor, session_id, record, "budget")
    assert detected["finding"] == "the run's budget of 10 steps was reached (10 steps spent)"
    # Stopped at the end of the 10th step: 2.2.5 ends a step after its calls ran, so the
    # 10th call has run, and no later one was made.
    calls = tool_calls(record)
    assert [call["state"]["input"]["command"] for call in calls] == [
        f"echo step {n}" for n in range(10)
    ]
    assert [call["state"]["status"] for call in calls] == ["completed"] * 10
    assert detected["call_index"] == 10
    assert "Write a short summary" in users(record)[1]


# no_progress, refused in band by the plugin (tests/test_real_no_progress.py on 1.18.33).
REFUSED = MARK + "this call was refused and did not run, because of what your last calls did: "
ERROR = "ValueError: bad total"
# Imports the module the edits change, then fails the same way whatever they did.
CHECK_PY = f"import sys\n\nimport calc\n\nprint({ERROR!r})\nsys.exit(1 + 0 * calc.a0)\n"
CALC_PY = "".join(f"a{k} = 0\n" for k in range(10))


async def test_edits_rewriting_one_line_with_the_same_check_result_are_refused_in_band(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2, start_monitor: Any
) -> None:
    """The check, then `a0 = k` rewritten to `a0 = k+1` and the check again, five times: the
    check's 5th rerun (call 11) completes the loop after it ran, and the plugin's question
    before the next call (call 12, the rewrite to `a0 = 6`) refuses it in band: never
    applied, the model reads the refusal and answers in the same run."""
    server = opencode2_server
    (server.project / "check.py").write_text(CHECK_PY)
    (server.project / "calc.py").write_text(CALC_PY)
    monitor = await watching_with_the_plugin(start_monitor, server)
    check = shell("python3 check.py")
    pattern = [check]
    for k in range(5):
        pattern += [edit("calc.py", f"a0 = {k}", f"a0 = {k + 1}"), check]
    pattern += [edit("calc.py", "a0 = 5", "a0 = 6")]  # the 12th: refused, never applied
    session_id, record = await run(opencode2_client, "one line rewritten", pattern)

    calls = tool_calls(record)
    assert [(call["name"], call["state"]["status"]) for call in calls] == [
        *[("shell", "completed"), ("edit", "completed")] * 5,
        ("shell", "completed"),
        ("edit", "error"),
    ], monitor.output()
    checks = [call for call in calls if call["name"] == "shell"]
    assert [
        (
            "".join(c.get("text", "") for c in call["state"]["content"]),
            call["state"]["metadata"]["exit"],
        )
        for call in checks
    ] == [(f"{ERROR}\nExited with code 1", 1)] * 6
    [detected] = monitor.events("loop.detected")
    assert (detected["session_id"], detected["rule"], detected["call_index"]) == (
        session_id,
        "no_progress",
        11,
    )
    assert detected["part_id"].endswith(":" + checks[5]["id"])
    assert detected["finding"] == "the same result from shell 5 times, with 4 changes in between"

    refused = calls[11]
    assert refused["state"]["input"] == pattern[11][1]
    error = refused["state"]["error"]["message"]
    assert error.startswith(REFUSED + "the same result from shell 5 times"), error
    assert "Find that out before you edit again" in error
    # Rewritten five times, the sixth never applied.
    assert (server.project / "calc.py").read_text() == CALC_PY.replace("a0 = 0\n", "a0 = 5\n")
    [outcome] = monitor.events("intervention.outcome")
    assert (outcome["session_id"], outcome["rule"]) == (session_id, "no_progress")
    assert (outcome["outcome"], outcome["via"], outcome["call_index"]) == ("blocked", "plugin", 11)
    # In band: no interrupt, no feedback message; the model read the refusal and answered.
    assert len(users(record)) == 1 and monitor.events("feedback.sent") == []
    assert [item["outcome"] for item in record if item["type"] == "idle"] == ["succeeded"]
    assert answers(record) == [DEFAULT_ANSWER]
    no_refused_request(monitor)


# tree: 2.2.5 nests subagents only as deep as `experimental.subagent_depth` allows (a child
# of the default depth is offered no `subagent` tool); a person's own agent, with the depth
# raised, gives the runaway the reports show (anomalyco/opencode #37235).
RECURSER = {
    "experimental": {"subagent_depth": 10},
    "agents": {
        "recurser": {"description": "Hands the task on to another recurser", "mode": "subagent"}
    },
}


def chain(depth: int) -> str:
    """A script whose subagent runs a script whose subagent ..., `depth` levels down."""
    inner = script([("read", {"path": "README.md"})], 1)
    for level in range(depth, 0, -1):
        args = {"agent": "recurser", "description": f"level {level}", "prompt": inner}
        # A subagent's conversation holds more than its prompt ("loop" runs the pattern all
        # the same); the root's answers the monitor's feedback.
        inner = script(
            [("subagent", args)], 1, delay=0.3, after_feedback="loop" if level > 1 else "answer"
        )
    return inner


async def test_a_subagent_recursion_is_stopped_at_its_root_once_at_the_4th_level(
    opencode2_bin: Path,
    scripted_model: ScriptedModel,
    start_monitor: Any,
    http: aiohttp.ClientSession,
) -> None:
    async with OpencodeServer2(opencode2_bin, scripted_model.url, config=RECURSER) as server:
        monitor = await watching(start_monitor, server)
        client = server.client(http)
        root = await client.create_session("tree")
        await client.prompt(root["id"], chain(6))
        record = await client.wait_idle(root["id"], 90, runs=2)
        async with http.get(f"{server.url}/api/session", headers=server.headers) as response:
            sessions = (await response.json())["data"]
        parent = {s["id"]: s.get("parentID") for s in sessions}

        def depth(session_id: str) -> int:
            n = 0
            while parent.get(session_id):
                session_id, n = parent[session_id], n + 1
            return n

        detected = stopped(monitor, root["id"], record, "tree")
        assert depth(detected["part_id"]) == 4  # the rule names the child that tripped it
        # The interrupt of the root ends the whole tree: no fifth or sixth level was made.
        assert max(depth(session_id) for session_id in parent) == 4
        [call] = tool_calls(record)
        assert (call["name"], call["state"]["status"]) == ("subagent", "error")
        assert "depth 4" in users(record)[1]
