"""What the demo tells a person, from the records and frames it is given (no server)."""

from __future__ import annotations

import io

from monitor.core.feedback import feedback_text
from monitor.core.findings import CallCycle
from monitor.kit.demo import DRY_RUN_ANSWER, Printer, _summary
from monitor.kit.scripted_model import DEFAULT_ANSWER

SESSION = "ses_demo"


def outcome(name: str) -> dict[str, object]:
    return {
        "event": "intervention.outcome",
        "session_id": SESSION,
        "outcome": name,
        "part_id": "prt_6",
        "call_index": 6,
        "cycle_length": 2,
        "repetitions": 3,
        "tools": ["read", "bash"],
        "finding": "2 calls (read, bash) repeated 3 times",
    }


def feedback_frames(text: str) -> list[dict[str, object]]:
    info = {"id": "msg_2", "role": "user", "sessionID": SESSION}
    part = {"id": "prt_t", "type": "text", "messageID": "msg_2", "sessionID": SESSION, "text": text}
    return [
        {"type": "message.updated", "properties": {"sessionID": SESSION, "info": info}},
        {"type": "message.part.updated", "properties": {"sessionID": SESSION, "part": part}},
    ]


def story(outcome_name: str) -> list[str]:
    out = io.StringIO()
    printer = Printer(out)
    printer.session_id = SESSION
    script = {"id": "msg_1", "role": "user", "sessionID": SESSION}
    printer.server_frame(
        {"type": "message.updated", "properties": {"sessionID": SESSION, "info": script}}
    )
    printer.monitor_record(outcome(outcome_name))
    for frame in feedback_frames("Loop guard: stop.\n\nMore."):
        printer.server_frame(frame)
    return out.getvalue().splitlines()


def test_held_feedback_is_said_to_be_stored_for_a_person():
    assert (
        story("held")[-1]
        == 'monitor: feedback stored in the session for a person: "Loop guard: stop."'
    )


def test_feedback_after_an_abort_is_sent_to_the_model():
    assert story("aborted")[-1] == 'monitor: feedback sent to the model: "Loop guard: stop."'


def parts(*statuses: str) -> list[dict[str, object]]:
    return [{"id": f"prt_{n + 1}", "state": {"status": s}} for n, s in enumerate(statuses)]


def test_a_refused_call_is_not_counted_as_run():
    summary = _summary(outcome("rejected"), parts(*["completed"] * 5, "error"))
    assert summary == (
        "demo finished: the model asked for 6 calls, 5 ran: call 6 completed the loop and was "
        "refused before it ran; the model went on."
    )


def test_the_dry_run_answer_does_not_answer_feedback_never_sent():
    assert DRY_RUN_ANSWER != DEFAULT_ANSWER and "stop repeating" not in DRY_RUN_ANSWER


def test_a_session_held_at_its_first_stop_says_once():
    text = feedback_text(CallCycle(("read", "bash"), 3), hold=True, interventions=1)
    assert "looped once (this run is stopped)" in text and "1 times" not in text


def tool_frame(number: int, status: str) -> dict[str, object]:
    part = {
        "id": f"prt_{number}",
        "type": "tool",
        "tool": "bash",
        "sessionID": SESSION,
        "state": {"status": status, "input": {"command": "ls"}},
    }
    return {"type": "message.part.updated", "properties": {"sessionID": SESSION, "part": part}}


def printer_after_calls(calls: int, status: str) -> tuple[Printer, io.StringIO]:
    """A printer that has shown the session's first `calls` calls, each in `status`."""
    out = io.StringIO()
    printer = Printer(out)
    printer.session_id = SESSION
    for number in range(1, calls + 1):
        printer.server_frame(tool_frame(number, status))
    return printer, out


def test_a_call_refused_before_the_stream_shows_it_is_said_after_its_own_line():
    """Issue 45: the plugin asks before the stream shows call 6, so its refusal was printed
    before `call 6 bash ls`, which then read as if it ran after being refused."""
    printer, out = printer_after_calls(5, "completed")
    printer.monitor_record(outcome("blocked"))
    assert printer.detected.is_set()  # the story goes on meanwhile
    printer.server_frame(tool_frame(6, "pending"))
    printer.server_frame(tool_frame(6, "error"))
    lines = out.getvalue().splitlines()
    assert lines[-2:] == [
        "  call 6   bash   ls",
        "monitor: loop detected on call 6: 2 calls (read, bash) repeated 3 times; "
        "refused in band by the plugin: it never ran",
    ]


def test_a_call_shown_before_its_detection_is_not_held_back():
    printer, out = printer_after_calls(6, "running")
    printer.monitor_record(outcome("aborted"))
    assert out.getvalue().splitlines()[-1].startswith("monitor: loop detected on call 6: ")
