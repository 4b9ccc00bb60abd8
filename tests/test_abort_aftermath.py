"""Issue 43: an intervention's abort is not a new loop.

The abort ends every call of the run in error, also the calls a burst started after the
decision: a `task` call ends in "Task cancelled" when its subagent was cancelled first, any
call in "Tool execution aborted" (1.18.33), a new-engine call in "Tool execution interrupted".
Those ends are the abort's doing: from the decision that aborts the run until the run ends,
no call's end feeds a rule (`SessionRecord.stopping`). Without it the failure rule counted
four of them as "the same error 4 times in a row", a second intervention, and the person's
next loop in that session was held at once.

The order of the frames is the real server's (recorded on 1.18.33 with 25 subagents asked in
one step): each task part `pending`, its child session created, then the part `running`; so
the tree decision at the 21st child comes before tasks 21 to 25 run.
"""

from __future__ import annotations

from typing import Any

import pytest

from monitor.core.calls import Step
from monitor.core.decisions import Intervene, Outcome, Plan
from monitor.core.export import current_run, export_frames, feedback_count, held_in, late_frames
from monitor.core.export_v2 import messages_v1_shape
from monitor.core.fed import SessionView
from monitor.core.feedback import HOLD_NOTE, MARK, is_hold_feedback
from monitor.core.findings import Rule
from monitor.core.plugin_protocol import PluginCall
from monitor.core.tracker import Detection, Tracker
from monitor.testing import engine_call, engine_event
from tests import frames_factory as ff
from tests.frames_factory import READ, idle, loop_of, status, subagent, tool_part, user_frames

ROOT = "ses_root"
STEP = "msg_burst"
TASK_CANCELLED = "Task cancelled"
ABORTED = "Tool execution aborted"
INTERRUPTED = "Tool execution interrupted"
NEXT_LOOP = {"command": "git status"}


class Session:
    """A tracker fed as the shell feeds it: each decision's outcome reported (`outcome`, None:
    not yet, the abort's answer still on its way)."""

    def __init__(self, tracker: Tracker, outcome: Outcome | None = Outcome.ABORTED) -> None:
        self.tracker = tracker
        self.outcome = outcome
        self.decisions: list[Intervene] = []

    def feed(self, *frames: dict[str, Any]) -> list[Intervene]:
        made = []
        for frame in frames:
            for decision in self.tracker.feed(frame).decisions:
                if self.outcome is not None and decision.plan is not Plan.DEFER:
                    self.tracker.outcome(decision, self.outcome)
                made.append(decision)
        self.decisions += made
        return made

    def next_loop(self, session: str = ROOT) -> Intervene:
        """The run ends, the person writes, and the model loops again (4 identical calls,
        a loop of its own): that loop's decision."""
        self.feed(idle(session), *user_frames(session, "msg_person", "Now fix the typo."))
        self.feed(status(session, "busy"))
        [decision] = self.feed(*loop_of(session, 4, "bash", NEXT_LOOP, prefix="again"))
        return decision


def task_args(n: int) -> dict[str, str]:
    return {"description": f"part {n}", "prompt": f"Do part {n}.", "subagent_type": "general"}


def task(n: int, state: str, error: str | None = None) -> dict[str, Any]:
    return tool_part(
        ROOT,
        f"prt_task{n}",
        "task",
        state,
        task_args(n),
        error=error,
        call_id=f"call_{n}",
        message_id=STEP,
    )


def burst(session: Session, tasks: int = 25) -> list[Intervene]:
    """One step asks for `tasks` subagents: each part pending, its child created, running."""
    session.feed(status(ROOT, "busy"))
    made = []
    for n in range(1, tasks + 1):
        made += session.feed(task(n, "pending"), subagent(f"ses_child{n}", ROOT))
        made += session.feed(task(n, "running"), task(n, "running"))
    return made


def children_stopped(session: Session, tasks: int = 25) -> None:
    for n in range(1, tasks + 1):
        session.feed(idle(f"ses_child{n}"))


@pytest.mark.parametrize("outcome", [Outcome.ABORTED, None], ids=["aborted", "abort-under-way"])
def test_the_tasks_a_tree_stop_cancels_are_no_failure_loop(outcome: Outcome | None) -> None:
    """The report: the tree stops the root at the 21st child; the abort cancels the 25 tasks
    before the root's idle; the person's next loop is the second intervention, not a hold."""
    session = Session(Tracker(), outcome)
    [tree] = burst(session)
    assert (tree.rule, tree.plan, tree.call_index) == (Rule.TREE, Plan.STOP, 20)
    children_stopped(session)
    for n in range(1, 26):
        assert session.feed(task(n, "error", error=TASK_CANCELLED)) == []
    decision = session.next_loop()
    assert (decision.rule, decision.prior_interventions) == (Rule.CYCLE, 1)
    assert (decision.plan, decision.hold) == (Plan.REFUSE, False)
    assert [d.rule for d in session.decisions] == [Rule.TREE, Rule.CYCLE]


def test_the_abort_s_own_text_and_parts_that_never_ran_are_not_counted_either() -> None:
    """Tasks 21 to 25 still pending when the abort lands end without ever running, in the
    abort's text: no failure loop either."""
    session = Session(Tracker())
    session.feed(status(ROOT, "busy"))
    for n in range(1, 21):
        session.feed(task(n, "pending"), subagent(f"ses_child{n}", ROOT), task(n, "running"))
    for n in range(21, 26):
        session.feed(task(n, "pending"))
    [tree] = session.feed(subagent("ses_child21", ROOT))
    assert tree.rule == Rule.TREE
    for n in range(1, 26):
        assert session.feed(task(n, "error", error=ABORTED)) == []
    assert session.next_loop().prior_interventions == 1


def test_the_ends_after_the_root_s_idle_are_late() -> None:
    """What the recording showed: every task ends in "Tool execution aborted" after the
    root's `session.idle` (late, as before this fix)."""
    session = Session(Tracker())
    burst(session)
    children_stopped(session)
    session.feed(idle(ROOT))
    for n in range(1, 26):
        assert session.feed(task(n, "error", error=ABORTED)) == []
    assert session.next_loop().prior_interventions == 1


def test_tasks_the_plugin_asked_about_are_cut_as_well() -> None:
    """A session whose plugin asks before each call: the tasks are recorded from its
    questions, the later ones after the decision; their ends feed no rule."""
    tracker = Tracker()
    session = Session(tracker)
    session.feed(status(ROOT, "busy"))
    for n in range(1, 26):
        question = PluginCall(ROOT, f"call_{n}", "task", task_args(n), "/p", message_id=STEP)
        assert tracker.judge(question).decision is None
        session.feed(task(n, "pending"), subagent(f"ses_child{n}", ROOT), task(n, "running"))
    assert [d.rule for d in session.decisions] == [Rule.TREE]
    for n in range(1, 26):
        assert session.feed(task(n, "error", error=TASK_CANCELLED)) == []
    assert session.next_loop().prior_interventions == 1


# -- an ordinary stop, then the parallel calls it cancels --------------------------------------


def parallel(session: Session, first: int, count: int, same: bool) -> list[Intervene]:
    """`count` calls of one step, each pending then running: the same read, or reads of
    different files."""
    made = []
    for n in range(first, first + count):
        args = READ if same else {"filePath": f"src/file{n}.py"}
        made += session.feed(
            tool_part(ROOT, f"prt_{n}", "read", "pending", call_id=f"call_{n}", message_id=STEP),
            tool_part(
                ROOT, f"prt_{n}", "read", "running", args, call_id=f"call_{n}", message_id=STEP
            ),
        )
    return made


@pytest.mark.parametrize("first_action", ["stop", "block"])
@pytest.mark.parametrize("outcome", [Outcome.ABORTED, None], ids=["aborted", "abort-under-way"])
def test_the_parallel_calls_a_cycle_stop_cancels_are_no_failure_loop(
    first_action: str, outcome: Outcome | None
) -> None:
    """A step of 4 identical reads and 6 other reads: the cycle stops the run at the 4th (a
    stop, or a block that no plugin refuses in band: the abort too); the 6 others start
    after it, and the abort ends all 10."""
    session = Session(Tracker(Detection(first_action=first_action)), outcome)
    session.feed(status(ROOT, "busy"))
    [cycle] = parallel(session, 1, 4, same=True)
    assert cycle.plan is (Plan.STOP if first_action == "stop" else Plan.REFUSE)
    assert parallel(session, 5, 6, same=False) == []
    for n in range(1, 11):
        error = tool_part(
            ROOT,
            f"prt_{n}",
            "read",
            "error",
            READ,
            error=ABORTED,
            call_id=f"call_{n}",
            message_id=STEP,
        )
        assert session.feed(error) == []
    decision = session.next_loop()
    assert (decision.prior_interventions, decision.hold) == (1, False)


def test_a_dry_run_stops_nothing_so_the_ends_count() -> None:
    """The outcome says no abort came (a dry run): the run goes on, its calls' ends are the
    model's, and a failure repeated 4 times is a loop as before."""
    session = Session(Tracker(), Outcome.DRY_RUN)
    session.feed(status(ROOT, "busy"))
    parallel(session, 1, 4, same=True)
    parallel(session, 5, 4, same=False)
    for n in range(5, 9):
        args = {"filePath": f"src/file{n}.py"}
        session.feed(
            tool_part(
                ROOT,
                f"prt_{n}",
                "read",
                "error",
                args,
                error="File not found",
                call_id=f"call_{n}",
                message_id=STEP,
            )
        )
    assert [d.rule for d in session.decisions] == [Rule.CYCLE, Rule.FAILURE]


def test_a_refusal_in_band_stops_nothing() -> None:
    """A block the plugin carries (the session's plugin asks) lets the run go on: the calls'
    ends after it are the model's."""
    tracker = Tracker()
    session = Session(tracker, Outcome.BLOCKED)
    session.feed(status(ROOT, "busy"))
    for n in range(1, 5):
        question = PluginCall(ROOT, f"call_{n}", "read", READ, "/p", message_id=f"msg_{n}")
        judged = tracker.judge(question)
        if judged.decision is not None:
            tracker.outcome(judged.decision, Outcome.BLOCKED)
            assert judged.decision.plan is Plan.REFUSE
    failures = []
    for n in range(5, 9):
        args = {"filePath": f"src/file{n}.py"}
        question = PluginCall(ROOT, f"call_{n}", "read", args, "/p", message_id=f"msg_{n}")
        assert tracker.judge(question).decision is None
        failures += session.feed(
            tool_part(
                ROOT,
                f"prt_{n}",
                "read",
                "running",
                args,
                call_id=f"call_{n}",
                message_id=f"msg_{n}",
            ),
            tool_part(
                ROOT,
                f"prt_{n}",
                "read",
                "error",
                args,
                error="File not found",
                call_id=f"call_{n}",
                message_id=f"msg_{n}",
            ),
        )
    assert failures == []  # a refusal after its call ran waits for the next call (withhold)
    question = PluginCall(ROOT, "call_9", "read", READ, "/p", message_id="msg_9")
    refused = tracker.judge(question).decision
    assert refused is not None and (refused.rule, refused.prior_interventions) == (Rule.FAILURE, 1)


def test_the_next_run_is_followed_again() -> None:
    """The mark lasts until the run ends: in the next run a failure repeated is a loop."""
    session = Session(Tracker())
    burst(session)
    session.feed(idle(ROOT), status(ROOT, "busy"))
    failures = []
    for n in range(1, 5):
        args = {"filePath": f"src/file{n}.py"}
        failures += session.feed(
            tool_part(ROOT, f"prt_next{n}", "read", "running", args, message_id=f"msg_n{n}"),
            tool_part(
                ROOT,
                f"prt_next{n}",
                "read",
                "error",
                args,
                error="File not found",
                message_id=f"msg_n{n}",
            ),
        )
    assert [d.rule for d in failures] == [Rule.FAILURE]


def test_the_new_engine_s_interrupted_calls_are_no_failure_loop() -> None:
    """OpenCode 2's session engine: the calls a stop interrupts end in `session.tool.failed`
    "Tool execution interrupted"."""
    sid = "ses_engine"
    session = Session(Tracker())
    frames: list[dict[str, Any]] = []
    for n in range(1, 5):
        frames += engine_call(sid, n, "read", {"path": "README.md"}, 3 * n)[:2]
    [cycle] = session.feed(*frames)
    assert cycle.rule == Rule.CYCLE
    seq = 100
    for n in range(5, 10):
        args = {"path": f"src/file{n}.py"}
        session.feed(*engine_call(sid, n, "read", args, seq + 3 * n)[:2])
    for n in range(1, 10):
        failed = {
            "callID": f"call_{n}",
            "assistantMessageID": f"msg_{n}",
            "error": {"type": "unknown", "message": INTERRUPTED},
        }
        assert session.feed(engine_event("session.tool.failed", sid, failed, 200 + n)) == []
    session.feed(engine_event("session.execution.interrupted", sid, {"reason": "user"}, 300))
    assert session.next_loop(sid).prior_interventions == 1


# -- a monitor that reads the session back between the abort and its calls' ends ---------------
#
# The abort's calls end a moment after it, often after the run's idle and after the feedback
# that starts the next run (the 25 tasks above). A monitor that reads the session back in that
# window (one started or restarted then, a standby that takes over with a read-back, a stream
# reconnected) finds them unfinished in a run the record shows over, before the feedback: it
# must take their ends as late, as one that followed the abort live does, not as calls of the
# run the feedback started (issue 43: "seen, not modelled").

FEEDBACK = f"{MARK}your run was stopped at this call."


def aborted_step(*parts: dict[str, Any]) -> dict[str, Any]:
    """The model step the abort ended: its calls as the record shows them meanwhile."""
    step = ff.assistant_message(ROOT, *parts)
    step["info"].update(id=STEP, error={"name": "MessageAbortedError"})
    return step


def burst_record(*parts: dict[str, Any], feedback: str = FEEDBACK) -> list[dict[str, Any]]:
    """A prompt, the step the abort ended, the monitor's feedback, and (unless the feedback
    asks for no reply: a hold) the next run's first assistant message, still thinking."""
    record = [ff.user_message(ROOT, "Split the work."), aborted_step(*parts)]
    record.append(ff.user_message(ROOT, feedback))
    if not is_hold_feedback(feedback):
        record.append(ff.assistant_message(ROOT))
    return record


def read_back(tracker: Tracker, record: list[dict[str, Any]]) -> list[Intervene]:
    """What the daemon's resync does with a busy session's record (monitor/shell/resync.py,
    `_seed`)."""
    frames = list(export_frames(current_run(record)))
    late = late_frames(record)
    return tracker.seed(ROOT, frames, "/p", feedback_count(record), held_in(record), late)


def read_part(n: int, state: str) -> dict[str, Any]:
    return {**ff.export_part(ROOT, f"prt_{n}", state), "callID": f"call_{n}", "messageID": STEP}


def read_end(n: int, error: str = ABORTED) -> dict[str, Any]:
    return tool_part(
        ROOT, f"prt_{n}", "read", "error", READ, error=error, call_id=f"call_{n}", message_id=STEP
    )


def test_a_monitor_started_between_an_abort_and_its_calls_ends_takes_them_as_late() -> None:
    """Six identical reads of one step, stopped as a cycle; the monitor (re)started after the
    feedback was stored reads them back still running, before the feedback. Their six
    aborted ends were a cycle of the new run (the second intervention, at the 4th) before
    the fix: now late, counted nowhere, and the new run's own loop is the second."""
    tracker = Tracker()
    record = burst_record(*(read_part(n, "running") for n in range(1, 7)))
    assert read_back(tracker, record) == []
    session = Session(tracker)
    session.feed(status(ROOT, "busy"))  # the feedback's run, on the stream
    for n in range(1, 7):
        assert session.feed(read_end(n)) == []
    assert tracker.sessions_view() == [SessionView(ROOT, "/p", True, 0, 0, 1, False)]
    assert tracker.stray == {Step.LATE: 6}
    assert tracker.history_length(ROOT) == 0
    [decision] = session.feed(*loop_of(ROOT, 4, "bash", NEXT_LOOP, prefix="again"))
    assert (decision.rule, decision.call_index, decision.prior_interventions) == (
        Rule.CYCLE,
        4,
        1,
    )
    assert (decision.plan, decision.hold) == (Plan.REFUSE, False)


def test_the_report_s_25_tasks_read_back_after_the_feedback_are_no_failure_loop() -> None:
    """The report's shape: the tree stopped the root at the 21st child, tasks 21 to 25 never
    ran (pending); read back after the feedback, their ends ("Task cancelled", "Tool
    execution aborted") were "the same error 4 times in a row (task)" before the fix."""
    tracker = Tracker()
    parts = [
        {**task(n, "running" if n <= 20 else "pending")["properties"]["part"]} for n in range(1, 26)
    ]
    assert read_back(tracker, burst_record(*parts)) == []
    session = Session(tracker)
    session.feed(status(ROOT, "busy"))
    for n in range(1, 26):
        assert session.feed(task(n, "error", error=TASK_CANCELLED if n <= 20 else ABORTED)) == []
    assert tracker.sessions_view() == [SessionView(ROOT, "/p", True, 0, 0, 1, False)]
    assert tracker.stray == {Step.LATE: 25}
    assert session.next_loop().prior_interventions == 1


def test_a_held_session_read_back_before_its_calls_ends_stays_held() -> None:
    """A hold's feedback is stored with noReply: the session idles, and the daemon reads it
    back for the hold (`_read_hold`: no run to seed). The aborted reads' ends were a cycle
    decided on a held session before the fix."""
    tracker = Tracker()
    record = burst_record(
        *(read_part(n, "running") for n in range(1, 5)), feedback=f"{MARK}{HOLD_NOTE}"
    )
    tracker.seed(ROOT, (), "/p", feedback_count(record), held_in(record), late_frames(record))
    session = Session(tracker)
    for n in range(1, 5):
        assert session.feed(read_end(n)) == []
    assert tracker.sessions_view() == [SessionView(ROOT, "/p", False, 0, 0, 1, True)]
    assert tracker.stray == {Step.LATE: 4}


def test_a_stream_reconnected_in_the_window_keeps_the_abort_s_calls_late() -> None:
    """The monitor that stopped the loop followed it live (its calls late since the idle),
    and its stream reconnects once the feedback's run began: the read-back starts that run
    over, dropping the calls it held as late; the record names them again."""
    session = Session(Tracker())
    session.feed(status(ROOT, "busy"))
    made = parallel(session, 1, 6, same=True)
    assert [(d.plan, d.part_id) for d in made] == [
        (Plan.REFUSE, "prt_4"),  # no plugin refuses it: the abort (`Session`)
        (Plan.DEFER, "prt_5"),
        (Plan.DEFER, "prt_6"),
    ]
    session.feed(idle(ROOT), *user_frames(ROOT, "msg_feedback", FEEDBACK), status(ROOT, "busy"))
    record = burst_record(*(read_part(n, "running") for n in range(1, 7)))
    assert read_back(session.tracker, record) == []
    for n in range(1, 7):
        assert session.feed(read_end(n)) == []
    assert session.tracker.sessions_view() == [SessionView(ROOT, "/p", True, 0, 6, 1, False)]
    assert session.tracker.stray == {Step.LATE: 6}
    assert session.next_loop().prior_interventions == 1


def test_only_the_unfinished_calls_of_runs_that_are_over_are_late() -> None:
    """`late_frames`: before the current run, the calls still pending or running; not a
    finished one, not one of the current run (read back as a call of it)."""
    record = burst_record(
        read_part(1, "completed"), read_part(2, "running"), read_part(3, "pending")
    )
    record[-1]["parts"].append(read_part(4, "running"))
    assert [frame["properties"]["part"]["id"] for frame in late_frames(record)] == [
        "prt_2",
        "prt_3",
    ]
    assert list(late_frames(record[:2])) == []  # the aborted run is the current one
    assert list(late_frames({"data": []})) == []


def test_a_new_engine_call_read_back_running_is_ended_by_its_failed_event() -> None:
    """OpenCode 2 names a call's tool only when its input starts: a monitor that reads a
    new-engine session back (a restart) never saw that, and took the call's end for a
    malformed event, its call running on until its time bound. The read-back names it."""
    sid = "ses_engine"
    page = {
        "data": [
            {
                "id": "msg_a",
                "type": "assistant",
                "content": [
                    {
                        "type": "tool",
                        "id": f"call_{n}",
                        "name": "shell",
                        "state": {"status": "running", "input": {"command": "sleep 9"}},
                    }
                    for n in (1, 2)
                ],
            },
            {"id": "msg_u", "type": "user", "text": "go on"},
        ],
        "cursor": None,
    }
    tracker = Tracker()
    tracker.engine_sessions((sid,))
    assert tracker.seed(sid, list(export_frames(current_run(messages_v1_shape(page, sid))))) == []
    assert [len(tracker.read_back_deadlines(sid))] == [2]
    for n in (1, 2):
        failed = {
            "callID": f"call_{n}",
            "assistantMessageID": "msg_a",
            "error": {"type": "unknown", "message": INTERRUPTED},
        }
        fed = tracker.feed(engine_event("session.tool.failed", sid, failed, 10 + n))
        assert (fed.malformed, fed.decisions) == (None, ())
    assert tracker.read_back_deadlines(sid) == ()
    assert tracker.malformed_total == 0
