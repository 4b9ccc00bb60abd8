"""The rules beside `cycle`: same failure, waiting allowance, the OpenCode tool profile.

Given these tool calls, this decision: the rule, the call it stops at, what the model reads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from monitor.core.rules.cycle import Cycle
from monitor.core.rules.failure import FailureRun, failure_digest, normalize
from monitor.core.rules.waiting import answers_in_progress, waits_by_command
from monitor.core.tracker import SEED, Detection, Tracker
from tests.frames_factory import call, feed_all, tool_part


def bash_call(part: str, command: str, output: str = "", code: int = 0, **extra: Any) -> list:
    args = {"command": command, **extra}
    done = tool_part("s", part, "bash", "completed", args, output=output)
    done["properties"]["part"]["state"]["metadata"] = {"output": output, "exit": code}
    return [
        tool_part("s", part, "bash", "pending"),
        tool_part("s", part, "bash", "running", args),
        done,
    ]


def failing_read(part: str, path: str, message: str) -> list:
    args = {"filePath": path}
    return [
        tool_part("s", part, "read", "running", args),
        tool_part("s", part, "read", "error", args, error=message),
    ]


def decisions(frames: list, detection: Detection = Detection()) -> list[tuple[str, int, Cycle]]:
    return [
        (d.rule, d.call_index, Cycle(*d.finding.shape()[:2]))
        for d in feed_all(Tracker(detection), frames)
    ]


# -- failure ----------------------------------------------------------------------------------


def test_same_bash_failure_with_rewritten_commands_stops_at_the_4th():
    frames = []
    for n, command in enumerate(["ls x", "ls -l x", "cd . && ls x", "ls -a x", "ls x/"]):
        frames += bash_call(f"p{n}", command, "ls: cannot access 'x': No such file", 2)
    decision, again = feed_all(Tracker(), frames)
    assert (decision.rule, decision.call_index, decision.part_id) == ("failure", 4, "p3")
    # The 5th fails the same way while the 4th's intervention is under way: that loop again
    # (the stopped failure is armed), not a second intervention.
    assert (again.plan, again.part_id, again.prior_interventions) == ("defer", "p4", 0)
    assert (Cycle(*decision.finding.shape()[:2]), decision.finding.shape()[2]) == (
        Cycle(1, 4),
        ("bash",),
    )
    assert "the same error 4 times in a row (bash)" in decision.feedback


def test_error_state_with_changing_line_numbers_is_the_same_failure():
    frames = []
    for n in range(4):
        frames += failing_read(f"p{n}", f"f{n}", f"File not found at line {n}: /tmp/x{n}/f")
    assert decisions(frames) == [("failure", 4, Cycle(1, 4))]


def test_a_success_ends_the_run_of_failures():
    frames = []
    for n in range(3):
        frames += bash_call(f"a{n}", f"make {n}", "error", 1)
    frames += bash_call("ok", "make fix", "done", 0)
    for n in range(3):
        frames += bash_call(f"b{n}", f"make again {n}", "error", 1)
    assert decisions(frames) == []


def test_successes_never_feed_the_rule_even_silent_ones():
    frames = []
    for n in range(8):
        frames += bash_call(f"p{n}", f"mkdir d{n}", "", 0)
    assert decisions(frames) == []


def test_different_exit_status_is_a_different_failure():
    frames = []
    for n in range(4):
        frames += bash_call(f"p{n}", f"run {n}", "failed", 1 + n % 2)
    assert decisions(frames) == []


def test_failure_repeats_zero_switches_the_rule_off():
    frames = []
    for n in range(6):
        frames += bash_call(f"p{n}", f"ls {n}", "same error", 2)
    assert decisions(frames, Detection(failure_repeats=0)) == []
    assert decisions(frames, Detection(failure_repeats=6)) == [("failure", 6, Cycle(1, 6))]


def test_outcomes_of_calls_stopped_by_an_abort_are_not_taken():
    # Four identical reads: the cycle stops the run at the 4th's `running`; the 4th then ends
    # in error "Tool execution aborted", like the three parallel reads of the next attempt.
    frames = []
    for n in range(4):
        frames += [tool_part("s", f"p{n}", "read", "running", {"filePath": "a"})]
        if n < 3:
            frames += [tool_part("s", f"p{n}", "read", "completed", {"filePath": "a"}, output="x")]
    frames += [
        tool_part("s", "p3", "read", "error", {"filePath": "a"}, error="Tool execution aborted")
    ]
    for n in range(3):
        frames += failing_read(f"q{n}", f"b{n}", "Tool execution aborted")
    assert decisions(frames) == [("cycle", 4, Cycle(1, 4))]


def test_normalize_keeps_the_words_and_drops_volatile_bits():
    assert normalize("line 12:  error at 2026-11-30T10:00:01 in /tmp/abc123/x.py") == (
        "line #: error at #-#-#T#:#:# in /tmp/#/x.py"
    )
    assert normalize("commit deadbeefcafe failed") == "commit # failed"


def test_failure_digest_only_for_failures():
    assert failure_digest("bash", "completed", "x", None, {"exit": 0}) is None
    assert failure_digest("bash", "completed", "x", None, {}) is None
    assert failure_digest("read", "completed", "x", None, None) is None
    assert failure_digest("bash", "completed", "x", None, {"exit": True}) is None
    assert failure_digest("bash", "completed", "x", None, {"exit": 2}) is not None
    assert failure_digest("edit", "error", None, "no match", None) is not None


def test_failure_run_counts_identical_failures():
    run = FailureRun()
    assert [run.feed(d) for d in (1, 1, 2, 2, 2, None, 2)] == [1, 2, 1, 2, 3, 0, 1]


# -- waiting ----------------------------------------------------------------------------------


def test_polling_that_ends_is_not_stopped():
    frames = []
    for n in range(12):
        frames += bash_call(f"p{n}", "sleep 30 && gh run view 1", "status: in_progress")
    frames += bash_call("done", "sleep 30 && gh run view 1", "status: completed")
    assert decisions(frames) == []
    assert decisions(frames, SEED)[0] == ("cycle", 4, Cycle(1, 4))


def test_a_wait_that_never_ends_is_stopped_at_wait_calls():
    frames = []
    for n in range(25):
        frames += bash_call(f"p{n}", "sleep 30 && gh run view 1", "status: queued")
    # Armed after the stop at 20: each later repetition is that loop again.
    decision, *again = feed_all(Tracker(), frames)
    assert [d.call_index for d in again] == [21, 22, 23, 24, 25]
    assert (decision.rule, decision.call_index, Cycle(*decision.finding.shape()[:2])) == (
        "wait",
        20,
        Cycle(1, 20),
    )
    assert "1 call (bash) repeated 20 times while waiting" in decision.feedback
    # Disarmed, the allowance starts over after every stop.
    assert decisions(frames, Detection(wait_calls=8, armed_runs=0)) == [
        ("wait", 8, Cycle(1, 8)),
        ("wait", 16, Cycle(1, 8)),
        ("wait", 24, Cycle(1, 8)),
    ]


def test_a_status_query_answered_in_progress_waits_from_its_answer_on():
    frames = []
    for n in range(6):
        frames += bash_call(f"p{n}", "gh run view 1", "in progress")
    assert decisions(frames) == []
    frames = []
    for n in range(4):
        frames += bash_call(f"p{n}", "gh run view 1", "failed: 3 jobs")
    assert decisions(frames) == [("cycle", 4, Cycle(1, 4))]


def test_a_wait_returning_the_same_failure_is_still_a_loop():
    frames = []
    for n in range(5):
        frames += bash_call(f"p{n}", "sleep 5 && curl -sf localhost:9", "curl: (7) refused", 7)
    # Found on the 4th failure's outcome; the 5th identical call is that loop again, at once.
    assert decisions(frames) == [("failure", 4, Cycle(1, 4)), ("failure", 5, Cycle(1, 4))]


def test_a_two_call_wait_in_turn_gets_the_allowance():
    frames = []
    for n in range(10):
        frames += bash_call(f"h{n}", "curl -s localhost/health", "starting")
        frames += bash_call(f"t{n}", "tail -n 5 server.log", f"line {n}")
    assert decisions(frames) == [("wait", 20, Cycle(2, 10))]


@pytest.mark.parametrize(
    ("command", "waits"),
    [
        ("sleep 30 && gh run view 5", True),
        ("gh run watch 5", True),
        ("kubectl wait --for=condition=ready pod/x", True),
        ("until curl -sf localhost; do sleep 1; done", True),
        ("tail -f app.log", True),
        ("git status", False),
        ("make test", False),
        ("python sleepy.py", False),
    ],
)
def test_waiting_commands(command, waits):
    assert waits_by_command("bash", {"command": command}) is waits


def test_in_progress_answers():
    assert answers_in_progress('{"status": "in_progress"}')
    assert answers_in_progress("Waiting for rollout to finish: 1 of 3 updated")
    assert answers_in_progress("job queued")
    assert not answers_in_progress("3 passed")
    assert not answers_in_progress(None)


# -- the OpenCode tool profile ----------------------------------------------------------------


def test_relabelled_bash_retry_is_a_cycle_with_the_profile_only():
    frames = []
    for n in range(4):
        frames += bash_call(f"p{n}", "git status", "clean", description=f"try {n}", timeout=n)
    assert decisions(frames) == [("cycle", 4, Cycle(1, 4))]
    assert decisions(frames, Detection(profile="none")) == []


def test_todowrite_is_transparent():
    frames = []
    for n in range(4):
        todos = {"todos": [{"content": "fix", "status": f"attempt {n}"}]}
        frames += call("s", f"t{n}", "todowrite", todos)
        frames += call("s", f"r{n}", "read", {"filePath": "a"})
    tracker = Tracker()
    assert [(d.rule, d.call_index, d.part_id) for d in feed_all(tracker, frames)] == [
        ("cycle", 4, "r3")
    ]
    assert decisions(frames, Detection(profile="none")) == []


def test_user_ignore_lists_add_to_the_profile():
    tracker = Tracker(Detection(ignore_args={"bash": frozenset({"workdir"})}))
    frames = []
    for n in range(4):
        frames += bash_call(f"p{n}", "make", "ok", description=str(n), workdir=f"/w{n}")
    assert [d.call_index for d in feed_all(tracker, frames)] == [4]


# -- periods and history ----------------------------------------------------------------------


def test_cycle_of_ten_is_caught_by_default():
    frames = []
    for n in range(30):
        frames += call("s", f"p{n}", "read", {"filePath": f"f{n % 10}"})
    assert decisions(frames, replace(Detection(), revisits=0)) == [("cycle", 30, Cycle(10, 3))]
    # `revisit` takes it first, at its 12th revisit: 2 calls into the 3rd repetition
    assert [d[:2] for d in decisions(frames)] == [("revisit", 22)]
    assert decisions(frames, SEED) == []


def test_history_must_hold_wait_calls():
    with pytest.raises(ValueError, match="wait_calls"):
        Tracker(Detection(history=30, max_period=4, wait_calls=31))
    assert decisions([], replace(SEED, history=12)) == []


# -- read back (seed) -------------------------------------------------------------------------


def test_failures_read_back_count_once_and_join_live_ones():
    # What `export_frames` makes of a run read back: each part once, in its current state.
    seeded = [bash_call(f"p{n}", f"ls {n}", "no such dir", 2)[-1] for n in range(3)]
    tracker = Tracker()
    assert tracker.seed("s", seeded) == []
    # The stream repeats the last updates it sent in the gap: they must not count again.
    assert feed_all(tracker, seeded[-1:]) == []
    [decision] = feed_all(tracker, bash_call("p3", "ls 3", "no such dir", 2))
    assert (decision.rule, decision.call_index) == ("failure", 4)


def test_a_running_part_read_back_gives_its_outcome_live():
    seeded = [bash_call(f"p{n}", f"ls {n}", "no such dir", 2)[-1] for n in range(3)]
    seeded.append(bash_call("p3", "ls 3", "no such dir", 2)[1])  # still running
    tracker = Tracker()
    assert tracker.seed("s", seeded) == []
    [decision] = feed_all(tracker, bash_call("p3", "ls 3", "no such dir", 2)[2:])
    assert (decision.rule, decision.call_index, decision.part_id) == ("failure", 4, "p3")


def test_misses_of_different_files_are_different_failures():
    frames = []
    for n in range(6):
        frames += failing_read(f"p{n}", f"file-{n}.md", f"File not found: /home/p/file-{n}.md")
    assert decisions(frames) == []
    assert normalize("src/a.c:42:5: error: x") == "src/a.c:#:#: error: x"
    assert normalize("app.py line 7") == "app.py line #"


def test_temporary_folders_are_masked_but_the_file_is_kept():
    assert normalize("File not found: /tmp/sandbox-x1/project/file-3.md") == (
        "File not found: /tmp/#/project/file-3.md"
    )
    assert normalize('File "/tmp/tmp8f3a/run.py", line 4') == 'File "/tmp/#/run.py", line #'
