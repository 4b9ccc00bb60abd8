from dataclasses import replace

import pytest

from monitor.core.decisions import Plan
from monitor.core.feedback import MARK
from monitor.core.findings import CallCycle, LoopAgain
from monitor.core.rules.cycle import Cycle
from monitor.core.tracker import SEED, Detection, Fed, Intervene, Tracker
from tests.captures import capture_frames
from tests.frames_factory import (
    READ,
    call,
    created,
    deleted,
    envelope,
    feed_all,
    idle,
    loop_of,
    status,
    tool_part,
)

# -- the recordings of the real server ------------------------------------------------------


def tool_part_ids(capture):
    """Distinct tool part ids of a recording in order of first appearance."""
    ids = {}
    for frame in capture_frames(capture):
        part = frame.get("properties", {}).get("part", {})
        if frame.get("type") == "message.part.updated" and part.get("type") == "tool":
            ids.setdefault(part["id"])
    return list(ids)


def test_one_tool_recording_intervenes_at_the_4th_and_every_repetition_after():
    """Recorded without a guard, so the run went on: once stopped, the loop stays armed and
    each later repetition is stopped at once."""
    decisions = feed_all(Tracker(), capture_frames("one-tool-8-calls-no-guard.event.sse"))
    assert [d.call_index for d in decisions] == [4, 5, 6, 7, 8]
    assert {(Cycle(*d.finding.shape()[:2]), d.finding.shape()[2]) for d in decisions} == {
        (Cycle(1, 4), ("read",))
    }
    parts = tool_part_ids("one-tool-8-calls-no-guard.event.sse")
    assert parts[3:8] == [d.part_id for d in decisions]
    assert {d.session_id for d in decisions} == {"ses_dd6889fa4ffeDlmaT86ONwYfWm"}
    # One step per call, each intervention carried out before the next step: each
    # repetition climbs the ladder, held from the third on.
    assert [d.prior_interventions for d in decisions] == [0, 1, 2, 3, 4]
    assert [str(d.plan) for d in decisions] == ["refuse", "refuse", "hold", "hold", "hold"]


def test_two_cycle_recording_intervenes_at_6_then_at_every_call_of_the_cycle():
    decisions = feed_all(Tracker(), capture_frames("two-cycle-40-calls-no-guard.event.sse"))
    assert [d.call_index for d in decisions] == list(range(6, 41))
    assert decisions[0].part_id == "prt_22972a2ef001qftCwGUNh6Z34w"
    parts = tool_part_ids("two-cycle-40-calls-no-guard.event.sse")
    assert parts[5:40] == [d.part_id for d in decisions]
    assert {(Cycle(*d.finding.shape()[:2]), d.finding.shape()[2]) for d in decisions} == {
        (Cycle(2, 3), ("glob", "read"))
    }
    assert {d.session_id for d in decisions} == {"ses_dd68d699dffeLqECqreqwVGTcg"}


def test_global_form_records_each_call_once_despite_sync_copies():
    tracker = Tracker()
    feed_all(tracker, capture_frames("loop-abort-feedback.global.sse"))
    # The run was 7 calls of a 3-call cycle, then idle cleared the history.
    tracker_partial = Tracker()
    frames = capture_frames("loop-abort-feedback.global.sse")
    first_idle = next(
        i
        for i, f in enumerate(frames)
        if f.get("payload", {}).get("type") in ("session.idle", "session.status")
        and f["payload"]["properties"].get("status", {}).get("type", "idle") == "idle"
    )
    feed_all(tracker_partial, frames[:first_idle])
    assert tracker_partial.history_length("ses_dd68c5d38ffeOh7wqOyc1zavTS") == 7
    assert tracker.history_length("ses_dd68c5d38ffeOh7wqOyc1zavTS") == 0


# -- recording rules ------------------------------------------------------------------------


def test_recorded_at_running_once_per_part():
    tracker = Tracker()
    frames = []
    for n in range(4):
        part = f"p{n}"
        frames += [
            tool_part("s", part, "bash", "pending"),
            tool_part("s", part, "bash", "running", {"command": "x"}),
            tool_part("s", part, "bash", "running", {"command": "x"}),  # streamed output
            tool_part("s", part, "bash", "completed", {"command": "x"}, output="o"),
        ]
    decisions = feed_all(tracker, frames)
    assert [(d.part_id, d.call_index) for d in decisions] == [("p3", 4)]


def test_decision_comes_on_the_running_update_of_the_fourth_call():
    tracker = Tracker()
    feed_all(tracker, loop_of("s", 3))
    assert tracker.feed(tool_part("s", "p4", "read", "pending")).decisions == ()
    [decision] = tracker.feed(tool_part("s", "p4", "read", "running", READ)).decisions
    assert decision.part_id == "p4"
    assert tracker.feed(tool_part("s", "p4", "read", "completed", READ, output="x")).decisions == ()


def test_completed_counts_when_running_was_never_seen():
    tracker = Tracker()
    frames = [tool_part("s", f"p{n}", "read", "completed", READ, output="x") for n in range(4)]
    assert [d.part_id for d in feed_all(tracker, frames)] == ["p3"]


def test_error_counts_when_running_was_never_seen():
    tracker = Tracker()
    frames = [tool_part("s", f"p{n}", "glob", "error", READ, error="no rg") for n in range(4)]
    assert [d.part_id for d in feed_all(tracker, frames)] == ["p3"]


def test_keyed_by_part_id_not_call_id():
    # Every part in frames_factory has callID "call_0"; two sessions share it.
    tracker = Tracker()
    feed_all(tracker, loop_of("s1", 3) + loop_of("s2", 3))
    assert tracker.history_length("s1") == 3
    assert tracker.history_length("s2") == 3


def test_history_resets_after_intervention_but_the_loop_stays_armed():
    tracker = Tracker()
    decisions = feed_all(tracker, loop_of("s", 4) + loop_of("s", 3, "read", {"x": 1}, "q"))
    assert [d.call_index for d in decisions] == [4]
    assert tracker.history_length("s") == 3  # started over: another call's budget is whole
    [again] = feed_all(tracker, loop_of("s", 1, prefix="r"))
    assert (again.call_index, again.prior_interventions, again.finding) == (
        8,
        1,
        LoopAgain("read", decisions[0].finding),
    )


def test_changing_argument_prevents_detection():
    tracker = Tracker()
    frames = []
    for n in range(10):
        frames += call("s", f"p{n}", "read", {"filePath": f"f{n}.py"})
    assert feed_all(tracker, frames) == []


# -- session lifetime -----------------------------------------------------------------------


@pytest.mark.parametrize("end", [idle("s"), status("s", "idle"), envelope(idle("s"))])
def test_idle_clears_history_but_keeps_interventions_and_the_armed_loop_one_run(end):
    tracker = Tracker()
    other = ("read", {"filePath": "other"})
    feed_all(tracker, loop_of("s", 4) + loop_of("s", 2, *other, prefix="q"))
    assert tracker.history_length("s") == 2
    tracker.feed(end)
    assert tracker.history_length("s") == 0
    assert tracker.interventions("s") == 1
    # The run after the stopped one: the stopped call is a loop at once.
    [decision] = feed_all(tracker, loop_of("s", 1, prefix="r"))
    assert (decision.call_index, decision.prior_interventions) == (7, 1)
    # Two runs later without a repetition, the loop is disarmed: a whole budget again.
    # The server says idle twice at every run end: the pair ends one run.
    tracker.feed(end)
    tracker.feed(end)
    tracker.feed(status("s", "busy"))
    tracker.feed(end)
    assert [d.call_index for d in feed_all(tracker, loop_of("s", 4, prefix="t"))] == [11]


def test_deleted_clears_everything():
    tracker = Tracker()
    feed_all(tracker, loop_of("s", 5))
    tracker.feed(deleted("s"))
    assert tracker.history_length("s") == 0 and tracker.interventions("s") == 0


def test_busy_status_keeps_history():
    tracker = Tracker()
    feed_all(tracker, loop_of("s", 3))
    tracker.feed(status("s", "busy"))
    assert tracker.history_length("s") == 3


def test_end_runs_ends_the_runs_named_and_no_other():
    tracker = Tracker()
    feed_all(tracker, loop_of("a", 3) + loop_of("b", 3))
    tracker.end_runs(["a"])
    assert tracker.history_length("a") == 0 and tracker.history_length("b") == 3


def test_sessions_bounded():
    tracker = Tracker(Detection(max_sessions=3))
    for n in range(10):
        feed_all(tracker, loop_of(f"s{n}", 1))
    assert tracker.active_sessions == 3


# -- directories ----------------------------------------------------------------------------


def test_directory_from_global_envelope():
    tracker = Tracker()
    [decision] = feed_all(tracker, [envelope(f, "/srv/a") for f in loop_of("s", 4)])
    assert decision.directory == "/srv/a"


def test_directory_from_session_info_and_default():
    tracker = Tracker(directory="/default")
    tracker.feed(created("s", "/srv/b"))
    [from_info] = feed_all(tracker, loop_of("s", 4))
    [from_default] = feed_all(tracker, loop_of("t", 4))
    assert (from_info.directory, from_default.directory) == ("/srv/b", "/default")


# -- what is skipped ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "server.heartbeat", "properties": {}},
        {"payload": {"type": "server.connected", "properties": {}}},
        {"directory": "/d", "payload": {"type": "sync", "syncEvent": {"type": "x"}}},
        {"type": "some.future.event", "properties": {"x": 1}},
        # Text parts go to the text rules (tests/test_text.py); other part types are skipped.
        {"type": "message.part.updated", "properties": {"part": {"type": "step-start"}}},
    ],
)
def test_skipped_frames(frame):
    tracker = Tracker()
    assert tracker.feed(frame).decisions == ()
    assert not tracker.malformed and tracker.active_sessions == 0


@pytest.mark.parametrize(
    "frame, reason",
    [
        ([], "frame is not an object"),
        ("text", "frame is not an object"),
        (None, "frame is not an object"),
        ({}, "event type missing"),
        ({"type": 7}, "event type missing"),
        ({"payload": []}, "payload is not an object"),
        ({"directory": 5, "payload": {}}, "envelope directory is not a string"),
        ({"type": "session.idle"}, "session.idle: properties is not an object"),
        (
            {"type": "session.idle", "properties": {}},
            "session.idle: sessionID is not a non-empty string",
        ),
        (
            {"type": "message.part.updated", "properties": {"part": 1}},
            "message.part.updated: part is not an object",
        ),
        (
            {"type": "message.part.updated", "properties": {"part": {"type": "tool", "state": {}}}},
            "message.part.updated: sessionID is not a non-empty string",
        ),
        (
            {"type": "session.status", "properties": {"sessionID": "s", "status": "idle"}},
            "session.status: status is not an object",
        ),
    ],
)
def test_malformed_frames_counted_not_raised(frame, reason):
    tracker = Tracker()
    assert tracker.feed(frame).decisions == ()
    assert tracker.malformed == {reason: 1}


def test_deeply_nested_frame_is_harmless():
    nested: object = {}
    for _ in range(100_000):
        nested = {"a": nested}
    tracker = Tracker()
    assert tracker.feed({"type": "message.part.updated", "properties": nested}).decisions == ()
    assert sum(tracker.malformed.values()) == 1


# -- match modes and exclusions -------------------------------------------------------------


def test_input_output_mode_changing_output_is_not_a_loop():
    tracker = Tracker(Detection(match="input+output"))
    frames = []
    for n in range(8):
        frames += call("s", f"p{n}", "bash", {"command": "make status"}, output=f"{n}% done")
    assert feed_all(tracker, frames) == []


def test_input_output_mode_records_on_completion():
    tracker = Tracker(Detection(match="input+output"))
    frames = []
    for n in range(4):
        frames += call("s", f"p{n}", "bash", {"command": "make"}, output="failed")
    decisions = feed_all(tracker, frames)
    assert [d.part_id for d in decisions] == ["p3"]
    # the decision came from the completed update, the last frame
    assert feed_all(Tracker(Detection(match="input+output")), frames[:-1]) == []


def test_input_mode_ignores_output():
    frames = []
    for n in range(4):
        frames += call("s", f"p{n}", "bash", {"command": "make status"}, output=f"{n}%")
    assert [d.call_index for d in feed_all(Tracker(), frames)] == [4]


def test_ignore_tools():
    tracker = Tracker(Detection(ignore_tools=frozenset({"todowrite"})))
    frames = loop_of("s", 8, tool="todowrite", input={"todos": []})
    assert feed_all(tracker, frames) == []
    assert tracker.history_length("s") == 0


def test_ignore_args():
    frames = []
    for n in range(4):
        frames += call("s", f"p{n}", "bash", {"command": "make", "description": f"try {n}"})
    assert feed_all(Tracker(SEED), frames) == []
    tracker = Tracker(replace(SEED, ignore_args={"bash": frozenset({"description"})}))
    assert [d.call_index for d in feed_all(tracker, frames)] == [4]


# -- escalation and feedback ----------------------------------------------------------------


def test_escalation_holds_after_max_interventions():
    tracker = Tracker(Detection(max_interventions=2))
    decisions = feed_all(tracker, loop_of("s", 6))
    assert [(d.call_index, d.prior_interventions, d.hold, d.escalated) for d in decisions] == [
        (4, 0, False, False),
        (5, 1, False, False),
        (6, 2, True, True),
    ]
    assert "on hold" in decisions[2].feedback and "on hold" not in decisions[0].feedback


def test_on_loop_hold_always_holds():
    [decision] = feed_all(Tracker(Detection(on_loop="hold")), loop_of("s", 4))
    assert decision.hold and not decision.escalated


def test_decision_fields_and_feedback_text():
    tracker = Tracker()
    frames = []
    pattern = [("read", {"filePath": "a"}), ("edit", {"filePath": "a"}), ("bash", {"command": "t"})]
    for n in range(9):
        tool, args = pattern[n % 3]
        frames += call("s", f"p{n + 1}", tool, args)
    [decision] = feed_all(tracker, [envelope(f, "/w") for f in frames])
    assert decision == Intervene(
        session_id="s",
        directory="/w",
        finding=CallCycle(("read", "edit", "bash"), 3),
        part_id="p9",
        call_index=9,
        prior_interventions=0,
        hold=False,
        escalated=False,
        feedback=decision.feedback,
        plan=Plan.REFUSE,
        refusal=decision.refusal,
    )
    assert decision.rule == "cycle"
    assert decision.refusal.startswith(MARK) and "did not run" in decision.refusal
    text = decision.feedback
    assert "3 calls (read, edit, bash) repeated 3 times" in text
    assert "kept making the same calls" in text and "stopped at this call" in text
    assert "reply to the person now without calling a tool" in text
    assert '"a"' not in text and "filePath" not in text


# -- raw data -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, reason",
    [
        ("{not json", "frame is not JSON"),
        # Deeper than `json.loads` reads and over what `deep_json` is given (test_deep_frames).
        ("[" * 600_000 + "]" * 600_000, "frame nested too deeply"),
    ],
)
def test_feed_data_counts_undecodable_frames(data, reason):
    tracker = Tracker()
    assert tracker.feed_data(data) == Fed(event_type="malformed", malformed=reason)
    assert tracker.malformed == {reason: 1}


def test_feed_data_decodes_and_feeds():
    import json

    tracker = Tracker()
    decisions = []
    for frame in loop_of("s", 4):
        decisions += tracker.feed_data(json.dumps(frame)).decisions
    assert [d.call_index for d in decisions] == [4]


def test_a_malformed_in_place_of_a_frame_is_counted():
    from monitor.core.events import Malformed

    tracker = Tracker()
    assert tracker.feed(Malformed("export: message is not {info, parts}")).decisions == ()
    assert tracker.malformed == {"export: message is not {info, parts}": 1}


def test_sessions_seen_counts_each_session_once():
    tracker = Tracker()
    feed_all(tracker, loop_of("a", 3) + loop_of("b", 1) + [idle("a"), status("b", "busy")])
    assert tracker.sessions_seen == 2


# -- the read-only view `status` shows ---------------------------------------------------------


def test_sessions_view_shows_runs_calls_and_interventions():
    tracker = Tracker(Detection())
    # s1 is caught on call 4 and its run is still under way (busy) until the server says idle.
    feed_all(tracker, [envelope(f, "/w") for f in loop_of("s1", 4)])
    feed_all(tracker, [envelope(f, "/v") for f in loop_of("s2", 2, tool="grep")])
    feed_all(tracker, [envelope(idle("s2"), "/v")])
    feed_all(tracker, [envelope(f, "/v") for f in call("s2", "q1", "glob", READ)])
    assert [
        (v.session_id, v.directory, v.busy, v.run_calls, v.calls, v.interventions)
        for v in tracker.sessions_view()
    ] == [("s1", "/w", True, 4, 4, 1), ("s2", "/v", True, 1, 3, 0)]
    # The intervention dropped s1's history; its run ends when the server says so.
    tracker.end_run("s1")
    [s1, _] = tracker.sessions_view()
    assert (s1.busy, s1.run_calls, s1.calls, s1.interventions) == (False, 0, 4, 1)
