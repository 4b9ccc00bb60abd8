"""A loop that goes on across a compaction is the same loop (issue 31).

`compaction-6-reads` was recorded from the real 1.18.33 (tests/recordings/README.md): six
identical reads, the session compacted between the 2nd and the 3rd (the scripted model's
`compact_after=2`), the run going on to its end with no idle between. Live or read back, the
loop is caught on its 4th call, as it is without a compaction; a person's next prompt still
starts a run of its own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from monitor.core.compaction import by_compaction, is_summary
from monitor.core.decisions import Outcome
from monitor.core.detection import Detection
from monitor.core.export import answered, current_run, export_frames
from monitor.core.findings import CallCycle, LoopAgain
from monitor.core.tracker import Tracker
from tests.captures import CAPTURES, capture_frames
from tests.frames_factory import feed_all, idle, loop_of, status, user_message

RECORDING = "compaction-6-reads.event.sse"


def recorded_messages() -> list[dict[str, Any]]:
    text = (CAPTURES / "compaction-6-reads.messages.json").read_text(encoding="utf-8")
    return list(json.loads(text))


def recorded_parts(messages: list[dict[str, Any]]) -> list[str]:
    return [p["id"] for m in messages for p in m["parts"] if p.get("type") == "tool"]


def payload_type(frame: object) -> str:
    return str(frame.get("type")) if isinstance(frame, dict) else ""


def the_compaction(session: str) -> list[object]:
    """The recording's frames from the compaction's first message to `session.compacted`,
    moved to `session`."""
    frames = capture_frames(RECORDING)
    start = next(
        i
        for i, f in enumerate(frames)
        if payload_type(f) == "message.part.updated"
        and f["properties"]["part"]["type"] == "compaction"  # type: ignore[index]
    )
    end = next(i for i, f in enumerate(frames) if payload_type(f) == "session.compacted")
    recorded = frames[start - 1]["properties"]["info"]["sessionID"]  # type: ignore[index]
    return [
        json.loads(json.dumps(f).replace(recorded, session)) for f in frames[start - 1 : end + 1]
    ]


def test_the_recording_compacts_between_the_second_and_third_call_with_no_idle():
    kinds = []
    for frame in capture_frames(RECORDING):
        kind = payload_type(frame)
        part = frame["properties"].get("part", {}) if isinstance(frame, dict) else {}
        if kind == "message.part.updated" and part.get("type") == "tool":
            kind = "call" if part["state"]["status"] == "completed" else ""
        if kind in ("call", "session.compacted", "session.idle"):
            kinds.append(kind)
    assert kinds == ["call"] * 2 + ["session.compacted"] + ["call"] * 4 + ["session.idle"]


def test_a_loop_across_a_compaction_is_caught_on_its_fourth_call_live():
    parts = recorded_parts(recorded_messages())
    # The recorded run went on to its 6th read (nothing stopped it): the first decision is
    # where the monitor stops it.
    decision = feed_all(Tracker(), capture_frames(RECORDING))[0]
    assert isinstance(decision.finding, CallCycle)
    # The 4th read, the 2nd after the compaction, in the run it began in (no run ended).
    assert (decision.part_id, decision.call_index, decision.run) == (parts[3], 4, 0)


def test_a_loop_across_a_compaction_is_caught_on_its_fourth_call_read_back():
    messages = recorded_messages()
    parts = recorded_parts(messages)
    # After a reconnect: the current run is the whole run, its calls before the compaction
    # included, and it is over only once the model answered, not at the summary.
    assert recorded_parts(current_run(messages)) == parts
    tracker = Tracker()
    [decision] = tracker.seed("ses_x", export_frames(current_run(messages)))
    assert (decision.part_id, decision.call_index) == (parts[3], 4)
    # Replayed from the export: no run ends at the compaction's messages either.
    replayed = feed_all(Tracker(), export_frames(messages))[0]
    assert (replayed.part_id, replayed.call_index) == (parts[3], 4)


def test_the_summary_is_not_the_answer_that_ends_the_run():
    messages = recorded_messages()
    summary = next(i for i, m in enumerate(messages) if m["info"].get("summary") is True)
    assert is_summary(messages[summary]["info"])
    assert not answered(messages[: summary + 1])
    assert answered(messages)  # the model's own answer at the end does


def test_a_prompt_after_a_compaction_starts_a_run_of_its_own():
    messages = recorded_messages()
    # The recorded run up to its 3rd read (two before the compaction, one after), then a
    # person's prompt and three more identical reads: six in the session, three in each run.
    first = messages[:7]
    assert len(recorded_parts(first)) == 3 and first[3]["parts"][0]["type"] == "compaction"
    session = messages[0]["info"]["sessionID"]
    reads = json.loads(json.dumps(messages[1:3] + messages[6:7]).replace('"prt_', '"prt_z'))
    later = [*first, user_message(session, "read it again"), *reads]
    assert current_run(later)[0] is later[7]
    assert feed_all(Tracker(), export_frames(later)) == []
    frames = list(export_frames(later))
    idles = [i for i, f in enumerate(frames) if payload_type(f) == "session.idle"]
    assert len(idles) == 1 and len(frames) - idles[0] - 1 == 3  # before the prompt only


@pytest.mark.parametrize(
    ("parts", "made_by_compaction"),
    [
        ([{"type": "compaction", "auto": True, "overflow": False}], True),
        (
            [
                {
                    "type": "text",
                    "text": "Continue if you have next steps",
                    "synthetic": True,
                    "metadata": {"compaction_continue": True},
                }
            ],
            True,
        ),
        ([{"type": "text", "text": "go on"}], False),
        ([{"type": "text", "text": "x", "synthetic": True}], False),
        ([{"type": "compaction", "auto": False}, {"type": "text", "text": "and fix it"}], False),
        ([], False),
    ],
)
def test_which_user_messages_a_compaction_stored(parts, made_by_compaction):
    message = {"info": {"role": "user", "sessionID": "ses_1"}, "parts": parts}
    assert by_compaction(message) is made_by_compaction


def test_the_ladder_and_the_armed_loop_survive_a_compaction():
    tracker = Tracker(Detection(first_action="nudge"))
    [nudged] = feed_all(tracker, loop_of("ses_1", 4))
    assert nudged.prior_interventions == 0
    assert feed_all(tracker, the_compaction("ses_1")) == []
    # The same read after the compaction is that loop again, at once: no fresh budget, and
    # the next rung of the ladder.
    [again] = feed_all(tracker, loop_of("ses_1", 1, prefix="after"))
    assert (again.part_id, again.call_index, again.prior_interventions, again.run) == (
        "after1",
        5,
        1,
        0,
    )
    assert again.finding == LoopAgain("read", nudged.finding)


def said(session: str, step: int, text: str) -> list[object]:
    """A model step's finished text part (its own assistant message), as the stream sends it."""
    body = {
        "id": f"prt_said{step}",
        "sessionID": session,
        "messageID": f"msg_said{step}",
        "type": "text",
        "text": text,
        "time": {"start": 1, "end": 2},
    }
    return [{"type": "message.part.updated", "properties": {"sessionID": session, "part": body}}]


def test_the_summary_is_no_step_of_the_model_that_repeats_its_answer():
    tracker = Tracker()
    same = "I will look around a bit more."
    decisions = [d for step in range(4) for d in feed_all(tracker, said("ses_1", step, same))]
    decisions += feed_all(tracker, the_compaction("ses_1"))
    decisions += [d for step in range(4, 10) for d in feed_all(tracker, said("ses_1", step, same))]
    # The 8th step with the same words, the 4th after the summary, as without a compaction.
    assert [(d.rule, d.part_id) for d in decisions][:1] == [("text_steps", "prt_said7")]


def asked_compaction(session: str) -> list[object]:
    """A compaction a person asked for (`POST /session/{id}/summarize`), as 1.18.33 sent it
    (tests/test_real_compaction.py): the recording's, its request's part `auto: false`,
    without the "continue"; after the summary `session.compacted`, busy, then the run's end
    (docs/detection.md, "Compaction")."""
    frames = the_compaction(session)
    cont = next(
        i
        for i, f in enumerate(frames)
        if payload_type(f) == "message.part.updated"
        and f["properties"]["part"].get("synthetic") is True  # type: ignore[index]
    )
    frames = frames[: cont - 1]  # the continue's message and its part go
    for frame in frames:
        part = frame["properties"].get("part", {})  # type: ignore[index]
        if part.get("type") == "compaction":
            part["auto"] = False
    compacted = {"type": "session.compacted", "properties": {"sessionID": session}}
    return [*frames, compacted, status(session, "busy"), status(session, "idle"), idle(session)]


def prompt(session: str, text: str) -> list[object]:
    """A person's prompt as the stream carries it: its user message, then the run busy."""
    info = {"id": f"msg_u_{text}", "role": "user", "sessionID": session}
    return [{"type": "message.updated", "properties": {"info": info}}, status(session, "busy")]


def test_a_summarize_in_the_middle_of_a_loop_changes_nothing_about_its_call():
    """Issue 44: three identical reads, a person's `/summarize` (the run ends in idle), then
    "Please continue with the task." and the same read: the 4th call of the loop, in the run
    it began in, as without the summarize (it was the new run's 1st call, and the loop was
    caught 3 calls later)."""
    tracker = Tracker()
    assert feed_all(tracker, [status("ses_1", "busy"), *loop_of("ses_1", 3)]) == []
    assert feed_all(tracker, asked_compaction("ses_1")) == []
    again = [
        *prompt("ses_1", "Please continue with the task."),
        *loop_of("ses_1", 1, prefix="after"),
    ]
    [decision] = feed_all(tracker, again)
    assert (decision.rule, decision.part_id, decision.call_index, decision.run) == (
        "cycle",
        "after1",
        4,
        0,
    )


def test_a_summarize_between_a_stopped_loop_and_its_relapse_uses_up_no_run():
    """Issue 44: a stopped loop stays armed for the next run; a person compacting the idle
    session in between is no run, so the same read asked for again is refused at once (it
    ran 3 times before the refusal when the compaction used that run up)."""
    tracker = Tracker()
    [stopped] = feed_all(tracker, [status("ses_1", "busy"), *loop_of("ses_1", 4)])
    tracker.outcome(stopped, Outcome.ABORTED)
    feed_all(tracker, [status("ses_1", "idle"), idle("ses_1")])
    busy = status("ses_1", "busy")
    assert feed_all(tracker, [busy, *asked_compaction("ses_1")]) == []
    [again] = feed_all(tracker, [*prompt("ses_1", "read it"), *loop_of("ses_1", 1, prefix="after")])
    # The session's 5th call, in its 2nd run (run 1): the compaction counted no run.
    assert (again.part_id, again.call_index, again.run) == ("after1", 5, 1)
    assert again.finding == LoopAgain("read", stopped.finding)


def test_an_aborted_run_after_a_summarize_still_ends():
    """The run after a compaction is a run: its idle ends it (history and all)."""
    tracker = Tracker()
    feed_all(tracker, [status("ses_1", "busy"), *loop_of("ses_1", 3), *asked_compaction("ses_1")])
    feed_all(tracker, [*prompt("ses_1", "go on"), status("ses_1", "idle"), idle("ses_1")])
    assert feed_all(tracker, [*prompt("ses_1", "again"), *loop_of("ses_1", 3, prefix="x")]) == []
    assert tracker.history_length("ses_1") == 3
