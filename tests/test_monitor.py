"""`Monitor`, the core's one face: each input and the commands it returns, synchronously.

What the daemon's shell used to decide for itself is here, one policy a test: a standby
refuses no question on its own account, a run not yet read back is not judged, a dry run
allows what it would block, a deferred loop is not counted again, a deferred or standby
outcome is not notified, a flood of refused questions or malformed frames is one line per
interval, and the server running calls no plugin asks about is said once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from monitor.core import intervention as life
from monitor.core.commands import Await, Command, Count, Do, Log, Send, Tell
from monitor.core.decisions import Intervene, Outcome, Plan
from monitor.core.due import DUE_AGE_S
from monitor.core.monitor import NOT_ASKING, NOT_FOLLOWED, STANDBY, Monitor
from monitor.core.plugin_protocol import ALLOW, PluginCall, RequestRefused
from monitor.core.rules.runaway import call_bound
from monitor.core.server import ServerKind
from monitor.core.tracker import Detection, Tracker
from tests.frames_factory import doom_loop, run_record, tool_part

S = "ses_1"
READ = {"filePath": "README.md"}


def asked(n: int, step: str | None = None) -> PluginCall:
    return PluginCall(S, f"call_{n}", "read", READ, "/p", message_id=step or f"msg_{n}")


def ran(n: int) -> list[dict[str, Any]]:
    step = f"msg_{n}"
    return [
        tool_part(S, f"prt_{n}", "read", status, READ, "ok", call_id=f"call_{n}", message_id=step)
        for status in ("running", "completed")
    ]


def looped(monitor: Monitor, calls: int = 3) -> None:
    """`calls` reads of one file, each asked about and run."""
    for n in range(calls):
        answer, commands = monitor.question(asked(n), following=True)
        assert (answer, commands) == (ALLOW, [])
        for frame in ran(n):
            assert list(monitor.fed(monitor.tracker.feed(frame), 0.0)) == []


def blocked(commands: Sequence[Command]) -> Intervene:
    """The decision a question's commands carried out at once (its `Tell`)."""
    [tell] = [command for command in commands if isinstance(command, Tell)]
    return tell.decision


def test_the_fourth_read_is_blocked_counted_once_and_begun_from_its_refusal() -> None:
    monitor = Monitor(Tracker())
    looped(monitor)
    answer, commands = monitor.question(asked(3), following=True)
    assert answer.verdict == "block"  # type: ignore[union-attr]
    [count, detected, outcome, counted, tell] = commands
    assert count == Count("loop", (1, "cycle"))
    assert isinstance(detected, Log) and detected.event == "loop.detected"
    assert (detected.fields["call_id"], detected.fields["via"]) == ("call_3", "plugin")
    assert isinstance(outcome, Log) and outcome.fields["outcome"] == "blocked"
    assert counted == Count("intervention", (Outcome.BLOCKED,))
    assert isinstance(tell, Tell) and tell.decision.plan == Plan.REFUSE


def test_a_standby_refuses_no_question_on_its_own_account() -> None:
    monitor = Monitor(Tracker())
    looped(monitor)
    monitor.role(False, 42)
    assert monitor.question(asked(3), following=True) == (RequestRefused(503, STANDBY), [])


def test_a_run_not_yet_read_back_is_not_judged() -> None:
    monitor = Monitor(Tracker())
    answer, commands = monitor.question(asked(0), following=False)
    assert (answer, commands) == (RequestRefused(503, NOT_FOLLOWED), [])
    assert monitor.tracker.sessions_seen == 0  # not even taken in


def test_a_dry_run_allows_the_call_and_acts_on_the_decision_as_a_dry_run_does() -> None:
    monitor = Monitor(Tracker(), dry_run=True)
    looped(monitor)
    answer, commands = monitor.question(asked(3), following=True)
    assert answer == ALLOW
    counts = [command for command in commands if isinstance(command, Count)]
    # Counted once, here; its outcome a dry run's.
    assert counts == [Count("loop", (1, "cycle")), Count("intervention", (Outcome.DRY_RUN,))]


def ran_loop(monitor: Monitor) -> list[Command]:
    """Four reads run, none asked about: the commands of the fourth."""
    for n in range(3):
        for frame in ran(n):
            assert list(monitor.fed(monitor.tracker.feed(frame), 0.0)) == []
    commands: list[Command] = []
    for frame in ran(3):
        commands += monitor.fed(monitor.tracker.feed(frame), 0.0)
    return commands


def test_a_loop_found_on_the_stream_is_counted_where_it_is_acted_on() -> None:
    monitor = Monitor(Tracker())
    [do, count] = ran_loop(monitor)
    assert isinstance(do, Do) and isinstance(do.command, life.ReadRecent)  # checked first
    decision = do.command.decision
    assert decision.plan == Plan.REFUSE  # no one asked: aborted
    assert count == Count("loop", (1, "cycle"))
    assert monitor.acting_on(S)


@pytest.mark.parametrize(
    ("acting", "attached", "pid"), [(False, (), 42), (True, (S,), None)], ids=["standby", "attach"]
)
def test_a_loop_another_monitor_acts_for_is_logged_as_its_and_not_counted(
    acting: bool, attached: tuple[str, ...], pid: int | None
) -> None:
    # A standby; or a daemon, whose lock says an `attach` acts for this session.
    monitor = Monitor(Tracker())
    monitor.role(acting, pid, attached)
    [standby, outcome, counted, tell] = ran_loop(monitor)
    assert isinstance(standby, Log) and standby.event == "loop.standby"
    assert isinstance(outcome, Log) and outcome.fields["outcome"] == "standby"
    assert outcome.fields.get("acting_pid") == pid
    assert counted == Count("intervention", (Outcome.STANDBY,))
    assert isinstance(tell, Tell) and not tell.notify
    assert not monitor.acting_on(S)


def test_a_burst_asked_about_again_is_deferred_and_not_counted_again() -> None:
    monitor = Monitor(Tracker())
    looped(monitor)
    step = "msg_burst"
    _, first = monitor.question(asked(3, step), following=True)
    _, again = monitor.question(asked(4, step), following=True)
    assert [type(c) for c in first] == [Count, Log, Log, Count, Tell]
    [said] = again
    assert isinstance(said, Log) and said.event == "loop.again"


def test_a_doom_loop_request_for_a_refused_burst_is_approved_and_counted_nowhere() -> None:
    tracker = Tracker(Detection(permissions="gate"))
    monitor = Monitor(tracker)
    session = "ses_doom"
    for n in range(3):
        call = PluginCall(session, f"c{n}", "read", READ, "/p", message_id="msg_b")
        monitor.question(call, following=True)
    call = PluginCall(session, "c3", "read", READ, "/p", message_id="msg_b")
    _, refused = monitor.question(call, following=True)
    assert [type(c) for c in refused] == [Count, Log, Log, Count, Tell]  # the plugin threw
    commands = monitor.fed(tracker.feed(doom_loop(4, session=session)), 0.0)
    assert not any(isinstance(command, Count) for command in commands)
    assert isinstance(commands[-1], Send)


def test_an_outcome_is_counted_told_and_notified_unless_another_monitor_tells_of_it() -> None:
    monitor = Monitor(Tracker())
    looped(monitor)
    _, [_, detected, outcome, *told] = monitor.question(asked(3), following=True)
    assert isinstance(detected, Log) and detected.event == "loop.detected"
    assert isinstance(outcome, Log) and outcome.event == "intervention.outcome"
    decision = blocked(told)
    assert told == [
        Count("intervention", (Outcome.BLOCKED,)),
        Tell(decision, Outcome.BLOCKED, notify=True),
    ]
    standby = monitor.standby(decision, 42)[-1]
    assert standby == Tell(decision, Outcome.STANDBY, notify=False)
    # Another monitor's abort in the record: this loop is its, deferred.
    stop = dataclasses.replace(decision, part_id="p4", plan=Plan.STOP)
    [do] = monitor.act(stop)
    assert isinstance(do, Do) and isinstance(do.command, life.ReadRecent)
    record = run_record(S, 4)
    record[-1]["info"]["error"] = {"name": "MessageAbortedError", "data": {}}
    *_, deferred = monitor.happened(do.number, life.Read(record), 0.0)
    assert deferred == Tell(stop, Outcome.DEFERRED, notify=False)
    assert not monitor.acting_on(S)


def test_a_held_outcome_holds_the_session() -> None:
    monitor = Monitor(Tracker())
    looped(monitor)
    _, commands = monitor.question(asked(3), following=True)
    hold = dataclasses.replace(blocked(commands), plan=Plan.HOLD, hold=True)
    [do] = monitor.blocked(hold, "call_3")  # the call refused, then the run aborted
    assert isinstance(do, Do) and monitor.acting_on(S)
    [read] = monitor.happened(do.number, life.Read([]), 0.0)
    assert isinstance(read, Do) and isinstance(read.command, life.Abort)
    monitor.happened(do.number, life.Sent(life.Result.OK), 0.0)
    assert monitor.tracker.held_sessions == 1


def test_refused_questions_are_counted_each_and_logged_once_per_interval() -> None:
    monitor = Monitor(Tracker())
    refused = RequestRefused(401, "wrong token")
    first = monitor.refused(refused, 0.0)
    assert first == [
        Count("plugin_refused", (401,)),
        Log("warning", "plugin.refused", {"status": 401, "reason": "wrong token", "count": 1}),
    ]
    assert monitor.refused(refused, 5.0) == [Count("plugin_refused", (401,))]
    assert monitor.refused(refused, 10.0)[1] == Log(
        "warning", "plugin.refused", {"status": 401, "reason": "wrong token", "count": 2}
    )
    assert monitor.plugin_stats.refused == 3


def test_malformed_frames_are_counted_each_and_logged_once_per_interval() -> None:
    monitor = Monitor(Tracker())
    tracker = monitor.tracker
    first = monitor.fed(tracker.feed_data("{not json"), 0.0)
    assert first[0] == Count("malformed")
    assert isinstance(first[1], Log) and first[1].event == "frame.malformed"
    assert list(monitor.fed(tracker.feed_data("{not json"), 1.0)) == [Count("malformed")]


def test_a_call_starting_to_run_sets_its_time_bound() -> None:
    monitor = Monitor(Tracker())
    running = tool_part(S, "prt_1", "bash", "running", {"command": "sleep 1000"})
    [wait] = monitor.fed(monitor.tracker.feed(running), 0.0)
    assert isinstance(wait, Await) and wait.deadline.part_id == "prt_1"
    assert wait.deadline.wait == call_bound("bash", {}, 0.0)  # the server's own limit


def test_calls_no_plugin_asks_about_are_said_once_with_the_endpoint() -> None:
    monitor = Monitor(Tracker())
    monitor.serving_plugins("unix:/run/p.sock", unasked_after=5.0)
    assert monitor.tick(0.0) == []  # the first check: the calls so far are the baseline
    for n in range(2):
        for frame in ran(n):
            monitor.fed(monitor.tracker.feed(frame), 0.5)
    assert monitor.tick(1.0) == []  # calls seen, counting from now
    said = monitor.tick(7.0)
    fields = {"endpoint": "unix:/run/p.sock", "calls": 2, "hint": NOT_ASKING}
    assert said == [Log("warning", "plugin.not_asking", fields)]
    assert monitor.tick(20.0) == []  # once


def test_the_server_kind_decides_the_routes_of_sessions_not_yet_seen() -> None:
    monitor = Monitor(Tracker())
    assert monitor.tracker.route(S) == 1
    monitor.server(ServerKind(classic=False, engine=True))
    assert monitor.tracker.route(S) == 2


def test_attachs_session_found_on_the_new_engine_takes_its_routes() -> None:
    monitor = Monitor(Tracker(only_session=S), only_session=S)
    monitor.engine_known(S, 2)
    assert monitor.tracker.route(S) == 2
    other = Monitor(Tracker(only_session=S), only_session=S)
    other.engine_known(S, 1)
    assert other.tracker.route(S) == 1


def test_work_the_server_was_away_for_waits_in_the_core_for_the_next_connect() -> None:
    monitor = Monitor(Tracker())
    [do, _] = ran_loop(monitor)
    assert isinstance(do, Do) and isinstance(do.command, life.ReadRecent)
    decision = do.command.decision
    [abort] = monitor.happened(do.number, life.Read([]), 0.0)
    assert isinstance(abort, Do) and isinstance(abort.command, life.Abort)
    [due] = monitor.happened(do.number, life.Sent(life.Result.AWAY, "refused"), 1.0)
    assert isinstance(due, Log) and (due.event, due.fields["step"]) == ("intervention.due", "abort")
    assert not monitor.acting_on(S)  # parked: nothing under way for the shell
    [read_back] = monitor.resume(2.0)
    assert read_back == Do(do.number, S, life.ReadBack(decision, busy=True))
    assert monitor.acting_on(S)
    away = monitor.happened(do.number, life.Sent(life.Result.AWAY, "refused"), 3.0)
    assert [type(command) for command in away] == [Log]  # parked again, its age kept
    outcome, *_ = monitor.resume(1.0 + DUE_AGE_S)
    assert isinstance(outcome, Log) and outcome.event == "intervention.outcome"
    assert (outcome.fields["outcome"], outcome.fields["error"]) == (
        "abort_failed",
        "server away too long",
    )
    assert monitor.shutdown(2.0 + DUE_AGE_S) == [] and not monitor.acting_on(S)


def test_work_parked_at_shutdown_is_said_given_up() -> None:
    monitor = Monitor(Tracker())
    [do, _] = ran_loop(monitor)
    assert isinstance(do, Do)
    monitor.happened(do.number, life.Read([]), 0.0)
    monitor.happened(do.number, life.Sent(life.Result.AWAY, "refused"), 1.0)
    outcome, *_ = monitor.shutdown(2.0)
    assert isinstance(outcome, Log) and outcome.fields["outcome"] == "abort_failed"
    assert monitor.happened(do.number, life.Cancelled(), 3.0) == []  # done already
