"""An intervention's life (monitor/core/intervention.py): every (state, event) pair of its
table, written out apart from it, then each channel as a synchronous sequence of commands
and results, as the shell's executor would carry them out."""

from __future__ import annotations

import dataclasses

import pytest

from monitor.core import intervention as life
from monitor.core.decisions import Intervene, Plan, Reply
from monitor.core.feedback import MARK
from monitor.core.findings import DoomLoop
from monitor.core.intervention import (
    TABLE,
    Abort,
    Answer,
    Decided,
    Event,
    Intervention,
    Logged,
    Park,
    Post,
    Read,
    ReadBack,
    ReadRecent,
    Result,
    Sent,
    State,
    Turn,
    Wait,
)
from tests.frames_factory import answer_message, run_record, user_message
from tests.harness import held_decision, refused_record

# What every pair must do: event>state/effect, the pairs not listed must be refused.
EXPECTED = {
    "check": "other>done/deferred nothing>check/none ended>over/none clear>abort/none "
    "cancelled>done/cancelled dropped>done/abort_failed",
    "nudge_check": "other>done/deferred nothing>nudge_check/none ended>feedback_check/nudged "
    "clear>feedback_check/nudged cancelled>done/cancelled dropped>done/abort_failed",
    "over": "other>done/deferred nothing>over/none ended>feedback_check/nudged_late "
    "clear>done/deferred cancelled>done/cancelled dropped>done/abort_failed",
    "abort": "ok>feedback_check/stopped away>due_abort/keep failed>done/abort_failed "
    "cancelled>done/cancelled dropped>done/abort_failed",
    "doom_abort": "ok>feedback_check/rejected away>done/abort_failed failed>done/abort_failed "
    "cancelled>done/cancelled dropped>done/abort_failed",
    "grace": "expired>reply/none answered>done/answered cancelled>done/cancelled "
    "dropped>done/abort_failed",
    "reply": "ok>done/rejected refused_stop>abort/none refused_doom>doom_abort/none "
    "first>check/none away>check/none failed>check/none cancelled>done/cancelled "
    "dropped>done/abort_failed",
    "feedback_check": "other>done/found clear>post/none cancelled>done/feedback_failed "
    "dropped>done/feedback_failed",
    "post": "ok>done/sent away>due_feedback/keep failed>done/feedback_failed "
    "cancelled>done/feedback_failed dropped>done/feedback_failed",
    "due_abort": "resumed>recheck_abort/none cancelled>done/abort_failed dropped>done/abort_failed",
    "due_feedback": "resumed>recheck_feedback/none cancelled>done/feedback_failed "
    "dropped>done/feedback_failed",
    "recheck_abort": "busy>check/none other>done/confirmed_found clear>post/confirmed "
    "away>due_abort/keep failed>done/abort_failed cancelled>done/cancelled "
    "dropped>done/abort_failed",
    "recheck_feedback": "other>done/found clear>post/none away>due_feedback/keep "
    "failed>done/feedback_failed cancelled>done/feedback_failed dropped>done/feedback_failed",
    "done": "",
}


def expected_pairs() -> dict[tuple[State, Event], str]:
    pairs = {}
    for state, row in EXPECTED.items():
        for cell in row.split():
            event, target = cell.split(">")
            pairs[(State(state), Event(event))] = target
    return pairs


def test_every_state_is_written_out() -> None:
    assert set(EXPECTED) == {str(state) for state in State}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("event", list(Event))
def test_each_pair(state: State, event: Event) -> None:
    expected = expected_pairs().get((state, event))
    row = TABLE.get((state, event))
    assert (None if row is None else f"{row[0]}/{row[1]}") == expected


def test_a_pair_the_table_refuses_is_a_bug_not_a_silent_move() -> None:
    done = Intervention(held_decision(), State.DONE)
    with pytest.raises(AssertionError, match="done cannot take resumed"):
        done.feed(life.Resumed())


# -- each channel, command by command ------------------------------------------------------------


def loop(plan: Plan = Plan.REFUSE, **changes: object) -> Intervene:
    return dataclasses.replace(
        held_decision(), plan=plan, hold=plan == Plan.HOLD, escalated=False, **changes
    )


def outcomes(turn: Turn) -> list[tuple[str, dict[str, object]]]:
    """Each report as (event, the fields the test looks at)."""
    said = []
    for report in turn.reports:
        if isinstance(report, Decided):
            fields = dict(report.fields)
            said.append(("intervention.outcome", fields))
        elif isinstance(report, Logged):
            said.append((report.event, dict(report.fields)))
        else:
            said.append(("forget", {"session_id": report.session_id}))
    return said


def only_outcome(turn: Turn) -> dict[str, object]:
    [(event, fields)] = outcomes(turn)
    assert event == "intervention.outcome"
    return fields


RECORD = run_record("ses_1", 4, prefix="prt_")  # the loop's calls, nothing of another monitor


def test_the_abort_and_the_feedback_go_by_the_route_the_decision_carries() -> None:
    found, _ = life.found(dataclasses.replace(loop(Plan.STOP), route=2), dry_run=False)
    assert found is not None
    assert found.feed(Read(RECORD)).command == Abort("ses_1", "/w", 2)
    found.feed(Sent(Result.OK, ms=1.0))
    assert found.feed(Read(RECORD)).command == Post("ses_1", "/w", MARK + "held", False, "prt_4", 2)


def test_a_loop_found_is_checked_aborted_then_told_after_a_stagger() -> None:
    found, turn = life.found(loop(Plan.STOP), dry_run=False)
    assert found is not None
    [(event, detected)] = outcomes(turn)
    assert (event, detected["plan"], detected["channel"]) == ("loop.detected", "stop", "abort")
    assert turn.command == ReadRecent(found.decision, life.RECENT_MESSAGES, 0.0)
    turn = found.feed(Read(RECORD))
    assert turn == Turn((), Abort("ses_1", "/w", 1))
    turn = found.feed(Sent(Result.OK, ms=7.5))
    fields = only_outcome(turn)
    assert (fields["outcome"], fields["abort_ms"], fields["channel"]) == ("aborted", 7.5, "abort")
    assert turn.command == ReadRecent(found.decision, life.RECENT_MESSAGES, staggered=True)
    turn = found.feed(Read(RECORD))
    assert turn.command == Post("ses_1", "/w", MARK + "held", False, "prt_4", 1)
    turn = found.feed(Sent(Result.OK))
    assert outcomes(turn) == [("feedback.sent", {"session_id": "ses_1", "hold": False})]
    assert turn.command is None and found.state == State.DONE


def test_a_loop_another_monitor_refused_is_left_to_it() -> None:
    found, _ = life.found(loop(), dry_run=False)
    assert found is not None
    turn = found.feed(Read(refused_record()))
    assert only_outcome(turn)["outcome"] == "deferred"
    assert only_outcome(turn)["reason"] == "call already refused"
    assert turn.command is None


def test_our_own_refusal_in_the_record_is_not_another_monitors() -> None:
    found, _ = life.refused_call(loop(Plan.HOLD), via="plugin", call_id="call_4")
    assert found is not None and found.ours
    assert found.feed(Read(refused_record())).command == Abort("ses_1", "/w", 1)


def test_where_another_monitor_answers_the_plugin_the_record_is_read_three_times() -> None:
    found, turn = life.found(loop(), dry_run=False, reads=3)
    assert found is not None
    pauses = []
    while isinstance(turn.command, ReadRecent):
        pauses.append(turn.command.pause)
        turn = found.feed(Read(RECORD))
    assert pauses == [0.0, 0.1, 0.1] and turn.command == Abort("ses_1", "/w", 1)


def test_a_run_that_ended_by_itself_is_told_once_for_its_next_turn() -> None:
    found, _ = life.found(loop(Plan.STOP), dry_run=False)
    assert found is not None
    assert found.feed(Read(RECORD, run_over=True)).command == ReadRecent(
        found.decision, life.RECENT_MESSAGES, 0.0
    )
    assert found.state == State.OVER
    turn = found.feed(Read([*RECORD, answer_message("ses_1")]))
    assert only_outcome(turn)["late"] == "run ended before the abort"
    found.feed(Read(RECORD))
    assert found.command() == Post("ses_1", "/w", MARK + "held", True, "prt_4", 1)


def test_a_run_over_without_an_answer_or_a_mark_was_stopped_by_someone_else() -> None:
    found, _ = life.found(loop(), dry_run=False)
    assert found is not None
    turn = found.feed(Read(RECORD, run_over=True))
    pauses = []
    while isinstance(turn.command, ReadRecent):
        pauses.append(turn.command.pause)
        turn = found.feed(Read(RECORD))
    assert pauses == [0.0, 0.1, 0.1]
    assert only_outcome(turn)["reason"] == "run ended without an answer"


def test_a_nudge_is_posted_without_reply_and_the_run_goes_on() -> None:
    found, _ = life.found(loop(Plan.NUDGE), dry_run=False)
    assert found is not None and found.state == State.NUDGE_CHECK
    turn = found.feed(Read(RECORD, run_over=True))
    assert (only_outcome(turn)["outcome"], only_outcome(turn)["channel"]) == ("nudged", "nudge")
    found.feed(Read(RECORD))
    assert found.command() == Post("ses_1", "/w", MARK + "held", True, "prt_4", 1)


def test_an_abort_the_server_never_answered_waits_and_is_read_back() -> None:
    found, _ = life.found(loop(Plan.HOLD), dry_run=False)
    assert found is not None
    found.feed(Read(RECORD))
    turn = found.feed(Sent(Result.AWAY, "POST /session/ses_1/abort: connection refused"))
    assert outcomes(turn) == [
        (
            "intervention.due",
            {
                "session_id": "ses_1",
                "step": "abort",
                "error": "POST /session/ses_1/abort: connection refused",
            },
        )
    ]
    assert turn.command == Park("ses_1", "prt_4")
    assert found.feed(life.Resumed()).command == ReadBack(found.decision, busy=True)
    turn = found.feed(Read(RECORD, busy=False))
    fields = only_outcome(turn)
    assert (fields["outcome"], fields["confirmed"]) == (
        "held",
        "run stopped, read back after reconnect",
    )
    assert "abort_ms" not in fields
    assert turn.command == Post("ses_1", "/w", MARK + "held", True, "prt_4", 1)


def test_a_run_still_busy_after_the_reconnect_is_stopped_now() -> None:
    found = Intervention(loop(Plan.STOP), State.RECHECK_ABORT)
    assert found.feed(Read(RECORD, busy=True)).command == ReadRecent(
        found.decision, life.RECENT_MESSAGES, 0.0
    )


def test_feedback_stored_before_the_server_went_away_is_not_posted_again() -> None:
    found = Intervention(loop(Plan.STOP), State.RECHECK_FEEDBACK)
    stored = [*RECORD, user_message("ses_1", MARK + "held")]
    turn = found.feed(Read(stored))
    assert outcomes(turn) == [
        ("feedback.sent", {"session_id": "ses_1", "hold": False, "found": True})
    ]
    assert turn.command is None


def test_an_abort_of_a_session_gone_fails_and_forgets_it() -> None:
    found, _ = life.found(loop(), dry_run=False)
    assert found is not None
    found.feed(Read(None))  # unreadable: acted on all the same
    turn = found.feed(Sent(Result.GONE, "session not found", ms=2.0))
    [(_, fields), forget] = outcomes(turn)
    assert (fields["outcome"], fields["error"], fields["abort_ms"]) == (
        "abort_failed",
        "session not found",
        2.0,
    )
    assert forget == ("forget", {"session_id": "ses_1"})


def request(plan: Plan = Plan.REFUSE, wait: float = 0.0, **changes: object) -> Reply:
    decision = loop(plan, **changes)
    return Reply("per_1", "ses_1", "/w", "reject", "refused", decision, wait)


def test_a_refused_request_is_the_whole_intervention_of_a_block() -> None:
    found, turn = life.request(request())
    assert found is not None
    [(_, detected)] = outcomes(turn)
    assert (detected["request_id"], detected["channel"]) == ("per_1", "permission")
    assert turn.command == Answer(request())
    turn = found.feed(Sent(Result.OK, ms=3.0))
    fields = only_outcome(turn)
    assert (fields["outcome"], fields["request_id"], fields["reply_ms"]) == (
        "rejected",
        "per_1",
        3.0,
    )
    assert turn.command is None


def test_a_refused_request_of_a_hold_then_aborts_and_posts_at_once() -> None:
    found, _ = life.request(request(Plan.HOLD))
    assert found is not None
    assert found.feed(Sent(Result.OK, ms=3.0)).command == Abort("ses_1", "/w", 1)
    turn = found.feed(Sent(Result.OK, ms=4.0))
    fields = only_outcome(turn)
    assert (fields["outcome"], fields["reply_ms"], fields["abort_ms"]) == ("held", 3.0, 4.0)
    assert turn.command == ReadRecent(found.decision, life.RECENT_MESSAGES, staggered=False)
    assert found.feed(Read(refused_record())).command == Post(
        "ses_1", "/w", MARK + "held", True, "prt_4", 1
    )


def test_a_request_answered_first_is_stopped_as_a_loop_without_one() -> None:
    found, _ = life.request(request(Plan.STOP))
    assert found is not None
    turn = found.feed(Sent(Result.NOT_TAKEN))
    assert turn.command == ReadRecent(found.decision, life.RECENT_MESSAGES, 0.0)
    for _ in range(life.REFUSED_READS - 1):
        turn = found.feed(Read(RECORD))
    turn = found.feed(Read(RECORD))
    assert turn.command == Abort("ses_1", "/w", 1)
    fields = only_outcome(found.feed(Sent(Result.OK, ms=1.0)))
    assert (fields["fallback"], "reply_ms" in fields) == ("answered first", False)
    assert found.command() == ReadRecent(found.decision, life.RECENT_MESSAGES, staggered=True)


def test_a_refused_doom_loop_request_clears_the_run_for_the_feedback() -> None:
    doom = DoomLoop("read", 3)
    found, _ = life.request(request(finding=doom))
    assert found is not None
    assert found.feed(Sent(Result.OK, ms=3.0)).command == Abort("ses_1", "/w", 1)
    assert only_outcome(found.feed(Sent(Result.OK)))["outcome"] == "rejected"
    assert found.state == State.FEEDBACK_CHECK
    failed, _ = life.request(request(finding=doom))
    assert failed is not None
    failed.feed(Sent(Result.OK))
    fields = only_outcome(failed.feed(Sent(Result.AWAY, "timed out")))
    assert (fields["outcome"], fields["error"]) == ("abort_failed", "timed out")


def test_a_request_a_person_answers_within_the_grace_period_is_theirs() -> None:
    found, turn = life.request(request(wait=2.0))
    assert found is not None and turn.command == Wait(request(wait=2.0))
    assert only_outcome(found.feed(life.Expired(None)))["outcome"] == "answered"
    later, _ = life.request(request(wait=2.0))
    assert later is not None
    now = dataclasses.replace(request(), message="refused now")
    assert later.feed(life.Expired(now)).command == Answer(now)


def test_shutdown_before_the_outcome_cancels_it_and_after_it_fails_the_feedback() -> None:
    found, _ = life.found(loop(), dry_run=False)
    assert found is not None
    assert only_outcome(found.feed(life.Cancelled()))["outcome"] == "cancelled"
    posting = Intervention(loop(), State.POST)
    assert outcomes(posting.feed(life.Cancelled())) == [
        ("feedback.failed", {"session_id": "ses_1", "error": "cancelled at shutdown"})
    ]
    parked = Intervention(loop(), State.DUE_ABORT)
    fields = only_outcome(parked.feed(life.Cancelled()))
    assert (fields["outcome"], fields["error"]) == ("abort_failed", "cancelled at shutdown")


def test_what_needs_no_command_is_decided_at_once() -> None:
    assert life.found(loop(), dry_run=True)[0] is None
    assert only_outcome(Turn(life.found(loop(), dry_run=True)[1].reports[1:]))["outcome"] == (
        "dry_run"
    )
    blocked, turn = life.refused_call(loop(), via="plugin", call_id="call_4")
    assert blocked is None
    [(_, detected), (_, fields)] = outcomes(turn)
    said = (detected["via"], detected["channel"], fields["outcome"], fields["call_id"])
    assert said == ("plugin", "plugin", "blocked", "call_4")
    [(seen_as, seen), (_, fields)] = outcomes(life.standby(loop(), acting_pid=42))
    # Not `loop.detected`: what counts those counts each loop once, the acting monitor's.
    assert (seen_as, seen["standby"], seen["channel"]) == ("loop.standby", True, "none")
    assert (fields["outcome"], fields["acting_pid"]) == ("standby", 42)
    again = outcomes(life.found(loop(Plan.DEFER), dry_run=False)[1])
    assert [event for event, _ in again] == ["loop.again"]
    assert life.request(dataclasses.replace(request(), loop=None)) == (None, Turn())


def test_a_call_the_plugins_own_rule_refused_counts_as_this_interventions_block() -> None:
    found, turn = life.found(loop(refused=True), dry_run=False)
    assert found is None
    assert [fields["via"] for _, fields in outcomes(turn)] == ["plugin_rule", "plugin_rule"]
    assert only_outcome(Turn(turn.reports[1:]))["outcome"] == "blocked"
