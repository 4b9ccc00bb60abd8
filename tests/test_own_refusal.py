"""Issue 30: a refusal by the plugin's own rule (no monitor answered its question) is the
acting monitor's intervention, counted on its ladder, not another monitor's to defer to.

With `attach` and the plugin but no daemon, the plugin refused every repetition on its own
and `attach` deferred to it each time ("call already refused"): no ladder climbed, the session
was never held. The plugin's own refusal now has its own text (`OWN_REFUSAL`), which the core
reads on the loop's call (`Intervene.refused`).
"""

from __future__ import annotations

import dataclasses

from monitor.core.decisions import Action, Outcome, Plan
from monitor.core.export import intervened
from monitor.core.feedback import MARK, OWN_REFUSAL
from monitor.core.tracker import Detection, Tracker
from monitor.testing import FakeOpencode
from tests import frames_factory as ff
from tests.frames_factory import READ, tool_part
from tests.harness import carried_out, events, held_decision, refused_record

S = "ses_own"
PLUGIN_TEXT = f"{OWN_REFUSAL}: it would have completed a loop, 1 call (read) repeated 3 times"


def refused(n: int, text: str = PLUGIN_TEXT) -> list[dict]:
    """Call n as the server shows a call its plugin threw for: never running, an error."""
    step = f"msg_{n}"
    return [
        tool_part(S, f"prt_{n}", "read", "pending", message_id=step, call_id=f"call_{n}"),
        tool_part(S, f"prt_{n}", "read", "error", READ, error=text, message_id=step),
    ]


def ran(n: int) -> list[dict]:
    return ff.call(S, f"prt_{n}", "read", READ)


def decisions(tracker: Tracker, frames: list[dict], outcome: Outcome = Outcome.BLOCKED) -> list:
    """The decisions of `frames`, each reported carried out with `outcome` as the shell would."""
    made = []
    for frame in frames:
        for decision in tracker.feed(frame).decisions:
            tracker.outcome(decision, outcome)
            made.append(decision)
    return made


def test_the_plugins_own_refusal_is_the_loops_intervention_and_the_ladder_climbs_to_a_hold():
    tracker = Tracker(Detection(max_interventions=2))
    assert decisions(tracker, ran(1) + ran(2) + ran(3)) == []
    [first] = decisions(tracker, refused(4))
    assert (first.refused, first.plan, first.call_index, first.part_id) == (
        True,
        Plan.REFUSE,
        4,
        "prt_4",
    )
    # The model repeats the refused call at each next step; the plugin refuses each on its own.
    [second] = decisions(tracker, refused(5))
    assert (second.refused, second.plan, second.prior_interventions) == (True, Plan.REFUSE, 1)
    [third] = decisions(tracker, refused(6), Outcome.HELD)
    assert (third.refused, third.plan, third.hold, third.escalated) == (True, Plan.HOLD, True, True)
    assert tracker.interventions(S) == 3
    assert tracker.held() == {S: None}


def test_a_monitors_refusal_on_the_stream_is_not_the_plugins_own():
    tracker = Tracker()
    decisions(tracker, ran(1) + ran(2) + ran(3))
    [decision] = decisions(tracker, refused(4, f"{MARK}this call was refused and did not run"))
    assert decision.refused is False  # another monitor's: the record check defers to it


def test_a_loop_found_on_a_call_that_ran_is_not_refused():
    tracker = Tracker()
    [decision] = decisions(tracker, ran(1) + ran(2) + ran(3) + ran(4))
    assert decision.refused is False and decision.plan == Plan.REFUSE


def record_with(error: str) -> list[dict]:
    part = ff.export_part(S, "prt_4", "error")
    part["state"]["error"] = error
    return [ff.user_message(S), ff.assistant_message(S, part)]


def test_the_record_check_defers_to_a_monitors_refusal_only():
    assert intervened(record_with(PLUGIN_TEXT), "prt_4") is None
    monitor_text = f"{MARK}this call was refused and did not run: it would have completed a loop"
    assert intervened(record_with(monitor_text), "prt_4") == "call already refused"


def own_refusal_record() -> list[dict]:
    """`refused_record`'s session, its loop's call refused by the plugin's own rule."""
    record = refused_record()
    for message in record:
        for part in message["parts"]:
            if part.get("id") == "prt_4":
                part["state"]["error"] = PLUGIN_TEXT
    return record


async def test_the_shell_counts_the_plugins_refusal_as_its_block_without_a_request():
    fake = FakeOpencode(messages={"ses_1": own_refusal_record()})
    decision = dataclasses.replace(
        held_decision(), hold=False, escalated=False, action=Action.BLOCK, plan=Plan.REFUSE
    )
    logs = await carried_out(fake, lambda a: a.submit(dataclasses.replace(decision, refused=True)))
    [detected] = events(logs, "loop.detected")
    [outcome] = events(logs, "intervention.outcome")
    assert (detected["via"], outcome["outcome"], outcome["via"]) == (
        "plugin_rule",
        "blocked",
        "plugin_rule",
    )
    assert "call_id" not in outcome
    assert fake.requests == []  # refused already: nothing to read, abort or post


async def test_a_hold_on_the_plugins_refusal_stops_the_run_and_stores_the_feedback():
    fake = FakeOpencode(messages={"ses_1": own_refusal_record()}, answers={"prompt_async": [204]})
    logs = await carried_out(
        fake, lambda a: a.submit(dataclasses.replace(held_decision(), refused=True))
    )
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["outcome"], outcome["via"]) == ("held", "plugin_rule")
    assert [r.path for r in fake.of("abort")] == ["/session/ses_1/abort"]
    [feedback] = fake.of("prompt_async")
    assert feedback.body["noReply"] is True


def running(n: int) -> list[dict]:
    step = f"msg_{n}"
    return [
        tool_part(S, f"prt_{n}", "read", "pending", message_id=step, call_id=f"call_{n}"),
        tool_part(S, f"prt_{n}", "read", "running", READ, message_id=step, call_id=f"call_{n}"),
    ]


def test_attach_waits_for_the_loops_call_to_end_and_hands_the_loop_over_however_it_ends():
    # `attach` answers no plugin: the loop found at call 4's start waits for its end (a plugin
    # may be refusing it), at most the wait; the end, or the wait, hands it over, once.
    tracker = Tracker(own_refusal_wait=1.0)
    decisions(tracker, ran(1) + ran(2) + ran(3))
    fed = [tracker.feed(frame) for frame in running(4)]
    assert [d for f in fed for d in f.decisions] == []
    [waiting] = [d for f in fed for d in f.deadlines if d.loop]
    assert (waiting.part_id, waiting.wait) == ("prt_4", 1.0)
    # Someone else stops the run first (its idle comes before the call's last update, as on
    # the real server): the loop is handed over all the same, for the shell to find over.
    tracker.feed(ff.idle(S))
    aborted = tool_part(S, "prt_4", "read", "error", READ, error="Tool execution aborted")
    [handed] = tracker.feed(aborted).decisions
    assert (handed.part_id, handed.refused) == ("prt_4", False)
    assert tracker.overdue(waiting) is None  # handed over once


def test_a_loops_call_that_outlasts_the_wait_is_handed_over_by_the_wait():
    tracker = Tracker(own_refusal_wait=1.0)
    decisions(tracker, ran(1) + ran(2) + ran(3))
    [waiting] = [d for frame in running(4) for d in tracker.feed(frame).deadlines if d.loop]
    decision = tracker.overdue(waiting)
    assert decision is not None and (decision.part_id, decision.refused) == ("prt_4", False)
    done = tool_part(S, "prt_4", "read", "completed", READ, output="ok")
    assert tracker.feed(done).decisions == ()  # the end finds it handed over
