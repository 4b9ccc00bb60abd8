"""Issue 26: every finding refused in band where the plugin asks.

A finding made after its call ran (the same failure again, no progress, a spent budget) has
nothing left to refuse; in a session whose plugin asks before every call, the session's next
call is refused with its feedback and the run goes on. The core keeps the decision for that
call (`Tracker._withhold`), whichever of the plugin's question and the stream's update of it
comes first; the run ending first releases it.
"""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from monitor.core.budget import Budget
from monitor.core.decisions import Outcome, Plan
from monitor.core.plugin_protocol import ALLOW, PluginCall
from monitor.core.tracker import Detection, Tracker
from monitor.testing import FakeOpencode, frames, play
from tests import frames_factory as ff
from tests.frames_factory import envelope, idle, tool_part, usage
from tests.harness import events, start, stop, wait_for

S = "ses_1"
FAILED = "Error: no module named pytestx"


def command(n: int) -> dict[str, str]:
    """A differently written failing command each time: no cycle, the same failure."""
    return {"command": f"python -m pytestx -k case{n}", "description": "run the tests"}


def asked(n: int, args: dict[str, Any] | None = None, tool: str = "bash") -> PluginCall:
    return PluginCall(S, f"call_{n}", tool, command(n) if args is None else args, "/p")


def updates(
    n: int, status: str, args: dict[str, Any] | None = None, exit: int | None = None, **extra: Any
) -> dict:
    frame = tool_part(
        S,
        f"prt_{n}",
        "bash",
        status,
        command(n) if args is None else args,
        call_id=f"call_{n}",
        message_id=f"msg_{n}",
        **extra,
    )
    if exit is not None:
        frame["properties"]["part"]["state"]["metadata"] = {"exit": exit}
    return frame


def failing_call(tracker: Tracker, n: int) -> list:
    """Call n asked by the plugin, run, and failed; the decisions its updates led to."""
    assert tracker.judge(asked(n)).verdict == ALLOW
    decisions = []
    for frame in (
        updates(n, "running"),
        updates(n, "completed", output=FAILED, exit=1),
    ):
        decisions += tracker.feed(frame).decisions
    return decisions


def failure_loop(tracker: Tracker) -> None:
    """Four failing calls: the fourth failure is found when it ends, after it ran."""
    for n in range(1, 5):
        assert failing_call(tracker, n) == []


def test_a_failure_found_after_its_call_ran_refuses_the_next_call_the_plugin_asks_about():
    tracker = Tracker()
    failure_loop(tracker)
    judged = tracker.judge(asked(5, {"command": "ls", "description": "list"}))
    decision = judged.decision
    assert judged.verdict.verdict == "block" and decision is not None
    assert (decision.rule, decision.part_id, decision.call_index) == ("failure", "prt_4", 4)
    assert decision.plan == Plan.REFUSE
    assert judged.verdict.feedback == decision.refusal
    assert decision.refusal.startswith(
        "Automatic notice: this call was refused and did not run, because "
        "of what your last calls did: the same error 4 times in a row (bash)."
    )
    # The refused call's own updates (the plugin's thrown text) are no call of the run.
    assert tracker.feed(updates(5, "running", {"command": "ls"})).decisions == ()
    assert tracker.feed(updates(5, "error", {"command": "ls"}, error="refused")).decisions == ()
    assert tracker.sessions_view()[0].run_calls == 4
    # One refusal: the call after it runs.
    assert tracker.judge(asked(6, {"command": "pwd", "description": "where"})).verdict == ALLOW


def test_the_next_call_on_the_stream_first_waits_for_the_plugins_question():
    tracker = Tracker()
    failure_loop(tracker)
    assert tracker.feed(updates(5, "running")).decisions == ()  # no abort: the plugin asks
    judged = tracker.judge(asked(5))
    assert judged.verdict.verdict == "block" and judged.decision is not None
    assert judged.decision.part_id == "prt_4"
    assert tracker.feed(updates(5, "error", error="refused")).decisions == ()


def test_the_next_call_ending_unasked_stops_the_run_as_before():
    # The plugin fell open (its question never came, or came after the call ran): the
    # refusal waited in vain, and the run is stopped when the call ends.
    tracker = Tracker()
    failure_loop(tracker)
    assert tracker.feed(updates(5, "running")).decisions == ()
    [decision] = tracker.feed(updates(5, "completed", output="ok")).decisions
    assert (decision.rule, decision.part_id, decision.plan) == ("failure", "prt_4", Plan.REFUSE)


def test_a_run_that_ends_before_a_next_call_releases_the_refusal():
    tracker = Tracker()
    failure_loop(tracker)
    [released] = tracker.feed(idle(S)).decisions  # the model answered instead
    assert (released.rule, released.part_id) == ("failure", "prt_4")
    assert tracker.run_over(released)  # the shell posts it late, aborts nothing
    assert tracker.feed(idle(S)).decisions == ()  # once
    assert tracker.judge(asked(5)).verdict == ALLOW


def test_a_resync_that_finds_the_run_over_releases_the_refusal():
    tracker = Tracker()
    failure_loop(tracker)
    [released] = tracker.end_runs([S, "ses_unknown"])
    assert released.part_id == "prt_4" and tracker.end_runs([S]) == []


def test_without_the_plugin_a_failure_still_stops_the_run_at_once():
    tracker = Tracker()
    decisions = []
    for n in range(1, 5):
        decisions += tracker.feed(updates(n, "running")).decisions
        decisions += tracker.feed(updates(n, "completed", output=FAILED, exit=1)).decisions
    [decision] = decisions
    assert (decision.rule, decision.part_id, decision.plan) == ("failure", "prt_4", Plan.REFUSE)


@pytest.mark.parametrize("first", ["stop", "nudge"])
def test_a_stop_or_a_nudge_keeps_its_meaning(first: str):
    # --first-action: a stop stops the run at once, a nudge posts the feedback at once and
    # lets the next call run.
    tracker = Tracker(Detection(first_action=first))  # type: ignore[arg-type]
    decisions = []
    for n in range(1, 5):
        decisions += failing_call(tracker, n)
    [decision] = decisions
    assert decision.plan == (Plan.STOP if first == "stop" else Plan.NUDGE)
    assert tracker.judge(asked(5, {"command": "ls"})).verdict == ALLOW


def test_the_failing_call_again_after_its_refusal_is_refused_again_and_climbs():
    # The next call refused, the model sends the failing call again in a later step: the
    # stopped loop's call is that loop again (armed), a second refusal on the ladder, then
    # the hold.
    tracker = Tracker()
    failure_loop(tracker)
    first = tracker.judge(asked(5, command(4)))
    assert first.decision is not None
    tracker.outcome(first.decision, Outcome.BLOCKED)
    tracker.feed(updates(5, "error", command(4), error="refused"))
    again = tracker.judge(asked(6, command(4)))
    assert again.verdict.verdict == "block" and again.decision is not None
    assert (again.decision.rule, again.decision.prior_interventions) == ("failure", 1)
    assert again.decision.plan == Plan.REFUSE
    tracker.outcome(again.decision, Outcome.BLOCKED)
    tracker.feed(updates(6, "error", command(4), error="refused"))
    third = tracker.judge(asked(7, command(4)))
    assert third.decision is not None and third.decision.plan == Plan.HOLD


def test_a_spent_budget_refuses_the_next_call_in_band():
    tracker = Tracker(Detection(run_budget=Budget(steps=2)))
    assert tracker.judge(asked(1, {"command": "ls"})).verdict == ALLOW
    assert [tracker.feed(usage(S, f"msg_{n}", 10)).decisions for n in (1, 2)] == [(), ()]
    judged = tracker.judge(asked(2, {"command": "ls -la"}))
    assert judged.verdict.verdict == "block" and judged.decision is not None
    assert (judged.decision.rule, judged.decision.part_id) == ("budget", "msg_2")
    assert "Write a short summary" in judged.decision.refusal


def test_a_text_loop_is_not_withheld():
    # The model keeps going without calls: there is no next call to refuse.
    tracker = Tracker(Detection(text_steps=3))
    assert tracker.judge(asked(1, {"command": "ls"})).verdict == ALLOW
    decisions = []
    for n in range(1, 5):
        body = {"id": f"txt_{n}", "sessionID": S, "messageID": f"msg_t{n}", "type": "text"}
        part = {**body, "text": "I will now fix it.", "time": {"start": 1, "end": 2}}
        frame = {"type": "message.part.updated", "properties": {"part": part}}
        decisions += tracker.feed(frame).decisions
    [decision] = decisions
    assert (decision.rule, decision.part_id, decision.plan) == ("text_steps", "txt_3", Plan.REFUSE)


def test_the_same_failure_again_after_the_refusal_refuses_the_call_after_it():
    # The model goes on failing the same way with yet another command: that failure is the
    # stopped loop again at once (not after 4 more), its next call refused, a second
    # intervention; a third is the hold, which stops the run.
    tracker = Tracker()
    failure_loop(tracker)
    first = tracker.judge(asked(5))
    assert first.decision is not None and first.decision.part_id == "prt_4"
    tracker.outcome(first.decision, Outcome.BLOCKED)
    tracker.feed(updates(5, "error", error="refused"))
    assert failing_call(tracker, 6) == []  # ran, failed the same way: withheld
    second = tracker.judge(asked(7))
    assert second.verdict.verdict == "block" and second.decision is not None
    assert (second.decision.part_id, second.decision.prior_interventions) == ("prt_6", 1)
    tracker.outcome(second.decision, Outcome.BLOCKED)
    tracker.feed(updates(7, "error", error="refused"))
    [held] = failing_call(tracker, 8)
    assert (held.part_id, held.plan, held.prior_interventions) == ("prt_8", Plan.HOLD, 2)


def test_a_different_failure_after_the_refusal_is_a_new_count():
    tracker = Tracker()
    failure_loop(tracker)
    first = tracker.judge(asked(5))
    assert first.decision is not None
    tracker.outcome(first.decision, Outcome.BLOCKED)
    tracker.feed(updates(5, "error", error="refused"))
    assert tracker.judge(asked(6)).verdict == ALLOW
    tracker.feed(updates(6, "running"))
    other = tracker.feed(updates(6, "completed", output="Permission denied", exit=126))
    assert other.decisions == () and tracker.judge(asked(7)).verdict == ALLOW


# -- the shell ------------------------------------------------------------------------------


async def test_a_resync_that_finds_the_run_over_posts_the_released_feedback_late():
    # The stream ends after the 4th failure (found, waiting for the next call); after the
    # reconnect the server says nothing runs: the refusal is released, the run is found over,
    # the feedback stored for the next time (noReply), nothing aborted.
    stream = frames(
        *(
            envelope(updates(n, status, **extra), "/w")
            for n in range(1, 5)
            for status, extra in (
                ("running", {}),
                ("completed", {"output": FAILED, "exit": 1}),
            )
        )
    )
    fake = FakeOpencode(
        streams=[play(stream, then="end"), play(b"")],
        busy={},
        store_prompts=True,
        messages={S: [ff.user_message(S), ff.answer_message(S)]},  # the model answered
    )
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        watch.monitor.tracker.judge(asked(0, {"command": "ls"}))  # the session's plugin asks
        await wait_for(lambda: events(logs, "feedback.sent"))
        await stop(server, watch, task)
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["rule"], outcome["part_id"], outcome["outcome"]) == (
        "failure",
        "prt_4",
        "nudged",
    )
    assert outcome["late"] == "run ended before the abort"
    assert fake.of("abort") == []
    [prompt] = fake.of("prompt_async")
    assert prompt.body["noReply"] is True  # type: ignore[index]
