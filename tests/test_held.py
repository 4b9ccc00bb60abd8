"""Held sessions as state of the core: set by a `held` outcome, ended by a person's message or
the session's deletion, read back from the session's messages after a restart, and shown by
`status` and the `sessions_held` gauge."""

from __future__ import annotations

import json
from typing import Any

from monitor.cli import main
from monitor.config import ListenAddress
from monitor.core.decisions import Outcome
from monitor.core.export import held_in
from monitor.core.feedback import MARK, feedback_text
from monitor.core.findings import CallCycle
from monitor.core.tracker import Detection, Tracker
from monitor.exits import EX_CONFIG
from monitor.shell import status as status_module
from monitor.testing import FakeOpencode, frames
from tests.frames_factory import READ, call, deleted, envelope, idle, user_frames
from tests.harness import loop_frames, start, stop, wait_for

HOLD = feedback_text(CallCycle(("read",), 4), hold=True, interventions=1)
RESUME = feedback_text(CallCycle(("read",), 4), hold=False, interventions=1)


def held_tracker() -> tuple[Tracker, list[Any]]:
    """A tracker whose session ses_1 was just put on hold by its first loop."""
    tracker = Tracker(Detection(on_loop="hold"))
    decisions = []
    for n in range(4):
        for frame in call("ses_1", f"p{n}", "read", READ):
            decisions += tracker.feed(frame).decisions
    [decision] = decisions
    assert decision.hold and tracker.held_sessions == 0  # held once the shell says so
    tracker.outcome(decision, Outcome.HELD)
    return tracker, decisions


def test_a_hold_lasts_through_our_feedback_and_ends_when_a_person_writes():
    tracker, [decision] = held_tracker()
    assert tracker.held_sessions == 1 and [v.held for v in tracker.sessions_view()] == [True]
    for frame in user_frames("ses_1", "msg_feedback", decision.feedback):
        tracker.feed(frame)
    assert tracker.held_sessions == 1  # the monitor's own feedback is a user message too
    # A person's message: its text part comes after the message and names it.
    first, text = user_frames("ses_1", "msg_person", "try the other file")
    tracker.feed(first)
    assert tracker.held_sessions == 1
    tracker.feed(text)
    assert tracker.held_sessions == 0 and [v.held for v in tracker.sessions_view()] == [False]


def test_a_text_of_another_message_or_of_the_model_does_not_end_a_hold():
    tracker, _ = held_tracker()
    tracker.feed(user_frames("ses_1", "msg_person", "x")[0])
    model_text = user_frames("ses_1", "msg_other", "an answer")[1]
    tracker.feed(model_text)
    assert tracker.held_sessions == 1


def test_other_outcomes_hold_nothing_and_a_deleted_session_is_not_held():
    tracker, [decision] = held_tracker()
    other = Tracker(Detection())
    other.outcome(decision, Outcome.ABORTED)
    assert other.held_sessions == 0
    tracker.feed(deleted("ses_1"))
    assert tracker.held_sessions == 0 and tracker.held() == {}


def message(role: str, text: str, message_id: str) -> dict[str, Any]:
    return {
        "info": {"id": message_id, "role": role, "sessionID": "ses_1"},
        "parts": [{"type": "text", "text": text}],
    }


def test_held_in_reads_whether_the_last_user_message_is_the_feedback_of_a_hold():
    prompt, answer = message("user", "go", "m1"), message("assistant", "ok", "m2")
    assert held_in([prompt, answer, message("user", HOLD, "m3")])
    # ... or its older mark, and with the model's (noReply: none) nothing after it.
    assert held_in([prompt, message("user", HOLD.replace(MARK, "Loop guard: "), "m3")])
    assert not held_in([prompt, message("user", RESUME, "m3"), answer])
    assert not held_in([prompt, message("user", HOLD, "m3"), message("user", "go on", "m4")])
    # A person quoting the note is not the monitor.
    quoted = "why: " + HOLD.split("\n\n")[-1]
    assert not held_in([prompt, message("user", quoted, "m3")])
    assert not held_in([prompt, answer]) and not held_in([])


def gauge(watch: Any) -> float | None:
    value: float | None = watch.metrics.registry.get_sample_value(
        "opencode_loop_monitor_sessions_held"
    )
    return value


async def test_the_held_gauge_goes_to_0_when_a_person_writes():
    fake = FakeOpencode()
    fake.streams = [fake.live]
    server, watch, task = await start(fake, metrics_addr="127.0.0.1:0", on_loop="hold")
    try:
        await wait_for(fake.live_connected.is_set)
        assert gauge(watch) == 0
        await fake.push(loop_frames("ses_1", 4))
        await wait_for(lambda: fake.of("prompt_async"))
        await wait_for(lambda: gauge(watch) == 1)
        assert watch.status()["totals"]["held"] == 1
        # The abort ends the run, as the real server says.
        await fake.push(frames(envelope(idle("ses_1"), "/w")))
        # The feedback the monitor stored comes back on the stream; then a person writes.
        body = fake.of("prompt_async")[0].body
        assert isinstance(body, dict) and body["noReply"] is True
        feedback = body["parts"][0]["text"]
        await fake.push(frames(*(envelope(f, "/w") for f in user_frames("ses_1", "m1", feedback))))
        await fake.push(frames(*(envelope(f, "/w") for f in user_frames("ses_1", "m2", "ok"))))
        await wait_for(lambda: gauge(watch) == 0)
        [entry] = watch.status()["sessions"]
        assert entry["state"] == "idle" and watch.status()["totals"]["held"] == 0
    finally:
        await stop(server, watch, task)


async def test_a_hold_is_read_back_from_the_messages_after_a_restart():
    # ses_1 was held by an earlier monitor; ses_2 was held too, then a person wrote; ses_3 was
    # stopped and resumed. None of them is busy: only the start's read-back can find them.
    prompt, answer = message("user", "go", "m1"), message("assistant", "ok", "m2")
    fake = FakeOpencode(
        sessions=[
            {"id": sid, "directory": "/w", "time": {"updated": n}}
            for n, sid in enumerate(("ses_1", "ses_2", "ses_3"))
        ],
        messages={
            "ses_1": [prompt, message("user", RESUME, "m3"), answer, message("user", HOLD, "m4")],
            "ses_2": [prompt, message("user", HOLD, "m3"), message("user", "go on", "m4"), answer],
            "ses_3": [prompt, message("user", RESUME, "m3"), answer],
        },
    )
    fake.streams = [fake.live]
    server, watch, task = await start(fake, metrics_addr="127.0.0.1:0")
    try:
        await wait_for(lambda: gauge(watch) == 1)
        await wait_for(fake.live_connected.is_set)
        status = watch.status()
        # ses_2 and ses_3 are known again too, idle, for the ladder (issue 25).
        assert status["totals"] == {"sessions": 3, "busy": 0, "held": 1, "interventions": 4}
        assert sorted(
            (s["session_id"], s["state"], s["interventions"]) for s in status["sessions"]
        ) == [("ses_1", "held", 2), ("ses_2", "idle", 1), ("ses_3", "idle", 1)]
        assert status["sessions"][0]["directory"] == "/w"
        # Read back where the session lives; the person's message then ends the hold.
        assert any(r.path == "/session/ses_1/message" for r in fake.requests)
        await fake.push(frames(*(envelope(f, "/w") for f in user_frames("ses_1", "m5", "ok"))))
        await wait_for(lambda: gauge(watch) == 0)
    finally:
        await stop(server, watch, task)


def test_status_without_an_address_asks_the_documented_default(monkeypatch, capsys):
    asked = []

    def fetch(address: ListenAddress, timeout: float = 5.0) -> dict[str, Any]:
        asked.append(address)
        return {"version": "1"}

    monkeypatch.delenv("OPENCODE_LOOP_MONITOR_METRICS_ADDR", raising=False)
    monkeypatch.delenv("OPENCODE_LOOP_MONITOR_CONFIG", raising=False)
    monkeypatch.setattr(status_module, "fetch_status", fetch)
    assert main(["status", "--json"]) == 0
    assert asked == [ListenAddress("127.0.0.1", 9464)]
    assert json.loads(capsys.readouterr().out) == {"version": "1"}


def test_status_on_port_0_is_a_config_error(capsys):
    assert main(["status", "--metrics-addr", "127.0.0.1:0"]) == EX_CONFIG
    assert "(not port 0)" in capsys.readouterr().err


async def test_the_ladder_continues_after_a_restart_that_found_the_session_idle():
    # Two loops stopped by an earlier monitor process, then a restart while ses_1 is idle:
    # its third loop is its third intervention (the first again before issue 25).
    prompt, answer = message("user", "go", "m1"), message("assistant", "ok", "m2")
    resumed = [message("user", RESUME, "m3"), answer, message("user", RESUME, "m4"), answer]
    fake = FakeOpencode(
        sessions=[{"id": "ses_1", "directory": "/w", "time": {"updated": 1}}],
        messages={"ses_1": [prompt, *resumed]},
    )
    fake.streams = [fake.live]
    server, watch, task = await start(fake, metrics_addr="127.0.0.1:0")
    try:
        await wait_for(lambda: watch.status()["totals"]["sessions"] == 1)
        await wait_for(fake.live_connected.is_set)
        await fake.push(loop_frames("ses_1", 4))
        await wait_for(lambda: fake.of("abort"))
        assert watch.status()["sessions"][0]["interventions"] == 3
    finally:
        await stop(server, watch, task)


async def test_as_many_held_sessions_as_the_table_holds_are_known_after_a_restart():
    held = [f"ses_{n}" for n in range(80)]
    prompt, answer = message("user", "go", "m1"), message("assistant", "ok", "m2")
    fake = FakeOpencode(
        sessions=[
            {"id": sid, "directory": "/w", "time": {"updated": n}} for n, sid in enumerate(held)
        ],
        messages={sid: [prompt, answer, message("user", HOLD, "m3")] for sid in held},
    )
    fake.streams = [fake.live]
    server, watch, task = await start(fake, metrics_addr="127.0.0.1:0")
    try:
        await wait_for(lambda: gauge(watch) == 80)  # 64 before issue 25
        assert watch.status()["totals"]["held"] == 80
    finally:
        await stop(server, watch, task)


async def test_on_2_2_5_a_hold_waiting_in_the_inbox_is_read_back_after_a_restart():
    # 2.2.5 keeps a message posted without starting a run (`resume: false`, a hold's feedback)
    # in the session's inbox, not in its record: the start's read-back reads both.
    record = [
        {"id": "msg_1", "type": "user", "text": "go"},
        {"id": "msg_2", "type": "user", "text": RESUME},
        {"id": "msg_3", "type": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    held = {"id": "msg_4", "type": "user", "payload": {"text": HOLD}, "delivery": "steer"}
    fake = FakeOpencode(
        generation=2,
        sessions=[{"id": "ses_1", "location": {"directory": "/w"}, "time": {"updated": 1}}],
        messages={"ses_1": record},
        inbox={"ses_1": [held]},
    )
    fake.streams = [fake.live]
    server, watch, task = await start(fake, metrics_addr="127.0.0.1:0")
    try:
        await wait_for(lambda: gauge(watch) == 1)
        [entry] = watch.status()["sessions"]
        assert (entry["session_id"], entry["state"], entry["interventions"]) == ("ses_1", "held", 2)
        assert [r.path for r in fake.requests if r.path.startswith("/api/session/ses_1")] == [
            "/api/session/ses_1/message",
            "/api/session/ses_1/inbox",
        ]
    finally:
        await stop(server, watch, task)
