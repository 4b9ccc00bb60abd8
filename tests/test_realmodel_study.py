"""The real-model study's pure parts (bench/realmodel), on small made-up inputs: how the model's
next action after an intervention is classified, which errors are refusals, the tasks' checks and
the arms' names. The study itself runs a model for tens of minutes and is not part of the suite."""

import json

import pytest

from bench.realmodel.analyze import (
    calls_of,
    carries_mark,
    final_text,
    interventions_of,
    key,
    reaction,
    task_completed,
)
from bench.realmodel.run import ArmSpec, parse_arm, parse_arms
from monitor.core.feedback import MARKS

TOOLS = ["bash", "edit", "read", "write"]  # the minimal agent's
READ = {"tool": "read", "input": {"filePath": "README.md"}}
CAT = {"tool": "bash", "input": {"command": "cat VERSION", "description": "Show VERSION"}}
LS = {"tool": "bash", "input": {"command": "ls"}}


def k(call):
    return key(call["tool"], call["input"])


def invalid(name):
    error = f"Model tried to call unavailable tool '{name}'. Available tools: bash, edit, read."
    return {"tool": "invalid", "input": {"tool": name, "error": error}}


def next_action(*later, named=CAT, block=(CAT, READ), tools=TOOLS, held=False):
    return reaction(k(named), {k(c) for c in block}, later, tools, held)


def test_the_same_call_again_is_same_whatever_its_description():
    again = {"tool": "bash", "input": {"command": "cat VERSION", "description": "Read it again"}}
    assert next_action(([again, LS], "")) == "same"


def test_another_call_of_the_named_block_is_other_in_loop():
    assert next_action(([READ], "")) == "other-in-loop"


def test_a_call_to_an_existing_tool_outside_the_block_is_a_change():
    assert next_action(([LS], "")) == "changed"


def test_an_unknown_tool_is_no_such_tool_and_guard_name_when_named_after_the_guard():
    assert next_action(([invalid("summary")], "")) == "no-such-tool"
    assert next_action(([invalid("loop-guard")], "")) == "guard-name"
    assert next_action(([invalid("opencode-loop-monitor")], "")) == "guard-name"
    assert next_action(([invalid("Monitor")], "")) == "guard-name"
    # A tool OpenCode has but this agent lacks, reported under its own name.
    assert next_action(([{"tool": "glob", "input": {"pattern": "*"}}], "")) == "no-such-tool"
    # Calling OpenCode's `invalid` itself, with its own error text (the model parrots it).
    parrot = {"tool": "invalid", "input": {"error": "Model tried to call unavailable tool"}}
    assert next_action(([parrot], "")) == "no-such-tool"


def test_without_a_known_tool_set_only_invalid_counts_as_no_such_tool():
    glob = {"tool": "glob", "input": {"pattern": "*"}}
    assert next_action(([glob], ""), tools=None) == "changed"
    assert next_action(([invalid("loop_guard")], ""), tools=None) == "guard-name"


def test_a_repeated_call_to_an_unknown_tool_is_same():
    assert next_action(([invalid("summary")], ""), named=invalid("summary")) == "same"


def test_text_without_a_call_is_text_and_empty_steps_are_skipped():
    assert next_action(([], "  \n"), ([], "VERSION now says 0.2.0."), ([LS], "")) == "text"
    assert next_action(([], ""), ([READ], "")) == "other-in-loop"
    # A step with text and a call: the call is the action.
    assert next_action(([LS], "Let me look.")) == "changed"


def test_no_later_action_is_held_when_held_else_nothing():
    assert next_action(([], ""), held=True) == "held"
    assert next_action(held=True) == "held"
    assert next_action(([], " ")) == "nothing"
    assert next_action() == "nothing"


@pytest.mark.parametrize("mark", MARKS)
def test_every_mark_the_guard_used_is_a_refusal(mark):
    assert carries_mark(f"Error: {mark}4 calls (bash, read) repeated 3 times. Do not retry.")


def test_both_marks_are_recognised_and_other_errors_are_not():
    assert carries_mark("[opencode-loop-monitor] Loop guard: this call was refused")
    assert carries_mark("Loop guard: the same call 3 times")
    assert not carries_mark("Error: file not found: README.md")
    assert not carries_mark("The operation was aborted.")


def frame(part):
    return {"type": "message.part.updated", "properties": {"part": part}}


def test_a_recorded_call_with_an_old_mark_is_refused_and_not_executed():
    def part(pid, error):
        state = {"status": "error", "input": {"command": "ls"}, "error": error}
        return {
            "id": pid,
            "sessionID": "s1",
            "messageID": "m1",
            "type": "tool",
            "tool": "bash",
        }, state

    frames = []
    for pid, error in [
        ("p1", "Loop guard: the same call 3 times"),
        ("p2", "[opencode-loop-monitor] Loop guard: this call was refused"),
        ("p3", "The operation was aborted."),
    ]:
        head, state = part(pid, error)
        frames.append(frame({**head, "state": state}))
    frames.append(frame({**part("p4", "")[0], "sessionID": "s2", "state": {"status": "running"}}))
    calls, _ = calls_of(frames, "s1")
    assert [(c["part_id"], c["refused"], c["executed"], c["aborted"]) for c in calls] == [
        ("p1", True, False, False),
        ("p2", True, False, False),
        ("p3", False, True, True),
    ]


def test_the_typo_check(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# calc\n\nA tiny calculator library for the command line.\n")
    assert task_completed("typo", tmp_path, "")
    readme.write_text("# calc\n\nA tiny calculator libary for the command line.\n")
    assert not task_completed("typo", tmp_path, "")
    readme.write_text("A library. A libary.\n")
    assert not task_completed("typo", tmp_path, "")
    readme.unlink()
    assert not task_completed("typo", tmp_path, "")


def test_the_version_check(tmp_path):
    assert not task_completed("version", tmp_path, "")
    for text, done in [("0.2.0\n", True), ("0.2.0", True), ("0.1.0\n", False), ("v0.2.0\n", False)]:
        (tmp_path / "VERSION").write_text(text)
        assert task_completed("version", tmp_path, "") is done, text


def test_the_tests_check_runs_unittest_in_the_folder(tmp_path):
    (tmp_path / "calc.py").write_text("def sub(a, b):\n    return a + b\n")
    (tmp_path / "test_calc.py").write_text(
        "import unittest\n\nimport calc\n\n\nclass T(unittest.TestCase):\n"
        "    def test_sub(self):\n        self.assertEqual(calc.sub(5, 3), 2)\n"
    )
    assert not task_completed("tests", tmp_path, "")
    (tmp_path / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    assert task_completed("tests", tmp_path, "")


def test_the_summary_check_reads_the_last_assistant_text(tmp_path):
    def message(role, *texts):
        parts = [{"type": "text", "text": t} for t in texts]
        return {"info": {"role": role}, "parts": [*parts, {"type": "tool", "tool": "bash"}]}

    msgs = [
        message("user", "List the files and summarise the calc project."),
        message("assistant", "This is a calculator library."),
        message("assistant", "The files are ", "README.md and VERSION."),
        message("assistant"),
        message("user", "Loop guard: stop."),
    ]
    assert final_text(msgs) == "The files are README.md and VERSION."
    assert not task_completed("summary", tmp_path, final_text(msgs))
    assert final_text(msgs[:2]) == "This is a calculator library."
    assert task_completed("summary", tmp_path, final_text(msgs[:2]))
    assert task_completed("summary", tmp_path, "Calc: add, sub, mul.")
    assert final_text(msgs[:1]) == ""


def test_an_arm_names_its_letter_and_revision():
    assert parse_arm("C@abc") == ArmSpec("C", "abc")
    assert parse_arm("C") == ArmSpec("C", "worktree") == parse_arm("C@worktree")
    assert parse_arm("A") == ArmSpec("A", "worktree")
    arm = parse_arm("C@b9d3bb8")
    assert (arm.letter, arm.rev, arm.key, arm.fs_name) == ("C", "b9d3bb8", "C@b9d3bb8", "C-b9d3bb8")
    assert parse_arm("B@origin/main~2").fs_name == "B-origin-main-2"
    assert parse_arm("B").fs_name == "B"
    assert [a.key for a in parse_arms(["A", "C@b9d3bb8", "C"])] == ["A", "C@b9d3bb8", "C"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("D", "the letter must be A, B or C"),
        ("c@HEAD", "the letter must be A, B or C"),
        ("", "the letter must be A, B or C"),
        ("C@", "a revision must follow '@'"),
        ("A@b9d3bb8", "arm A runs no monitor"),
    ],
)
def test_a_bad_arm_is_refused_with_a_clear_error(spec, says):
    with pytest.raises(ValueError, match=says):
        parse_arm(spec)


def test_two_arms_with_one_file_name_are_refused():
    with pytest.raises(ValueError, match="two arms would share a name"):
        parse_arms(["C", "C@worktree"])
    with pytest.raises(ValueError, match="two arms would share a name"):
        parse_arms(["C@a/b", "C@a-b"])


def test_the_key_leaves_out_what_the_monitor_leaves_out():
    assert key("bash", {"command": "ls", "description": "x", "timeout": 5}) == json.dumps(
        ["bash", {"command": "ls"}]
    )


def test_interventions_read_from_a_recording_and_a_monitor_log():
    """A 2-call cycle refused in band (the model then reads again: other-in-loop), a text loop
    (the model then answers), and a hold with nothing after it."""
    frames = []

    def message(mid, role):
        info = {"id": mid, "sessionID": "s1", "role": role, "time": {"created": 0}}
        frames.append({"type": "message.updated", "properties": {"info": info}})

    def tool(pid, mid, call, error=""):
        state = {
            "status": "error" if error else "completed",
            "input": call["input"],
            "error": error,
        }
        part = {"id": pid, "sessionID": "s1", "messageID": mid, "type": "tool", "state": state}
        frames.append(frame({**part, "tool": call["tool"], "callID": "c" + pid}))

    def text(pid, mid, words):
        part = {"id": pid, "sessionID": "s1", "messageID": mid, "type": "text", "text": words}
        frames.append(frame(part))

    message("u1", "user")
    message("a1", "assistant")
    tool("p1", "a1", READ)
    tool("p2", "a1", CAT)
    tool("p3", "a1", READ)
    tool("p4", "a1", CAT, error=MARKS[0] + "this call was refused")
    tool("p5", "a1", LS)  # written in the same step, before the refusal reached the model
    message("a2", "assistant")
    text("t1", "a2", "I will read it. I will read it. I will read it.")
    tool("p6", "a2", READ)
    message("a3", "assistant")
    text("t2", "a3", "VERSION says 0.1.0.")
    message("a4", "assistant")
    tool("p7", "a4", CAT)
    calls, messages = calls_of(frames, "s1")

    def loop(part_id, call_index, outcome, **fields):
        found = {"session_id": "s1", "part_id": part_id, "call_index": call_index, **fields}
        return [
            {"event": "loop.detected", **found},
            {"event": "intervention.outcome", **found, "outcome": outcome},
        ]

    log = [
        *loop("p4", 4, "blocked", rule="cycle", cycle_length=2, call_id="cp4"),
        *loop("t1", 1, "nudged", rule="text_repeat", cycle_length=1),
        *loop("p7", 7, "held", rule="cycle", cycle_length=1, call_id="cp7"),
        *loop("x9", 9, "aborted", rule="cycle", cycle_length=1),
    ]
    found = interventions_of(calls, messages, log, TOOLS)
    assert [(iv["call"], iv["outcome"], iv["reaction"]) for iv in found] == [
        (4, "blocked", "other-in-loop"),
        (None, "nudged", "text"),
        (7, "held", "held"),
        (None, "aborted", "unmatched"),
    ]
    assert found[0]["same_step_after"] == 1
    assert found[0]["next"] == "read(README.md)"
    assert [c["refused"] for c in calls] == [False, False, False, True, False, False, False]
