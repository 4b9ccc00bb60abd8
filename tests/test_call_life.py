"""A call's life and a run's life, pair by pair (monitor/core/calls.py, monitor/core/runs.py),
and each source of a call event going through the table, on the tracker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.core import intervention as life
from monitor.core.budget import Budget
from monitor.core.calls import TABLE, CallEvent, CallState, Step, advance
from monitor.core.decisions import Plan
from monitor.core.feedback import MARK
from monitor.core.findings import LoopAgain
from monitor.core.frames import iter_sse_data
from monitor.core.plugin_protocol import PluginCall
from monitor.core.runs import RUN_TABLE, RunEvent, RunState, run_advance
from monitor.core.tracker import Detection, Tracker
from tests.frames_factory import (
    READ,
    SHARED_PLACES,
    assistant_message,
    call,
    export_part,
    feed_all,
    idle,
    loop_of,
    status,
    tool_part,
    usage,
    user_message,
)

# What every (state, event) pair must do, written out apart from the table: state/step, or
# "-" where the table must not allow the event. Columns in CallEvent order.
EVENTS = list(CallEvent)
EXPECTED = {
    # ask, run, finish, read_run, read_finish, cut, abort, end
    "new": "asked/record running/record finished/record_take running/record "
    "finished/record_take - - late/nothing",
    "asked": "- running/nothing finished/take - - cancelled/nothing - late/nothing",
    "running": "running/nothing running/again finished/take running/again finished/take "
    "cancelled/nothing stopped/nothing late/nothing",
    "finished": "- finished/again finished/again finished/again finished/again "
    "finished/nothing - late/nothing",
    "cancelled": "cancelled/nothing cancelled/again cancelled/again cancelled/again "
    "cancelled/again cancelled/nothing stopped/nothing late/nothing",
    "stopped": "stopped/nothing stopped/again stopped/again stopped/again stopped/again "
    "stopped/nothing stopped/nothing late/nothing",
    "late": "- - - running/record finished/record_take late/nothing - late/nothing",
}


class _Call:
    def __init__(self, state: CallState) -> None:
        self.state = state


PAIRS = [(state, event) for state in CallState for event in CallEvent]


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
def test_every_pair_of_a_calls_life(state: CallState, event: CallEvent) -> None:
    expected = EXPECTED[state].split()[EVENTS.index(event)]
    call = _Call(state)
    step = advance(call, event)
    if expected == "-":
        # Not allowed: a named step, and the call stays where it was.
        assert (call.state, step) == (
            state,
            Step.LATE if state is CallState.LATE else Step.UNEXPECTED,
        )
        assert (state, event) not in TABLE
    else:
        new_state, new_step = expected.split("/")
        assert (call.state, step) == (CallState(new_state), Step(new_step))


RUN_EXPECTED = {
    (RunState.IDLE, RunEvent.BEGIN): (RunState.BUSY, False),
    (RunState.BUSY, RunEvent.BEGIN): (RunState.BUSY, False),
    (RunState.BUSY, RunEvent.END): (RunState.IDLE, True),
    (RunState.IDLE, RunEvent.END): (RunState.IDLE, False),
}


@pytest.mark.parametrize(("state", "event"), list(RUN_EXPECTED))
def test_every_pair_of_a_runs_life(state: RunState, event: RunEvent) -> None:
    assert run_advance(state, event) == RUN_EXPECTED[state, event]
    assert set(RUN_TABLE) == set(RUN_EXPECTED)


# -- each source of a call event, on the tracker ------------------------------------------------


def test_an_update_after_its_run_ended_is_late_never_a_new_call() -> None:
    # OpenCode sends an aborted run's last tool updates after `session.idle`: four bash calls
    # running when the run was aborted, finishing after the idle pair.
    tracker = Tracker()
    running = [
        frame for n in range(4) for frame in call("s", f"b{n}", "bash", {"command": "x"})[:2]
    ]
    finishing = [
        frame for n in range(4) for frame in call("s", f"b{n}", "bash", {"command": "x"})[2:]
    ]
    tracker.feed(status("s", "busy"))
    [decision] = feed_all(tracker, running)
    assert decision.call_index == 4  # the fourth identical call: a loop
    feed_all(tracker, [idle("s"), status("s", "idle")])
    assert feed_all(tracker, finishing) == []
    assert tracker.stray[Step.LATE] == 4
    assert tracker.sessions_view()[0].calls == 4


def test_a_finished_part_read_back_then_carried_by_the_stream_counts_once() -> None:
    tracker = Tracker()
    frames = call("s", "p1", "read", READ)
    tracker.seed("s", frames)
    assert feed_all(tracker, frames) == []
    assert tracker.sessions_view()[0].calls == 1


def test_the_idle_pair_ends_one_run_for_the_armed_loop() -> None:
    """A stopped loop repeated in the run after the idle pair is that loop again at once."""
    tracker = Tracker()
    tracker.feed(status("s", "busy"))
    [first] = feed_all(tracker, loop_of("s", 4))
    feed_all(tracker, [status("s", "idle"), idle("s")])  # one run end, said twice
    tracker.feed(status("s", "busy"))
    [again] = feed_all(tracker, loop_of("s", 1, prefix="r"))
    assert (again.call_index, again.prior_interventions) == (5, 1)
    assert again.finding == LoopAgain("read", first.finding)


def test_a_run_ended_by_the_resync_loses_its_run_budget_as_one_ended_by_idle() -> None:
    tracker = Tracker(Detection(run_budget=Budget(steps=3)))
    tracker.feed(status("s", "busy"))
    feed_all(tracker, [usage("s", f"m{n}", tokens=10) for n in range(2)])
    tracker.end_runs(["s"])  # the resync found it idle
    tracker.feed(status("s", "busy"))
    assert feed_all(tracker, [usage("s", "m8", tokens=10), usage("s", "m9", tokens=10)]) == []
    [spent] = feed_all(tracker, [usage("s", "m10", tokens=10)])  # the third step of this run
    assert spent.call_index == 0 and "3 steps" in str(spent.finding.describe())


# -- a real local model's recording (../shared/realmodel) --------------------------------------

REALMODEL = next(
    (place / "realmodel" for place in SHARED_PLACES if (place / "realmodel").is_dir()),
    SHARED_PLACES[0] / "realmodel",
)


def detections_and_calls(path: Path) -> list[tuple[str, int, int]]:
    """Each detection of a replay of `path`: its rule, its position, and how many distinct
    tool calls (part ids) its session had made by then."""
    tracker = Tracker(Detection(armed_runs=0))  # as replay runs it
    parts: dict[str, set[str]] = {}
    found = []
    with path.open(encoding="utf-8") as lines:
        for data in iter_sse_data(lines):
            frame = json.loads(data)
            payload = frame.get("payload", frame)
            part = payload.get("properties", {}).get("part", {})
            if payload.get("type") == "message.part.updated" and part.get("type") == "tool":
                parts.setdefault(part["sessionID"], set()).add(part["id"])
            for decision in tracker.feed_data(data).decisions:
                calls = len(parts.get(decision.session_id, ()))
                found.append((str(decision.rule), decision.position, calls))
    return found


@pytest.mark.parametrize(
    "name", ["tests-watch-trimmed", "typo", "summary", "tests"], ids=lambda name: name
)
def test_every_detection_on_a_real_models_stream_is_within_its_real_calls(name: str) -> None:
    path = REALMODEL / f"{name}.event.sse"
    if not path.is_file():
        pytest.skip(f"{path} is absent (set OLM_SHARED_DIR to the folder holding realmodel/)")
    found = detections_and_calls(path)
    assert all(position <= calls for _, position, calls in found), found
    if name == "tests-watch-trimmed":
        # The 4-call cycle the monitor aborted at the 13th call; the aborted run's parts that
        # came after `session.idle` are late, not a "bash repeated 4 times" at the 18th.
        assert found == [("cycle", 13, 13)]


# -- one loop, one intervention ---------------------------------------------------------------

OTHER = {"filePath": "other.py"}


def burst(session: str, count: int, step: str) -> list[dict]:
    """`count` identical reads the model asked for in one step (one assistant message)."""
    return [
        tool_part(session, f"b{n}", "read", status, READ, call_id=f"call_b{n}", message_id=step)
        for n in range(count)
        for status in ("pending", "running", "completed")
    ]


def test_a_burst_in_one_step_is_one_intervention_and_the_next_loop_is_refused_not_held() -> None:
    tracker = Tracker()  # block first, held after 2 interventions
    decisions = feed_all(tracker, burst("s", 5, "msg_a"))
    assert [(d.call_index, d.plan, d.prior_interventions) for d in decisions] == [
        (4, Plan.REFUSE, 0),
        (5, Plan.DEFER, 0),  # the same loop, the same step: the same intervention
    ]
    assert tracker.interventions("s") == 1
    [other] = feed_all(tracker, loop_of("s", 4, "read", OTHER, prefix="o"))
    assert (other.call_index, other.plan, other.prior_interventions) == (9, Plan.REFUSE, 1)
    assert not other.hold


def test_a_burst_the_plugin_asks_about_is_one_intervention() -> None:
    tracker = Tracker()
    pending = [
        tool_part("ses_1", f"b{n}", "read", "pending", call_id=f"call_b{n}", message_id="msg_a")
        for n in range(5)
    ]
    feed_all(tracker, pending)
    judged = [
        tracker.judge(PluginCall("ses_1", f"call_b{n}", "read", READ, "/p")) for n in range(5)
    ]
    assert [j.verdict.verdict for j in judged] == ["allow"] * 3 + ["block"] * 2
    assert [j.decision.plan for j in judged[3:] if j.decision] == [Plan.REFUSE, Plan.DEFER]
    # The same intervention, in words for its own call, not a copy of the first refusal's.
    first, again = judged[3].decision, judged[4].decision
    assert first is not None and again is not None
    assert again.finding == LoopAgain("read", first.finding)
    assert again.finding.describe() in str(judged[4].verdict.feedback)
    assert tracker.interventions("ses_1") == 1


def test_a_stalled_monitor_finds_one_loop_once_and_knows_its_run_is_over() -> None:
    """A monitor that stalled reads a loop's calls after they ran, all before it acts on the
    first finding (no outcome has come back): one intervention, the rest the same one; by the
    time the shell acts the run has ended by itself, which the core says (nothing aborted)."""
    tracker = Tracker()
    tracker.feed(status("s", "busy"))
    decisions = [d for f in loop_of("s", 8) for d in tracker.feed(f).decisions]
    assert [d.plan for d in decisions] == [Plan.REFUSE] + [Plan.DEFER] * 4
    assert tracker.interventions("s") == 1
    assert not tracker.run_over(decisions[0])
    feed_all(tracker, [status("s", "idle"), idle("s")])
    assert tracker.run_over(decisions[0])


# -- our own refusal is never another monitor's --------------------------------------------------


def test_due_work_after_a_restart_takes_our_own_refusal_for_ours() -> None:
    """The server restarted at a hold's abort: the record read back after the reconnect
    shows the loop's call refused with our text. Ours, so the hold's feedback is still due;
    the same record left by another monitor means that monitor acts."""
    calls = [export_part("s", f"p{n}", "completed") for n in (1, 2, 3)]
    refused = export_part("s", "p4", "error")
    refused["state"]["error"] = f"{MARK}this call was refused and did not run"
    record = [user_message("s"), *(assistant_message("s", c) for c in calls)]
    record.append(assistant_message("s", refused))
    held = feed_all(Tracker(Detection(on_loop="hold")), loop_of("s", 4))[0]

    def read_back(ours: bool) -> life.Turn:
        due = life.Intervention(held, life.State.RECHECK_ABORT, ours=ours)
        return due.feed(life.Read(record, busy=False))

    ours = read_back(ours=True)
    assert isinstance(ours.command, life.Post)
    [confirmed] = ours.reports
    assert isinstance(confirmed, life.Decided) and confirmed.fields["outcome"] == "held"
    theirs = read_back(ours=False)
    assert theirs.command is None
    assert [r.fields.get("reason") for r in theirs.reports] == [None, "call already refused"]
