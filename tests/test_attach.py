"""The pure core of `attach`: one session only, a seed from its messages, its deletion.

Given a session's messages (as `GET /session/{id}/message` answers) and then stream frames,
these are the decisions the tracker must make. The real-server behaviour is in
test_real_attach.py.
"""

import pytest

from monitor.core.commands import Log, Stop
from monitor.core.decisions import Outcome
from monitor.core.export import current_run, export_frames
from monitor.core.monitor import Monitor
from monitor.core.rules.cycle import Cycle
from monitor.core.tracker import Detection, Tracker
from tests import frames_factory as ff
from tests.frames_factory import READ, call, deleted, feed_all, idle, loop_of, tool_part

S = "ses_followed"
OTHER = "ses_other"


def user(text="go"):
    return ff.user_message(S, text)


def part(part_id, status, input=READ, tool="read"):
    return ff.export_part(S, part_id, status, input, tool)


def assistant(*parts):
    return ff.assistant_message(S, *parts)


def reads(count, prefix="p", status="completed"):
    return ff.export_reads(S, count, prefix, status)


def seeded(messages, **detection):
    tracker = Tracker(Detection(**detection), directory="/project", only_session=S)
    decisions = tracker.seed(S, export_frames(current_run(messages)))
    for decision in decisions:  # carried out, as the shell reports
        tracker.outcome(decision, Outcome.DRY_RUN)
    return tracker, decisions


# -- one session only -----------------------------------------------------------------------


def test_other_sessions_are_ignored():
    tracker = Tracker(only_session=S)
    assert feed_all(tracker, loop_of(OTHER, 8)) == []
    assert tracker.history_length(OTHER) == 0
    [decision] = feed_all(tracker, loop_of(S, 4))
    assert (decision.session_id, decision.part_id, decision.call_index) == (S, "p4", 4)


def test_without_only_session_every_session_counts():
    tracker = Tracker()
    assert [d.session_id for d in feed_all(tracker, loop_of(OTHER, 4) + loop_of(S, 4))] == [
        OTHER,
        S,
    ]


def test_deletion_of_the_followed_session_is_reported():
    tracker = Tracker(only_session=S)
    feed_all(tracker, loop_of(S, 2))
    assert tracker.feed(deleted(OTHER)).deleted is None  # not followed: as if never sent
    assert tracker.feed(deleted(S)).deleted == S
    assert tracker.history_length(S) == 0


def test_following_one_session_ends_on_its_deletion_only_and_says_so_once():
    tracker = Tracker(only_session=S)
    monitor = Monitor(tracker, only_session=S)
    assert list(monitor.fed(tracker.feed(deleted(OTHER)), 0.0)) == []
    assert list(monitor.fed(tracker.feed(deleted(S)), 0.0)) == [
        Log("info", "attach.session_deleted", {"session_id": S}),
        Stop(),
    ]
    assert list(monitor.fed(tracker.feed(deleted(S)), 0.0)) == []
    everyone = Tracker()
    assert list(Monitor(everyone).fed(everyone.feed(deleted(S)), 0.0)) == []


# -- the current run ------------------------------------------------------------------------


def test_current_run_starts_at_the_last_user_message():
    messages = [user("a"), *reads(2, "a"), user("b"), *reads(3, "b")]
    assert current_run(messages) == messages[3:]
    assert current_run([user("a")]) == [user("a")]
    assert current_run([]) == []
    # No user message at all (a truncated export): everything is the current run.
    assert current_run(reads(2)) == reads(2)


def test_current_run_skips_malformed_entries():
    messages = [user("a"), "junk", {"info": None}, *reads(1)]
    assert current_run(messages) == messages


# -- the seed -------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [3, 1, 0])
def test_seed_short_of_a_cycle_decides_nothing(count):
    tracker, decisions = seeded([user(), *reads(count)])
    assert decisions == []
    assert tracker.history_length(S) == count


def test_seed_that_completes_a_cycle_acts_at_once():
    tracker, [decision] = seeded([user(), *reads(4)])
    assert (decision.session_id, decision.part_id, decision.call_index) == (S, "p4", 4)
    assert Cycle(*decision.finding.shape()[:2]) == Cycle(1, 4) and decision.finding.shape()[2] == (
        "read",
    )
    assert decision.directory == "/project" and not decision.hold
    assert tracker.interventions(S) == 1


def test_seed_of_a_run_that_looped_long_acts_once_at_the_first_cycle():
    tracker, decisions = seeded([user(), *reads(9)])
    assert [(d.part_id, d.call_index) for d in decisions] == [("p4", 4)]
    assert tracker.interventions(S) == 1
    # Live calls go on counting from where the seed left off; the loop stopped is armed, so
    # its next live repetition is stopped at once.
    [live] = feed_all(tracker, loop_of(S, 1, prefix="live"))
    assert (live.part_id, live.call_index, live.prior_interventions) == ("live1", 10, 1)
    assert tracker.interventions(S) == 2


def test_seed_ignores_runs_that_are_over():
    # The first run looped 6 times; the user then prompted again, and 2 calls followed.
    messages = [user("a"), *reads(6, "a"), user("b"), *reads(2, "b")]
    tracker, decisions = seeded(messages)
    assert decisions == []
    assert tracker.history_length(S) == 2
    [decision] = feed_all(tracker, loop_of(S, 2, prefix="live"))
    assert decision.part_id == "live2" and decision.call_index == 4


def test_seeded_calls_and_live_calls_make_one_cycle():
    tracker, _ = seeded([user(), *reads(3)])
    [decision] = feed_all(tracker, call(S, "p4", "read", READ))
    assert (decision.part_id, decision.call_index) == ("p4", 4)


def test_seeded_parts_are_not_recorded_again_when_the_stream_repeats_them():
    # p1, p2 completed and p3 running when the messages were read; the stream, connected
    # just before, then brings p2's completion (made in the gap) and p3's own updates.
    tracker, _ = seeded([user(), *reads(2), assistant(part("p3", "running"))])
    repeated = [
        tool_part(S, "p2", "read", "completed", READ, output="ok"),
        tool_part(S, "p3", "read", "running", READ),
        tool_part(S, "p3", "read", "completed", READ, output="ok"),
    ]
    assert feed_all(tracker, repeated) == []
    assert tracker.history_length(S) == 3
    [decision] = feed_all(tracker, call(S, "p4", "read", READ))
    assert (decision.part_id, decision.call_index) == ("p4", 4)


def test_pending_part_in_the_seed_is_recorded_when_it_runs():
    tracker, _ = seeded([user(), *reads(3), assistant(part("p4", "pending"))])
    assert tracker.history_length(S) == 3
    [decision] = tracker.feed(tool_part(S, "p4", "read", "running", READ)).decisions
    assert (decision.part_id, decision.call_index) == ("p4", 4)


def test_input_output_mode_records_a_seeded_running_part_at_its_completion():
    messages = [user(), *reads(3), assistant(part("p4", "running"))]
    tracker, decisions = seeded(messages, match="input+output")
    assert decisions == [] and tracker.history_length(S) == 3
    [decision] = tracker.feed(tool_part(S, "p4", "read", "completed", READ, output="ok")).decisions
    assert (decision.part_id, decision.call_index) == ("p4", 4)
    # ... and a completed part of the seed is not recorded again in this mode either.
    tracker, _ = seeded([user(), *reads(3)], match="input+output")
    assert tracker.feed(tool_part(S, "p3", "read", "completed", READ, output="ok")).decisions == ()
    assert tracker.history_length(S) == 3


def test_seed_obeys_the_detection_settings():
    _, decisions = seeded([user(), *reads(4)], ignore_tools=frozenset({"read"}))
    assert decisions == []
    _, decisions = seeded([user(), *reads(4)], on_loop="hold")
    assert [d.hold for d in decisions] == [True]


def test_seed_counts_malformed_entries_and_goes_on():
    tracker, [decision] = seeded([user(), "junk", *reads(4)])
    assert decision.part_id == "p4"
    assert sum(tracker.malformed.values()) == 1


def test_parts_of_other_sessions_in_the_seed_are_ignored():
    stray = assistant({**part("x1", "completed"), "sessionID": OTHER})
    tracker, decisions = seeded([user(), *reads(3), stray])
    assert decisions == [] and tracker.history_length(S) == 3


def test_live_feed_after_seed_is_plain_live_feed():
    # Outside a seed, a finished part whose running was never seen is recorded once, as
    # before: the seed's in-flight rule must not leak into live feeding.
    tracker, [_] = seeded([user(), *reads(4)])
    frames = [tool_part(S, f"q{n}", "read", "completed", READ, output="x") for n in range(4)]
    # Each recorded once, live: the loop the seed stopped is armed, so each is that loop.
    assert [d.part_id for d in feed_all(tracker, frames)] == ["q0", "q1", "q2", "q3"]
    assert tracker.sessions_view()[0].run_calls == 8


# -- seeding again: after a reconnect, and after an intervention -------------------------------


def test_seed_again_after_live_calls_counts_each_call_once():
    tracker = Tracker()
    feed_all(tracker, loop_of(S, 3))  # seen live, then the stream broke
    # Read back: the same three calls and one made while we were away.
    [decision] = tracker.seed(S, export_frames(current_run([user(), *reads(4)])))
    assert (decision.part_id, decision.call_index) == ("p4", 4)


def test_seed_of_the_run_just_stopped_does_not_act_again():
    tracker = Tracker()
    [decision] = feed_all(tracker, loop_of(S, 4))
    assert decision.part_id == "p4"
    # Read back before the feedback is stored: the same run, the same loop.
    assert tracker.seed(S, export_frames(current_run([user(), *reads(6)]))) == []
    assert tracker.interventions(S) == 1


def test_positions_go_on_across_runs_and_seeds():
    tracker = Tracker()
    feed_all(tracker, loop_of(S, 2, prefix="a"))
    tracker.feed(idle(S))
    feed_all(tracker, loop_of(S, 1, prefix="b"))
    [decision] = tracker.seed(S, export_frames(current_run([user(), *reads(4)])))
    assert decision.call_index == 2 + 4


def test_seed_keeps_the_directory():
    tracker = Tracker(directory="/default")
    [decision] = tracker.seed(S, export_frames(current_run([user(), *reads(4)])), "/srv/p")
    assert decision.directory == "/srv/p"


def test_feedback_in_the_record_counts_as_earlier_interventions():
    from monitor.core.export import feedback_count
    from monitor.core.feedback import feedback_text
    from monitor.core.findings import CallCycle

    first = feedback_text(CallCycle(("read",), 4), hold=False, interventions=1)
    messages = [user(), *reads(4), user(first), *reads(4, prefix="q"), user(first), *reads(3, "r")]
    assert feedback_count(messages) == 2
    tracker = Tracker(Detection(max_interventions=2))
    frames = export_frames(current_run([*messages, *reads(1, "s")]))
    [decision] = tracker.seed(S, frames, interventions=feedback_count(messages))
    assert (decision.prior_interventions, decision.hold, decision.escalated) == (2, True, True)


def test_feedback_count_ignores_other_user_messages():
    from monitor.core.export import feedback_count

    assert feedback_count([user("Loop guards are nice"), user("go"), *reads(2)]) == 0


def test_feedback_says_it_is_automatic_and_earlier_marks_still_count():
    from monitor.core.export import feedback_count
    from monitor.core.feedback import MARK

    # A person at the TUI sees that nobody typed it.
    assert MARK == "Automatic notice: "
    oldest = user("Loop guard: a repeated tool-call cycle was detected ...")
    earlier = user("[opencode-loop-monitor] Loop guard: a repeated tool-call cycle was ...")
    now = user(MARK + "your run was stopped ...")
    assert feedback_count([oldest, *reads(2), earlier, now]) == 3
