"""A decision's wait before its hand-over, pair by pair (monitor/core/handover.py), and each
source of a wait event going through the table, on the tracker: the plugin's question, a
permission request, the stream (the next call, the call's end, late or not), the wait's
deadline and the run's end."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.core.decisions import Deadline, Intervene, Outcome, Plan
from monitor.core.findings import CallCycle
from monitor.core.handover import (
    TABLE,
    Awaiting,
    Then,
    WaitEvent,
    WaitState,
    advance,
    handed,
    waiting,
)
from monitor.core.plugin_protocol import ALLOW, PluginCall
from monitor.core.session import SessionRecord
from monitor.core.tracker import Detection, Tracker
from tests.frames_factory import READ, asked, idle, part, replied, tool_part

S = "ses_1"

# What every (state, event) pair must do, written out apart from the table: state/what the
# tracker does, or "-" where the event is not the wait's (it stays, `nothing`). Columns in
# WaitEvent order.
EVENTS = list(WaitEvent)
EXPECTED = {
    # ask, request, run, end, late_end, deadline, run_end
    "await_question": "handed_over/answer handed_over/reject - handed_over/carry_out "
    "dropped/drop - -",
    "await_request": "handed_over/answer handed_over/reject - handed_over/carry_out "
    "dropped/drop - -",
    "await_next_call": "handed_over/answer - await_question/move - - - handed_over/carry_out",
    "await_end": "- - - handed_over/carry_out handed_over/carry_out handed_over/carry_out -",
    "handed_over": "- - - - - - -",
    "dropped": "- - - - - - -",
}

DECISION = Intervene(S, None, CallCycle(("read",), 4), "p4", 4, 0, False, False, "stop")


def at(state: WaitState) -> Awaiting:
    """A wait in `state` (one handed over or dropped is reached, never begun, so moved there)."""
    if state is WaitState.HANDED_OVER:
        wait = Awaiting(WaitState.AWAIT_END, DECISION)
        advance(wait, WaitEvent.DEADLINE)
    elif state is WaitState.DROPPED:
        wait = Awaiting(WaitState.AWAIT_QUESTION, DECISION)
        advance(wait, WaitEvent.LATE_END)
    else:
        wait = Awaiting(state, DECISION)
    assert wait.state is state
    return wait


PAIRS = [(state, event) for state in WaitState for event in WaitEvent]


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
def test_every_pair_of_a_waits_life(state: WaitState, event: WaitEvent) -> None:
    expected = EXPECTED[state].split()[EVENTS.index(event)]
    wait = at(state)
    then = advance(wait, event)
    if expected == "-":
        assert (wait.state, then) == (state, Then.NOTHING)
        assert (state, event) not in TABLE
    else:
        new_state, new_then = expected.split("/")
        assert (wait.state, then) == (WaitState(new_state), Then(new_then))


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
def test_the_decision_is_handed_out_only_when_the_event_hands_it_over(
    state: WaitState, event: WaitEvent
) -> None:
    expected = EXPECTED[state].split()[EVENTS.index(event)]
    hands = expected.endswith(("/answer", "/reject", "/carry_out"))
    assert handed(at(state), event) is (DECISION if hands else None)


def test_no_wait_hands_nothing_and_a_wait_is_begun_only_waiting() -> None:
    assert handed(None, WaitEvent.ASK) is None
    assert not waiting(None, WaitState.AWAIT_NEXT_CALL)
    assert waiting(at(WaitState.AWAIT_NEXT_CALL), WaitState.AWAIT_NEXT_CALL)
    for state in (WaitState.HANDED_OVER, WaitState.DROPPED):
        with pytest.raises(AssertionError):
            Awaiting(state, DECISION)


# -- each source of a wait event, on the tracker ----------------------------------------------


def record(tracker: Tracker) -> SessionRecord:
    found = tracker._sessions.get(S)
    assert found is not None
    return found


def call_wait(tracker: Tracker, part_id: str) -> Awaiting | None:
    call = record(tracker).call(part_id)
    assert call is not None
    return call.waiting


APPEND = {"command": "echo x >> out.txt", "description": "append"}


def plugin_asks(n: int, args: dict[str, Any] = APPEND) -> PluginCall:
    return PluginCall(S, "call_0", "bash", args, "/p", message_id=f"msg_{n}")


def bash(n: int, status: str, args: dict[str, Any] = APPEND, **extra: Any) -> dict:
    return tool_part(
        S, f"prt_{n}", "bash", status, args, call_id="call_0", message_id=f"msg_{n}", **extra
    )


def three_asked_calls(tracker: Tracker) -> None:
    """Three identical calls, each asked by the plugin after the stream showed it running."""
    for n in range(1, 4):
        tracker.feed(bash(n, "running"))
        assert tracker.judge(plugin_asks(n)).verdict == ALLOW
        tracker.feed(bash(n, "completed", output="ok"))


def test_a_loop_seen_running_first_waits_for_the_plugins_question_which_blocks_it() -> None:
    tracker = Tracker()
    tracker.judge(PluginCall(S, "call_a", "read", READ, "/p"))  # the session's plugin asks
    three_asked_calls(tracker)
    assert tracker.feed(bash(4, "running")).decisions == ()
    wait = call_wait(tracker, "prt_4")
    assert wait is not None and wait.state is WaitState.AWAIT_QUESTION
    judged = tracker.judge(plugin_asks(4))
    assert judged.verdict.verdict == "block" and judged.decision is wait.decision
    assert wait.state is WaitState.HANDED_OVER
    # Its refused call's end hands nothing over a second time.
    assert tracker.feed(bash(4, "error", error="refused")).decisions == ()


def test_a_loop_waiting_for_a_question_whose_run_ends_first_is_dropped() -> None:
    tracker = Tracker()
    tracker.judge(PluginCall(S, "call_a", "read", READ, "/p"))
    three_asked_calls(tracker)
    tracker.feed(bash(4, "running"))
    wait = call_wait(tracker, "prt_4")
    tracker.feed(idle(S))  # stopped by someone else: its last update comes after the idle
    assert tracker.feed(bash(4, "error", error="Tool execution aborted")).decisions == ()
    assert wait is not None and wait.state is WaitState.DROPPED


def request_run() -> Tracker:
    """Three calls that each asked permission and were let through; the fourth running."""
    tracker = Tracker(Detection(permissions="gate"), directory="/p")
    for n in range(1, 4):
        tracker.feed(part(n, "running", "read", dict(READ)))
        tracker.feed(asked(n))
        tracker.feed(replied(n, "once"))
        tracker.feed(part(n, "completed", "read", dict(READ)))
    assert tracker.feed(part(4, "running", "read", dict(READ))).replies == ()
    wait = call_wait(tracker, "prt_4")
    assert wait is not None and wait.state is WaitState.AWAIT_REQUEST
    return tracker


def test_a_loop_whose_call_will_ask_permission_waits_for_the_request_and_refuses_it() -> None:
    tracker = request_run()
    wait = call_wait(tracker, "prt_4")
    assert wait is not None
    [reply] = tracker.feed(asked(4)).replies
    assert (reply.request_id, reply.reply, reply.loop) == ("per_4", "reject", wait.decision)
    assert wait.state is WaitState.HANDED_OVER


def test_a_loop_whose_call_finishes_without_asking_is_carried_out_at_its_end() -> None:
    tracker = request_run()
    wait = call_wait(tracker, "prt_4")
    [decision] = tracker.feed(part(4, "completed", "read", dict(READ))).decisions
    assert wait is not None and decision is wait.decision
    assert (wait.state, decision.part_id) == (WaitState.HANDED_OVER, "prt_4")


FAILED = "Error: no module named pytestx"


def failing(n: int, status: str, **extra: Any) -> dict:
    command = {"command": f"python -m pytestx -k case{n}", "description": "run the tests"}
    frame = tool_part(
        S, f"prt_{n}", "bash", status, command, call_id=f"call_{n}", message_id=f"msg_{n}", **extra
    )
    if status == "completed":
        frame["properties"]["part"]["state"]["metadata"] = {"exit": 1}
    return frame


def failure_loop() -> Tracker:
    """Four failing calls the plugin asked about: the failure found after the fourth ran."""
    tracker = Tracker()
    for n in range(1, 5):
        tracker.judge(PluginCall(S, f"call_{n}", "bash", {"command": f"c{n}"}, "/p"))
        assert tracker.feed(failing(n, "running")).decisions == ()
        assert tracker.feed(failing(n, "completed", output=FAILED)).decisions == ()
    wait = record(tracker).waiting
    assert wait is not None and wait.state is WaitState.AWAIT_NEXT_CALL
    assert wait.decision.plan is Plan.REFUSE
    return tracker


def test_a_refusal_after_its_call_ran_refuses_the_next_call_the_plugin_asks_about() -> None:
    tracker = failure_loop()
    wait = record(tracker).waiting
    judged = tracker.judge(PluginCall(S, "call_5", "bash", {"command": "ls"}, "/p"))
    assert wait is not None and judged.decision is wait.decision
    assert wait.state is WaitState.HANDED_OVER
    assert tracker.judge(PluginCall(S, "call_6", "bash", {"command": "pwd"}, "/p")).verdict == ALLOW


def test_the_next_call_carried_first_takes_the_refusal_onto_itself() -> None:
    tracker = failure_loop()
    wait = record(tracker).waiting
    assert tracker.feed(failing(5, "running")).decisions == ()
    assert record(tracker).waiting is None and call_wait(tracker, "prt_5") is wait
    assert wait is not None and wait.state is WaitState.AWAIT_QUESTION
    judged = tracker.judge(PluginCall(S, "call_5", "bash", {"command": "c5"}, "/p"))
    assert judged.verdict.verdict == "block" and judged.decision is wait.decision


def test_a_refusal_whose_run_ends_before_a_next_call_is_released() -> None:
    tracker = failure_loop()
    wait = record(tracker).waiting
    [released] = tracker.feed(idle(S)).decisions
    assert wait is not None and released is wait.decision
    assert wait.state is WaitState.HANDED_OVER
    assert record(tracker).waiting is None  # an idle session holds no wait
    assert tracker.feed(idle(S)).decisions == ()  # once


def read(n: int, status: str, **extra: Any) -> dict:
    return tool_part(
        S, f"prt_{n}", "read", status, READ, call_id=f"call_{n}", message_id=f"msg_{n}", **extra
    )


def waiting_for_end() -> tuple[Tracker, Deadline]:
    """`attach`: no plugin asks this monitor; the fourth read's loop waits for its end, at
    most the deadline it returns."""
    tracker = Tracker(own_refusal_wait=1.0)
    for n in range(1, 4):
        for frame in (read(n, "running"), read(n, "completed", output="ok")):
            for decision in tracker.feed(frame).decisions:
                tracker.outcome(decision, Outcome.BLOCKED)
    fed = tracker.feed(read(4, "running"))
    assert fed.decisions == ()
    [deadline] = [d for d in fed.deadlines if d.loop]
    wait = call_wait(tracker, "prt_4")
    assert wait is not None and wait.state is WaitState.AWAIT_END
    return tracker, deadline


@pytest.mark.parametrize("late", [False, True], ids=["in_its_run", "after_its_run"])
def test_a_loop_waiting_for_its_calls_end_is_handed_over_by_the_end(late: bool) -> None:
    tracker, deadline = waiting_for_end()
    wait = call_wait(tracker, "prt_4")
    if late:
        tracker.feed(idle(S))
    [decision] = tracker.feed(read(4, "error", error="Tool execution aborted")).decisions
    assert wait is not None and decision is wait.decision
    assert wait.state is WaitState.HANDED_OVER
    assert tracker.overdue(deadline) is None  # once


def test_a_loop_waiting_for_its_calls_end_is_handed_over_by_the_deadline_once() -> None:
    tracker, deadline = waiting_for_end()
    wait = call_wait(tracker, "prt_4")
    assert wait is not None and tracker.overdue(deadline) is wait.decision
    assert wait.state is WaitState.HANDED_OVER
    assert tracker.overdue(deadline) is None
    assert tracker.feed(read(4, "completed", output="ok")).decisions == ()
