"""Rule `runaway`'s time bound: a call still running past its bound is stopped. The core keeps
no clock: a call that starts running gives the shell a `Deadline`, which the shell feeds back
(`Tracker.overdue`) once it passed (the streamed-output half of the rule is in
tests/test_progress_rules.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from monitor.core.decisions import Deadline
from monitor.core.export import export_frames
from monitor.core.rules.runaway import GRACE_S, SERVER_BASH_S, call_bound
from monitor.core.tracker import SEED, Detection, Fed, Tracker
from monitor.testing import FakeOpencode, engine_call, frames, play
from tests import frames_factory as ff
from tests.frames_factory import call, envelope
from tests.harness import FAST, events, watched_until

SES = "ses_runaway"
PATIENT = replace(FAST, read_timeout=60)
SLEEP = {"command": "sleep infinity"}


def fed(tracker: Tracker, updates: list[dict]) -> list[Fed]:
    return [tracker.feed(update) for update in updates]


@pytest.mark.parametrize(
    ("tool", "args", "seconds", "expected"),
    [
        ("bash", SLEEP, 0, SERVER_BASH_S + GRACE_S),  # the server's 2 minutes, then 30 s
        ("bash", {**SLEEP, "timeout": 600_000}, 0, 600 + GRACE_S),  # the call's own timeout
        ("bash", {**SLEEP, "timeout": "x"}, 0, SERVER_BASH_S + GRACE_S),
        ("task", {"prompt": "p"}, 0, None),  # a subagent may work for an hour
        ("task", {"prompt": "p"}, 90, 90),  # unless a bound is set
        ("bash", SLEEP, 90, 90),
        ("bash", SLEEP, -1, None),  # off
    ],
)
def test_call_bound(tool: str, args: Any, seconds: float, expected: float | None) -> None:
    assert call_bound(tool, args, seconds) == expected


def test_a_call_that_starts_running_gets_one_deadline() -> None:
    tracker = Tracker(Detection())
    pending, running, completed = call(SES, "prt_1", "bash", SLEEP)
    again = {**running, "id": "evt_again"}  # bash re-sends `running` as its output grows
    deadlines = [f.deadlines for f in fed(tracker, [pending, running, again, completed])]
    assert deadlines == [(), (Deadline(SES, "prt_1", SERVER_BASH_S + GRACE_S),), (), ()]


def test_no_deadline_without_a_bound() -> None:
    assert [f.deadlines for f in fed(Tracker(SEED), call(SES, "prt_1", "bash", SLEEP))] == [()] * 3
    reads = fed(Tracker(Detection()), call(SES, "prt_1", "read", {"filePath": "a"}))
    assert [f.deadlines for f in reads] == [()] * 3


def test_a_call_still_running_at_its_deadline_ran_away() -> None:
    tracker = Tracker(replace(Detection(), call_seconds=60))
    [deadline] = [
        d for f in fed(tracker, call(SES, "prt_1", "bash", SLEEP)[:2]) for d in f.deadlines
    ]
    decision = tracker.overdue(deadline)
    assert decision is not None
    assert (decision.rule, decision.part_id, decision.session_id) == ("runaway", "prt_1", SES)
    assert decision.finding.describe() == "one bash call was still running after 60 s"
    assert "a call ran away" in decision.feedback
    # the intervention stops it: the same deadline again is nothing
    assert tracker.overdue(deadline) is None


def test_a_call_that_ended_before_its_deadline_is_nothing() -> None:
    tracker = Tracker(replace(Detection(), call_seconds=60))
    [deadline] = [d for f in fed(tracker, call(SES, "prt_1", "bash", SLEEP)) for d in f.deadlines]
    assert tracker.overdue(deadline) is None
    assert tracker.overdue(Deadline("ses_unknown", "prt_9", 60)) is None


async def test_the_shell_stops_a_call_still_running_past_its_bound() -> None:
    # A bash call that starts and never ends, on a stream that stays open.
    running = [envelope(f, "/w") for f in call("ses_r1", "p1", "bash", SLEEP)[:2]]
    fake = FakeOpencode(streams=[play(frames(*running))], store_prompts=True)
    # No read timeout meanwhile: a reconnect's resync would find the run over (the stand-in
    # says no session is busy), and a call of a run over runs away from nobody.
    logs = await watched_until(fake, "intervention.outcome", PATIENT, call_seconds=1)
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["rule"], outcome["part_id"], outcome["outcome"]) == ("runaway", "p1", "aborted")
    assert [r.path for r in fake.of("abort")] == ["/session/ses_r1/abort"]
    [prompt] = fake.of("prompt_async")
    text = prompt.body["parts"][0]["text"]  # type: ignore[index]
    assert "one bash call was still running after 1 s" in text


def test_a_new_engine_call_gets_its_bound_from_tool_called() -> None:
    # Issue 33: the new engine sends nothing while a shell call runs (no re-sent `running`
    # with its output, which the other half of the rule reads), so its bound, started at
    # `tool.called`, is all that ends a `while true` there.
    tracker = Tracker(Detection())
    forever = {"command": "while true; do echo y; done", "timeout": 5_000}
    started, called, succeeded = engine_call(SES, 1, "shell", forever, 1)
    assert [f.deadlines for f in fed(tracker, [started, called])] == [
        (),
        (Deadline(SES, "msg_1:call_1", 5 + GRACE_S),),  # its own timeout, as a 1.x bash call's
    ]
    decision = tracker.overdue(Deadline(SES, "msg_1:call_1", 5 + GRACE_S))
    assert decision is not None
    assert (decision.rule, decision.part_id) == ("runaway", "msg_1:call_1")
    assert decision.finding.describe() == "one bash call was still running after 35 s"
    # One that ended first is nothing.
    tracker = Tracker(replace(Detection(), call_seconds=60))
    [deadline] = [d for f in fed(tracker, [started, called, succeeded]) for d in f.deadlines]
    assert deadline == Deadline(SES, "msg_1:call_1", 60)
    assert tracker.overdue(deadline) is None


def test_a_runaway_is_stopped_also_where_the_first_action_is_a_nudge() -> None:
    # A nudge is read at the model's next step, which a call that does not end never reaches.
    tracker = Tracker(replace(Detection(), call_seconds=60, first_action="nudge"))
    [deadline] = [
        d for f in fed(tracker, call(SES, "prt_1", "bash", SLEEP)[:2]) for d in f.deadlines
    ]
    decision = tracker.overdue(deadline)
    assert decision is not None
    assert (decision.plan, decision.action, decision.prior_interventions) == ("stop", "stop", 0)
    assert "your run was stopped because a call ran away" in decision.feedback


def started_before(session: str = SES) -> list[dict]:
    """A run read back: a finished read, then a bash call still running."""
    return [
        ff.user_message(session),
        ff.assistant_message(session, ff.export_part(session, "prt_1", "completed")),
        ff.assistant_message(session, ff.export_part(session, "prt_2", "running", SLEEP, "bash")),
    ]


def test_a_call_read_back_still_running_gets_its_bound_from_now() -> None:
    # Started while the monitor was away (a restart, a reconnect): without a bound of its
    # own it would never be stopped.
    tracker = Tracker(Detection())
    assert tracker.seed(SES, list(export_frames(started_before())), "/w") == []
    [deadline] = tracker.read_back_deadlines(SES)
    assert deadline == Deadline(SES, "prt_2", SERVER_BASH_S + GRACE_S)
    decision = tracker.overdue(deadline)
    assert decision is not None and (decision.rule, decision.part_id) == ("runaway", "prt_2")
    assert tracker.read_back_deadlines("ses_unknown") == ()


async def test_a_call_running_when_the_monitor_starts_is_stopped_past_its_bound() -> None:
    fake = FakeOpencode(
        streams=[play(b"")],
        busy={"ses_r1": {"type": "busy"}},
        messages={"ses_r1": started_before("ses_r1")},
        store_prompts=True,
    )
    logs = await watched_until(fake, "intervention.outcome", PATIENT, call_seconds=1)
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["rule"], outcome["part_id"], outcome["outcome"]) == (
        "runaway",
        "prt_2",
        "aborted",
    )
    assert [r.path for r in fake.of("abort")] == ["/session/ses_r1/abort"]
