"""The permission gate (monitor.core.permissions) through the tracker: given these events,
these answers. Frames are shaped like the recording `permission-gate` of the real server."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from monitor.core.decisions import Outcome
from monitor.core.events import (
    Malformed,
    PermissionAsked,
    PermissionReplied,
    ToolPart,
    parse_event,
)
from monitor.core.feedback import MARK
from monitor.core.findings import CallCycle
from monitor.core.permissions import Reply
from monitor.core.tracker import Detection, Intervene, Tracker
from tests.frames_factory import BASH, asked, doom_loop, part, replied, tool_part

S = "ses_1"
READ = ("read", {"filePath": "README.md"})


class Run:
    """Feeds calls the way the server streams them and collects what the tracker returns."""

    def __init__(self, mode: str, **detection: Any) -> None:
        self.tracker = Tracker(
            Detection(permissions=mode, permission_grace=7.0, **detection),  # type: ignore[arg-type]
            directory="/p",
        )
        self.decisions: list[Intervene] = []
        self.replies: list[Reply] = []

    def feed(self, frame: dict) -> None:
        fed = self.tracker.feed(frame)
        self.decisions += fed.decisions
        self.replies += fed.replies
        # Carried out at once, as the shell reports it (an intervention under way stands
        # for its loop until then).
        for decision in fed.decisions:
            self.tracker.outcome(decision, Outcome.DRY_RUN)
        for reply in fed.replies:
            if reply.loop is not None:
                self.tracker.outcome(reply.loop, Outcome.REJECTED)

    def running(self, n: int, call: tuple[str, dict]) -> None:
        self.feed(part(n, "running", *call))

    def finish(self, n: int, call: tuple[str, dict], status: str = "completed") -> None:
        self.feed(part(n, status, *call))

    def asking_call(self, n: int, call: tuple[str, dict], answer: str | None = "once") -> None:
        """A call that asks permission; `answer` is the reply somebody gives (None: nobody)."""
        self.running(n, call)
        self.feed(asked(n, call[0]))
        if answer is not None:
            self.feed(replied(n, answer))
            self.finish(n, call, "completed" if answer != "reject" else "error")

    def quiet_call(self, n: int, call: tuple[str, dict]) -> None:
        self.running(n, call)
        self.finish(n, call)


def test_the_fourth_identical_call_is_refused_before_it_runs():
    run = Run("gate")
    for n in range(1, 4):
        run.asking_call(n, READ)
    run.running(4, READ)
    assert run.decisions == [] and run.replies == []  # nothing before its request comes
    run.feed(asked(4))
    [reply] = run.replies
    assert (reply.request_id, reply.reply, reply.wait) == ("per_4", "reject", 0.0)
    assert reply.session_id == S and reply.directory == "/p"
    assert reply.loop is not None and reply.loop.rule == "cycle"
    assert (reply.loop.part_id, reply.loop.call_index) == ("prt_4", 4)
    assert (reply.loop.finding.shape()[0], reply.loop.finding.shape()[1]) == (1, 4)
    assert reply.message is not None and reply.message.startswith(MARK)
    assert (
        "refused and did not run" in reply.message and "1 call (read) repeated 4" in reply.message
    )
    assert "README" not in reply.message  # never an argument
    assert run.decisions == []


def test_a_request_before_its_running_update_is_answered_at_running():
    """bash asks before its `running` update (seen on the real server): the request waits
    until the call's input shows whether it completes a loop."""
    run = Run("approve")
    for n in range(1, 5):
        run.feed(part(n, "pending", "bash", {}))
        run.feed(asked(n, "bash"))
        assert [r.request_id for r in run.replies] == [f"per_{k}" for k in range(1, n)]
        run.running(n, BASH)
        if n < 4:
            run.feed(replied(n, "once"))
            run.running(n, BASH)  # bash sends `running` again as it starts
            run.finish(n, BASH)
    assert [r.reply for r in run.replies] == ["once", "once", "once", "reject"]
    assert run.replies[-1].loop is not None and run.replies[-1].loop.part_id == "prt_4"
    assert run.replies[0].directory == "/p" and run.decisions == []


def test_a_request_answered_before_its_running_update_is_not_answered_again():
    run = Run("approve")
    run.feed(part(1, "pending", "bash", {}))
    run.feed(asked(1, "bash"))
    run.feed(replied(1, "once"))
    run.running(1, BASH)
    assert run.replies == []


def test_a_loop_whose_request_someone_else_answered_first_is_aborted_at_once():
    run = Run("gate")
    for n in range(1, 4):
        run.asking_call(n, READ)
    run.feed(asked(4))  # before its `running` update, and a person approves it at once
    run.feed(replied(4, "once"))
    run.running(4, READ)
    assert run.replies == [] and [d.part_id for d in run.decisions] == ["prt_4"]


def test_gate_approves_nothing_and_approve_approves_every_other_call():
    gate, approve = Run("gate"), Run("approve")
    for run in (gate, approve):
        for n in range(1, 4):
            run.asking_call(n, READ)
        run.running(4, READ)
        run.feed(asked(4))
    assert [r.reply for r in gate.replies] == ["reject"]
    assert [(r.request_id, r.reply, r.loop) for r in approve.replies[:3]] == [
        (f"per_{n}", "once", None) for n in (1, 2, 3)
    ]
    assert approve.replies[3].reply == "reject" and approve.replies[3].request_id == "per_4"


def test_two_call_cycle_refuses_the_sixth_call():
    run = Run("approve")
    for n in range(1, 6):
        run.asking_call(n, READ if n % 2 else BASH)
    run.running(6, BASH)
    run.feed(asked(6, "bash"))
    assert [r.reply for r in run.replies] == ["once"] * 5 + ["reject"]
    loop = run.replies[-1].loop
    assert loop is not None and loop.finding.shape()[2] == ("read", "bash") and loop.call_index == 6


def test_a_call_that_asks_no_permission_is_aborted_at_once():
    run = Run("approve")
    for n in range(1, 4):
        run.quiet_call(n, READ)
    run.running(4, READ)
    [decision] = run.decisions
    assert decision.part_id == "prt_4" and run.replies == []
    # Should it ask after all, the loop-completing call is never approved: the abort stops it.
    run.feed(asked(4))
    assert run.replies == []


def test_an_always_reply_means_later_calls_will_not_ask():
    run = Run("gate")
    run.asking_call(1, READ, answer="always")
    for n in (2, 3):
        run.quiet_call(n, READ)
    run.running(4, READ)
    assert [d.part_id for d in run.decisions] == ["prt_4"]


def test_a_loop_waiting_for_a_request_that_never_comes_is_aborted_when_the_call_ends():
    run = Run("gate")
    for n in range(1, 4):
        run.asking_call(n, READ)
    run.running(4, READ)
    assert run.decisions == []
    run.finish(4, READ)
    [decision] = run.decisions
    assert decision.part_id == "prt_4" and run.replies == []


@pytest.mark.parametrize(("mode", "wait"), [("approve", 0.0), ("gate", 7.0)])
def test_doom_loop_request_is_refused_with_our_feedback(mode, wait):
    run = Run(mode)
    for n in range(1, 4):
        run.running(n, READ)  # three parallel calls of one step, all still running
    run.feed(doom_loop(1))
    [reply] = run.replies
    assert (reply.request_id, reply.reply, reply.wait) == ("per_doom1", "reject", wait)
    loop = reply.loop
    assert loop is not None and loop.rule == "doom_loop" and loop.finding.shape()[2] == ("read",)
    assert (loop.finding.shape()[0], loop.finding.shape()[1], loop.part_id) == (1, 3, "prt_3")
    assert loop.feedback.startswith(MARK) and loop.prior_interventions == 0
    # The deadline passed with the request still pending: the core says to refuse it now.
    assert run.tracker.expire(reply) == dataclasses.replace(reply, wait=0.0)
    run.feed(replied("per_doom1", "once"))
    assert run.tracker.expire(reply) is None  # a person answered first: nothing to send


@pytest.mark.parametrize("mode", ["approve", "gate"])
def test_doom_loop_about_a_loop_being_stopped_is_refused_at_once_as_that_loop(mode):
    """Issue 43: a step of five identical reads, no plugin: the 4th completes our loop (the
    abort); the server's `doom_loop` request about the same burst is that loop again, refused
    at once (no grace: the loop is acted on) and not counted as a second intervention."""
    run = Run(mode)
    for n in range(1, 6):
        step = tool_part(
            S, f"prt_{n}", "read", "running", READ[1], call_id=f"call_{n}", message_id="msg_b"
        )
        run.feed(step)
    [stop, again] = run.decisions
    assert (stop.plan, again.plan) == ("refuse", "defer")  # the 5th call: the same loop
    run.feed(doom_loop(1))
    [reply] = run.replies
    assert (reply.reply, reply.wait) == ("reject", 0.0)
    assert reply.loop is not None and (reply.loop.plan, reply.loop.part_id) == ("defer", "prt_5")
    assert reply.loop.prior_interventions == stop.prior_interventions == 0
    assert run.tracker.sessions_view()[0].interventions == 1


def test_doom_loop_about_other_calls_is_a_loop_of_its_own():
    """The request names another call than the loop acted on: a new loop, counted."""
    run = Run("approve")
    for n in range(1, 5):
        run.running(n, READ)
    other = doom_loop(1)
    other["properties"]["metadata"]["input"] = {"filePath": "OTHER.md"}
    run.feed(other)
    [reply] = run.replies
    assert reply.reply == "reject" and reply.loop is not None
    assert (reply.loop.plan != "defer", reply.loop.prior_interventions) == (True, 1)


def test_off_answers_nothing_and_aborts_as_before():
    run = Run("off")
    for n in range(1, 4):
        run.asking_call(n, READ)
    run.running(4, READ)
    run.feed(asked(4))
    run.feed(doom_loop(1))
    assert run.replies == [] and [d.part_id for d in run.decisions] == ["prt_4"]


def test_a_request_read_back_again_is_answered_once():
    run = Run("approve")
    run.running(1, READ)
    run.feed(asked(1))
    run.feed(asked(1))
    run.feed(doom_loop(1))
    run.feed(doom_loop(1))
    assert [r.request_id for r in run.replies] == ["per_1", "per_doom1"]


def test_a_refused_call_repeated_is_refused_at_once_and_escalates_to_hold():
    """The loop stays armed after a refusal: the model's next identical call gets no fresh
    budget of repetitions, in this run or the next, and the monitor never answers `always`."""
    run = Run("approve", max_interventions=2)
    for n in range(1, 4):
        run.asking_call(n, READ)
    for n in (4, 5):  # refused, then repeated at once
        run.running(n, READ)
        run.feed(asked(n))
        run.finish(n, READ, "error")
    run.feed({"type": "session.idle", "properties": {"sessionID": S}})
    run.running(6, READ)  # the next run: still armed
    run.feed(asked(6))
    loops = [r.loop for r in run.replies if r.loop is not None]
    assert [(x.call_index, x.prior_interventions, x.hold, x.escalated) for x in loops] == [
        (4, 0, False, False),
        (5, 1, False, False),
        (6, 2, True, True),
    ]
    assert [(r.request_id, r.reply) for r in run.replies if r.loop is not None] == [
        ("per_4", "reject"),
        ("per_5", "reject"),
        ("per_6", "reject"),
    ]
    assert {r.reply for r in run.replies} <= {"once", "reject"}  # never "always"
    assert "on hold" in (run.replies[-1].message or "")


def test_permission_events_are_typed_from_both_stream_forms():
    label, event = parse_event(asked(4))
    assert label == "permission.asked"
    assert event == PermissionAsked(S, "per_4", "read", "msg_4", "call_4", None, None)
    envelope = {"directory": "/d", "project": "global", "payload": doom_loop(1)}
    assert parse_event(envelope)[1] == PermissionAsked(
        S, "per_doom1", "doom_loop", None, None, "read", "/d", {"filePath": "README.md"}
    )
    # The live stream leaves `tool` out of a doom_loop request; GET /permission says null.
    del envelope["payload"]["properties"]["tool"]
    assert parse_event(envelope)[1].call_id is None  # type: ignore[union-attr]
    assert parse_event(replied(4, "once"))[1] == PermissionReplied(S, "per_4", "once")
    [_, typed] = parse_event(part(4, "running", *READ))
    assert isinstance(typed, ToolPart) and (typed.message_id, typed.call_id) == ("msg_4", "call_4")
    missing_id = {"type": "permission.asked", "properties": {"sessionID": S}}
    assert isinstance(parse_event(missing_id)[1], Malformed)


def test_a_relabelled_call_that_asks_is_refused_not_aborted():
    # Models reword `description` on every retry; the profile drops it, and the gate must
    # count these as the same call as the rules do: it learns they ask, and refuses the 4th.
    run = Run("gate")
    for n in range(1, 4):
        run.asking_call(n, ("bash", {"command": "make", "description": f"Build, try {n}"}))
    assert run.decisions == [] and run.replies == []
    run.running(4, ("bash", {"command": "make", "description": "Build once more"}))
    assert run.decisions == [] and run.replies == []  # waits for its request
    run.feed(asked(4, "bash"))
    [reply] = run.replies
    assert (reply.request_id, reply.reply) == ("per_4", "reject")
    assert reply.loop is not None and reply.loop.finding == CallCycle(("bash",), 4)
    assert run.decisions == []
