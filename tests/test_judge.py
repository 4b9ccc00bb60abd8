"""`Tracker.judge`: the plugin's calls and the stream's updates of the same calls, recorded
once whichever comes first, under one identity and one set of rules."""

from __future__ import annotations

import json
from typing import Any

from monitor.core.decisions import Action, Outcome, Plan, Reply
from monitor.core.feedback import OWN_REFUSAL
from monitor.core.plugin_protocol import ALLOW, PluginCall
from monitor.core.tracker import Detection, Judged, Tracker
from tests.frames_factory import idle, tool_part, user_frames

S = "ses_1"
APPEND = {"command": "echo x >> out.txt", "description": "append"}


def asked(
    call_id: str = "call_0",
    args: dict[str, Any] = APPEND,
    tool: str = "bash",
    step: str | None = None,
) -> PluginCall:
    return PluginCall(S, call_id, tool, args, "/p", message_id=step)


def updates(part: str, call_id: str = "call_0", status: str = "completed", **extra: Any):
    step = f"msg_{part}"  # each call a model step of its own
    return [
        tool_part(S, part, "bash", "running", APPEND, call_id=call_id, message_id=step),
        tool_part(S, part, "bash", status, APPEND, call_id=call_id, message_id=step, **extra),
    ]


def judge(tracker: Tracker, call: PluginCall) -> Judged:
    """The plugin's question, and its decision reported carried out, as the shell does."""
    judged = tracker.judge(call)
    if judged.decision is not None:
        blocked = judged.verdict.verdict == "block"
        tracker.outcome(judged.decision, Outcome.BLOCKED if blocked else Outcome.NUDGED)
    return judged


def feed(tracker: Tracker, frames: list[dict]) -> list:
    return [d for frame in frames for d in tracker.feed(frame).decisions]


def test_plugin_first_then_stream_counts_each_call_once_and_blocks_the_fourth():
    tracker = Tracker()
    for n in range(1, 4):
        # call_0 at every step, as local models send it
        assert tracker.judge(asked()).verdict == ALLOW
        assert feed(tracker, updates(f"prt_{n}")) == []
    judged = tracker.judge(asked())
    assert judged.verdict.verdict == "block"
    assert judged.verdict.feedback is not None
    assert "did not run" in judged.verdict.feedback
    assert "your run was stopped" not in judged.verdict.feedback
    decision = judged.decision
    assert decision is not None and decision.call_index == 4 and decision.action == Action.BLOCK
    # The blocked call's error update (the plugin's thrown text) is neither a new call nor a
    # failure: nothing is decided, the run's calls stay 4.
    assert feed(tracker, updates("prt_4", status="error", error="Loop guard: refused")) == []
    assert tracker.sessions_view()[0].run_calls == 4


def test_stream_first_then_plugin_the_loop_waits_for_the_plugin_and_is_blocked():
    tracker = Tracker()
    tracker.judge(asked("call_a"))  # the session's plugin asks: known from here on
    feed(tracker, updates("prt_1", "call_a"))
    for n in range(2, 4):
        # `running` first, then the request (the hook runs before the call does), then the end.
        running, completed = updates(f"prt_{n}")
        feed(tracker, [running])
        assert tracker.judge(asked()).verdict == ALLOW  # matched to the part recorded already
        feed(tracker, [completed])
    # The 4th call's `running` comes before the plugin's request: no abort, it waits.
    assert feed(tracker, [tool_part(S, "prt_4", "bash", "running", APPEND)]) == []
    judged = tracker.judge(asked())
    assert judged.verdict.verdict == "block" and judged.decision is not None
    assert judged.decision.call_index == 4  # recorded once: the request added no call
    assert feed(tracker, [tool_part(S, "prt_4", "bash", "error", APPEND, error="refused")]) == []


def test_a_loop_seen_first_on_the_stream_is_aborted_when_the_plugin_never_asks():
    tracker = Tracker()
    tracker.judge(asked("call_a"))
    feed(tracker, updates("prt_1", "call_a"))
    for n in range(2, 4):
        running, completed = updates(f"prt_{n}")
        feed(tracker, [running])
        tracker.judge(asked())
        feed(tracker, [completed])
    assert feed(tracker, [tool_part(S, "prt_4", "bash", "running", APPEND)]) == []
    # The plugin fell open (daemon slow): the call ran; the run is stopped as without it.
    [late] = feed(tracker, [tool_part(S, "prt_4", "bash", "completed", APPEND)])
    assert (late.call_index, late.part_id) == (4, "prt_4")


def test_repeated_call_ids_match_the_oldest_unmatched_call_of_that_tool():
    tracker = Tracker(Detection(failure_repeats=2))
    # Two plugin calls with call_0 before the stream shows either (parallel steps).
    tracker.judge(asked("call_0"))
    tracker.judge(asked("call_0", {"filePath": "a"}, "read"))
    tracker.judge(asked("call_0", {"command": "false"}))
    feed(tracker, [tool_part(S, "prt_r", "read", "completed", {"filePath": "a"})])
    feed(tracker, updates("prt_1"))
    assert tracker.sessions_view()[0].run_calls == 3  # no call counted twice
    # prt_2 is the third plugin call (the failing one): its outcome is taken, once.
    fail = {"command": "false"}
    frames = [
        tool_part(S, "prt_2", "bash", "running", fail),
        tool_part(S, "prt_2", "bash", "error", fail, error="exit 1"),
    ]
    assert feed(tracker, frames) == []
    tracker.judge(asked("call_0", {"command": "false", "x": 1}))
    frames = [
        tool_part(S, "prt_3", "bash", "running", {"command": "false", "x": 1}),
        tool_part(S, "prt_3", "bash", "error", {"command": "false", "x": 1}, error="exit 1"),
    ]
    # Found after the call ran, in a session whose plugin asks: its next call is refused.
    assert feed(tracker, frames) == []
    decision = tracker.judge(asked("call_0", {"command": "ls"})).decision
    assert decision is not None and decision.rule == "failure" and decision.call_index == 4


def test_blocked_call_repeated_is_blocked_at_once_and_escalates_to_a_hold():
    tracker = Tracker(Detection(max_interventions=2))
    verdicts = []
    for n in range(1, 8):
        judged = judge(tracker, asked())
        verdicts.append(judged.verdict.verdict)
        status = "completed" if judged.verdict == ALLOW else "error"
        feed(tracker, updates(f"prt_{n}", status=status))
        if judged.decision is not None:
            last = judged.decision
    assert verdicts == ["allow"] * 3 + ["block"] * 4  # no fresh budget of 3 after a block
    assert (last.prior_interventions, last.hold, last.plan) == (6 - 3, True, Plan.HOLD)


def test_first_action_nudge_lets_the_call_run_then_blocks_the_next_repetition():
    tracker = Tracker(Detection(first_action="nudge"))
    for n in range(1, 4):
        judge(tracker, asked())
        feed(tracker, updates(f"prt_{n}"))
    nudged = judge(tracker, asked())
    assert nudged.verdict == ALLOW and nudged.decision is not None
    assert nudged.decision.action == Action.NUDGE
    assert "Your run goes on" in nudged.decision.feedback
    feed(tracker, updates("prt_4"))
    blocked = judge(tracker, asked())
    assert blocked.verdict.verdict == "block" and blocked.decision is not None
    assert (blocked.decision.action, blocked.decision.prior_interventions) == (Action.BLOCK, 1)


def test_a_session_the_stream_never_shows_is_judged_on_the_plugin_alone():
    tracker = Tracker()
    verdicts = [tracker.judge(asked()).verdict.verdict for _ in range(4)]
    assert verdicts == ["allow"] * 3 + ["block"]


def test_first_action_stop_on_the_stream_path_aborts():
    tracker = Tracker(Detection(first_action="stop"))
    frames = [f for n in range(1, 5) for f in updates(f"prt_{n}")]
    [decision] = feed(tracker, frames)
    assert decision.action == Action.STOP and "your run was stopped" in decision.feedback


def test_a_finished_call_read_back_is_not_taken_for_the_one_the_plugin_asks_about():
    """After a reconnect the run is read back, finished calls held in flight; call ids
    repeat, so the plugin's next `call_0` must not be matched to one of them."""
    tracker = Tracker()
    tracker.judge(asked("call_a"))
    # Read back, each part comes once, in the state it had (as `export_frames` gives it).
    tracker.seed(S, [updates(f"prt_{n}")[1] for n in range(1, 4)])
    judged = tracker.judge(asked())
    assert judged.verdict.verdict == "block" and judged.decision is not None
    assert judged.decision.call_index == 4


def test_a_hold_after_two_refusals_counts_them_as_refusals():
    # The trial: the hold's feedback said "stopped 3 times" when two were refusals.
    tracker = Tracker(Detection(max_interventions=2))
    decisions = []
    for n in range(1, 7):
        judged = tracker.judge(asked())
        feed(
            tracker, updates(f"prt_{n}", status="completed" if judged.decision is None else "error")
        )
        if judged.decision is not None:
            decisions.append(judged.decision)
            if not judged.decision.hold:
                tracker.outcome(judged.decision, Outcome.BLOCKED)  # as the shell reports it
    refused, again, hold = decisions
    assert (refused.prior_outcomes, again.prior_outcomes) == ((), (Outcome.BLOCKED,))
    assert hold.hold and hold.prior_outcomes == (Outcome.BLOCKED, Outcome.BLOCKED)
    assert "looped 3 times (before this one: 2 calls refused; this run is stopped)" in hold.feedback


def test_a_question_without_a_usable_call_id_is_allowed_and_its_call_counted_once():
    # Issue 33: reports never cost a decision, and a call id the daemon cannot use is taken
    # as unknown. The stream's update of that call cannot be told to be the same call, so
    # the call is left to the stream (recorded once there, not twice): its loop is stopped
    # when the call ends, as for any call no plugin asked about.
    tracker = Tracker()
    decisions = []
    for n in range(1, 5):
        assert tracker.judge(PluginCall(S, None, "bash", APPEND, "/p")) == Judged()
        decisions += feed(tracker, updates(f"prt_{n}"))
    assert tracker.sessions_view()[0].run_calls == 4
    [decision] = decisions
    assert (decision.part_id, decision.call_index) == ("prt_4", 4)


def test_a_call_of_the_next_step_asked_before_the_stream_shows_it_climbs_the_ladder():
    # Issue 30, seen under load on the real server: the plugin's question for the model's
    # next step came before the stream showed that step, so the call was taken for one of
    # the refused call's step (a burst: `defer`) and the ladder did not climb. The plugin
    # now says the step, from the server's own events.
    def run(with_step: bool) -> list[tuple[Plan, int]]:
        tracker = Tracker()
        plans = []
        for n in range(1, 6):
            step = f"msg_prt_{n}" if with_step else None
            judged = judge(tracker, PluginCall(S, "call_0", "bash", APPEND, "/p", message_id=step))
            if judged.decision is not None:
                plans.append((judged.decision.plan, judged.decision.prior_interventions))
            if n < 4:  # the stream keeps up with the calls that run, then lags
                feed(tracker, updates(f"prt_{n}"))
        return plans

    assert run(with_step=False) == [(Plan.REFUSE, 0), (Plan.DEFER, 0)]
    assert run(with_step=True) == [(Plan.REFUSE, 0), (Plan.REFUSE, 1)]


def test_a_questions_step_is_read_when_usable_and_reported_when_not():
    from monitor.core.plugin_protocol import read_body

    def body(**extra: Any) -> bytes:
        call = {"session_id": S, "call_id": "c", "tool": "read", "args": {}, "directory": "/p"}
        return json.dumps({**call, **extra}).encode()

    assert read_body(body(message_id="msg_1")).message_id == "msg_1"
    assert read_body(body()).message_id is None
    unusable = read_body(body(message_id=7))
    assert (unusable.message_id, unusable.unusable) == (None, ("message_id",))


def test_a_question_without_its_arguments_is_read_when_it_says_they_were_cut():
    from monitor.core.plugin_protocol import RequestRefused, read_body

    call = {"session_id": S, "call_id": "c", "tool": "write", "directory": "/p"}
    cut = read_body(json.dumps({**call, "args_cut": True, "args": {"x": 1}}).encode())
    assert isinstance(cut, PluginCall) and (cut.cut, cut.args) == (True, {})
    missing = read_body(json.dumps({**call, "args_cut": 1}).encode())
    assert missing == RequestRefused(400, "args must be a JSON object")


def burst(tracker: Tracker, step: str, first: int) -> tuple[list[Judged], tuple[Reply, ...]]:
    """One model step of 5 identical parallel appends: the plugin asks about each (call 4
    completes the loop) as the stream shows it running, then OpenCode's own `doom_loop`
    check asks about the burst, naming the repeated call's arguments. The plugin's verdicts,
    and the answers to the `doom_loop` request."""
    judged = []
    for n in range(first, first + 5):
        judged.append(judge(tracker, asked(f"call_{n}", step=step)))
        feed(
            tracker,
            [tool_part(S, f"prt_{n}", "bash", "running", APPEND, None, None, f"call_{n}", step)],
        )
    metadata = {"tool": "bash", "input": APPEND}
    doom = {
        "sessionID": S,
        "id": f"per_doom{first}",
        "permission": "doom_loop",
        "metadata": metadata,
    }
    fed = tracker.feed({"type": "permission.asked", "properties": doom})
    for n in range(first, first + 5):
        status = "error" if judged[n - first].verdict.verdict == "block" else "completed"
        feed(
            tracker,
            [tool_part(S, f"prt_{n}", "bash", status, APPEND, None, None, f"call_{n}", step)],
        )
    return judged, fed.replies


def test_a_burst_refused_by_the_plugin_and_asked_about_by_doom_loop_is_one_intervention():
    """Issue 43: 5 identical parallel calls in one step; the plugin's question for call 4 is
    refused; OpenCode's `doom_loop` asks about the burst: the same loop, approved at once so
    the run goes on (each call still asks the plugin), not a second intervention. The next
    run's loop is the second intervention, refused in band: no hold."""
    tracker = Tracker(Detection(permissions="gate"))
    first, [doom] = burst(tracker, "msg_a", 1)
    assert [j.verdict.verdict for j in first] == ["allow"] * 3 + ["block"] * 2
    assert [j.decision.plan for j in first[3:] if j.decision] == [Plan.REFUSE, Plan.DEFER]
    assert (doom.reply, doom.wait, doom.loop) == ("once", 0.0, None)
    assert tracker.sessions_view()[0].interventions == 1
    feed(tracker, [idle(S), *user_frames(S, "msg_u", "Do something else.")])
    second, [doom] = burst(tracker, "msg_b", 6)
    # The stopped loop is armed: its call is that loop again at once, the ladder's 2nd rung.
    assert [j.verdict.verdict for j in second] == ["block"] * 5
    decisions = [j.decision for j in second if j.decision is not None]
    assert [(d.prior_interventions, d.plan, d.hold) for d in decisions] == [
        (1, Plan.REFUSE, False),
        *[(1, Plan.DEFER, False)] * 4,
    ]
    assert (doom.reply, doom.loop) == ("once", None)
    assert tracker.sessions_view()[0].interventions == 2
    assert tracker.held() == {}


def test_a_call_too_large_to_ask_about_refused_by_the_plugins_rule_is_its_block_not_an_abort():
    """Issue 43: four identical writes too large to send (`args_cut`): the plugin tells the
    daemon of each call, its own rule refuses the 4th; the daemon, which found the loop on
    the stream, counts that refusal as its block (no abort, one intervention)."""
    tracker = Tracker()
    write = {"filePath": "big.txt", "content": "x" * 4096}
    cut = PluginCall(S, "call_0", "write", {}, "/p", cut=True)
    decisions = []
    for n in range(1, 5):
        step = f"msg_{n}"
        assert tracker.judge(cut) == Judged()  # not judged: the stream carries its arguments
        decisions += feed(
            tracker,
            [tool_part(S, f"prt_{n}", "write", "running", write, None, None, "call_0", step)],
        )
        status, error = (
            ("error", f"{OWN_REFUSAL}: it would have completed a loop")
            if n == 4
            else ("completed", None)
        )
        end = tool_part(
            S,
            f"prt_{n}",
            "write",
            status,
            write,
            "ok" if error is None else None,
            error,
            "call_0",
            step,
        )
        decisions += feed(tracker, [end])
    [decision] = decisions
    assert (decision.call_index, decision.plan, decision.refused) == (4, Plan.REFUSE, True)
    assert tracker.sessions_view()[0].interventions == 1


def test_a_call_too_large_to_ask_about_that_ran_stops_the_run_after_it():
    """The plugin's rule let it run (it asked late, or its rule differs): the loop the stream
    found waits for the call's end, then the run is stopped as for any loop."""
    tracker = Tracker()
    write = {"filePath": "big.txt", "content": "x" * 4096}
    tracker.judge(PluginCall(S, "call_0", "write", {}, "/p", cut=True))
    decisions = []
    for n in range(1, 5):
        frames = [
            tool_part(S, f"prt_{n}", "write", s, write, "ok", None, "call_0", f"msg_{n}")
            for s in ("running", "completed")
        ]
        decisions.append(feed(tracker, frames[:1]))
        decisions.append(feed(tracker, frames[1:]))
    assert [len(d) for d in decisions] == [0] * 7 + [1]
    [late] = decisions[-1]
    assert (late.call_index, late.refused, late.part_id) == (4, False, "prt_4")


def test_a_cut_question_finds_the_loop_the_stream_found_first_and_refuses_its_call():
    tracker = Tracker()
    write = {"filePath": "big.txt", "content": "x" * 4096}
    cut = PluginCall(S, "call_0", "write", {}, "/p", cut=True)
    for n in range(1, 5):
        step = f"msg_{n}"
        assert (
            feed(
                tracker,
                [tool_part(S, f"prt_{n}", "write", "running", write, None, None, "call_0", step)],
            )
            == []
        )
        judged = tracker.judge(cut)
        if n < 4:
            assert judged == Judged()
            feed(
                tracker,
                [tool_part(S, f"prt_{n}", "write", "completed", write, "ok", None, "call_0", step)],
            )
    assert judged.verdict.verdict == "block" and judged.decision is not None
    assert judged.decision.call_index == 4


def test_a_call_of_the_step_before_ending_late_on_the_stream_does_not_move_the_step_back():
    """Found by tests/test_model.py: the plugin asked about the next step's calls (the 4th
    refused) before the stream carried the end of the step before; that end moved the
    session's step back, and the `doom_loop` request about the burst was counted again."""
    tracker = Tracker(Detection(permissions="gate"))
    read = {"filePath": "README.md"}
    judge(tracker, asked("call_0", step="msg_1"))
    feed(tracker, [tool_part(S, "prt_1", "bash", "running", APPEND, None, None, "call_0", "msg_1")])
    verdicts = []
    for k in range(4):
        verdicts.append(judge(tracker, asked(f"call_{k}", read, "read", "msg_2")).verdict.verdict)
        if k < 3:
            feed(
                tracker,
                [
                    tool_part(
                        S, f"prt_{k + 2}", "read", "running", read, None, None, f"call_{k}", "msg_2"
                    )
                ],
            )
    assert verdicts == ["allow"] * 3 + ["block"]
    feed(
        tracker, [tool_part(S, "prt_1", "bash", "completed", APPEND, "ok", None, "call_0", "msg_1")]
    )
    metadata = {"tool": "read", "input": read}
    doom = {"sessionID": S, "id": "per_doom", "permission": "doom_loop", "metadata": metadata}
    [reply] = tracker.feed({"type": "permission.asked", "properties": doom}).replies
    assert (reply.reply, reply.loop) == ("once", None)
    assert tracker.sessions_view()[0].interventions == 1
