"""Issue 20, items 3 and 4: one intervention per loop across monitors of one server, and
interventions that survive a restart of the server, against the stand-in.

Two `Watch` instances against one stand-in play two monitors (two `watch`, or a `watch` and
an `attach`); the stand-in's record (`messages`) is what each one reads back. Given two lock
folders (`roles`) they do not see each other, so both act: monitors of one server that are
not seen as one (two users, two spellings of its address), which the record check is for.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.core import intervention as life
from monitor.core.commands import Do, Log
from monitor.core.decisions import Outcome, Reply
from monitor.core.due import DueWork
from monitor.core.export import current_run, export_frames, intervened
from monitor.core.feedback import MARK
from monitor.core.intervention import RECENT_MESSAGES
from monitor.core.monitor import Monitor
from monitor.core.tracker import Detection, Tracker
from monitor.shell.api import OpencodeAPI
from monitor.testing import FakeOpencode, frames, play
from tests import frames_factory as ff
from tests.frames_factory import BASH, asked, envelope, part, replied
from tests.harness import (
    FAST,
    Carrier,
    carried_out,
    events,
    held_decision,
    loop_frames,
    refused_record,
    start,
    stop,
    wait_for,
    watching,
)

FIRST = dataclasses.replace(FAST, stagger=lambda: 0.0)
SECOND = dataclasses.replace(FAST, stagger=lambda: 0.3)


async def test_two_monitors_on_one_loop_post_one_feedback(tmp_path):
    # Both see the loop at once and both abort (a second abort changes nothing); the one
    # that waits longer before the feedback finds the other's and posts none.
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4)), play(loop_frames("ses_s1", 4))],
        store_prompts=True,
        messages={"ses_s1": ff.run_record("ses_s1", 4)},
    )
    with capture_logs() as logs:
        # Neither serves plugins: with the endpoint the first one holds, the second would read
        # the record again before aborting (see the test after this one).
        server, first, first_task = await start(fake, FIRST, plugin_socket="off")
        second, second_task = watching(server, SECOND, tmp_path, plugin_socket="off")
        await wait_for(lambda: events(logs, "feedback.sent") and events(logs, "feedback.deferred"))
        for watch, task in ((first, first_task), (second, second_task)):
            watch.stop()
            await task
        await server.close()
    [prompt] = fake.of("prompt_async")
    assert prompt.body["parts"][0]["text"].startswith(MARK)  # type: ignore[index]
    [deferred] = events(logs, "feedback.deferred")
    assert deferred == {
        "event": "feedback.deferred",
        "log_level": "info",
        "session_id": "ses_s1",
        "reason": "feedback already in the session",
    }
    assert [e["part_id"] for e in events(logs, "intervention.outcome")] == ["p4", "p4"]


async def test_the_second_monitor_of_a_plugin_endpoint_reads_again_before_it_aborts(tmp_path):
    # The first monitor holds the plugin endpoint of the server; the second one knows, so it
    # reads the record again before acting, finds the first one's feedback and acts not at all.
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4)), play(loop_frames("ses_s1", 4))],
        store_prompts=True,
        messages={"ses_s1": ff.run_record("ses_s1", 4)},
    )
    with capture_logs() as logs:
        server, first, first_task = await start(fake, FIRST)
        await wait_for(lambda: first.plugins.server is not None)
        second, second_task = watching(server, SECOND, tmp_path)
        await wait_for(lambda: len(events(logs, "intervention.outcome")) == 2)
        for watch, task in ((first, first_task), (second, second_task)):
            watch.stop()
            await task
        await server.close()
    assert second.plugins.server is None and events(logs, "plugin.endpoint_taken")
    assert len(fake.of("abort")) == 1 and len(fake.of("prompt_async")) == 1
    outcomes = sorted((e["outcome"], e.get("reason")) for e in events(logs, "intervention.outcome"))
    assert outcomes == [("aborted", None), ("deferred", "feedback already in the session")]


async def test_a_monitor_that_comes_second_does_not_act_again(tmp_path):
    # The second monitor sees the loop after the first one stopped it and gave the feedback
    # (a lagging stream): it neither aborts the model's answer to it nor posts another.
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4)), play(loop_frames("ses_s1", 4))],
        store_prompts=True,
        messages={"ses_s1": ff.run_record("ses_s1", 4)},
    )
    with capture_logs() as logs:
        server, first, first_task = await start(fake, FIRST)
        await wait_for(lambda: events(logs, "feedback.sent"))
        second, second_task = watching(server, FIRST, tmp_path)
        await wait_for(lambda: len(events(logs, "intervention.outcome")) == 2)
        for watch, task in ((first, first_task), (second, second_task)):
            watch.stop()
            await task
        await server.close()
    assert [r.path for r in fake.of("abort")] == ["/session/ses_s1/abort"]
    assert len(fake.of("prompt_async")) == 1
    first_outcome, second_outcome = events(logs, "intervention.outcome")
    assert first_outcome["outcome"] == "aborted"
    assert (second_outcome["outcome"], second_outcome["reason"]) == (
        "deferred",
        "feedback already in the session",
    )
    assert second_outcome["part_id"] == "p4" and second_outcome["interventions"] == 1
    # Each check before acting read only the newest messages, not the whole record.
    checks = [r.query.get("limit") for r in fake.of("message") if "limit" in r.query]
    assert checks and set(checks) == {str(RECENT_MESSAGES)}


async def test_two_monitors_under_approve_refuse_once_and_the_second_defers(tmp_path):
    # The server takes the first refusal and answers the second 404; the second monitor
    # must not take the 404 for "answered first" and abort the run on top of the refusal.
    loop = []
    for n in (1, 2, 3):
        loop += [
            part(n, "running", *BASH),
            asked(n, "bash"),
            replied(n, "once"),
            part(n, "completed", *BASH),
        ]
    loop += [part(4, "running", *BASH), asked(4, "bash")]
    stream = frames(*(envelope(event, "/w") for event in loop))
    fake = FakeOpencode(streams=[play(stream), play(stream)], reply_once=True)
    with capture_logs() as logs:
        server, first, first_task = await start(fake, FIRST, permissions="approve")
        second, second_task = watching(server, FIRST, tmp_path, permissions="approve")
        await wait_for(lambda: fake.of("reply"))
        fake.messages = {"ses_1": refused_record()}  # the call ends refused, a moment later
        await wait_for(lambda: len(events(logs, "intervention.outcome")) == 2)
        for watch, task in ((first, first_task), (second, second_task)):
            watch.stop()
            await task
        await server.close()
    refusals = [r.path for r in fake.of("reply") if r.body["reply"] == "reject"]  # type: ignore[index]
    assert refusals == ["/permission/per_4/reply"] * 2
    assert fake.of("abort") == [] and fake.of("prompt_async") == []
    outcomes = sorted((e["outcome"], e.get("reason")) for e in events(logs, "intervention.outcome"))
    assert outcomes == [("deferred", "call already refused"), ("rejected", None)]


def test_intervened_reads_what_another_monitor_left():
    record = ff.run_record("ses_s1", 4)
    assert intervened(record, "p4") is None
    aborted = [
        *record[:-1],
        {**record[-1], "info": {"role": "assistant", "error": {"name": "MessageAbortedError"}}},
    ]
    assert intervened(aborted, "p4") == "run already aborted"
    assert intervened(aborted, "p4", aborted=False) is None
    # Feedback of an earlier loop, before the part, is not this loop's.
    earlier = [ff.user_message("ses_s1", MARK + "earlier"), *record]
    assert intervened(earlier, "p4") is None
    later = [*record, ff.user_message("ses_s1", MARK + "this loop")]
    assert intervened(later, "p4") == "feedback already in the session"
    assert intervened(refused_record(), "prt_4") == "call already refused"
    assert intervened(refused_record(), "prt_4", refused=False) is None  # our own refusal
    assert intervened(later, "p9") is None  # a part the record does not hold: nothing known
    # A refused `doom_loop` request ends the run with its message in the step's error (a
    # monitor restarted before the run went idle reads that, and the loop's 4th call).
    said = f"The user rejected permission to use this specific tool call: {MARK}refused"
    doomed = {"name": "UnknownError", "data": {"message": said}}
    refused_run = [*record[:-1], {**record[-1], "info": {"role": "assistant", "error": doomed}}]
    assert intervened(refused_run, "p4") == "run already refused"
    assert intervened(refused_run, "p4", refused=False) is None  # our own refusal
    doomed["data"] = {"message": "The user rejected permission ... feedback: not ours"}
    assert intervened(refused_run, "p4") is None


# -- 4. the server restarts between the abort and the feedback ------------------------------


async def restart(server: TestServer, fake: FakeOpencode, logs: list) -> TestServer:
    """Stop the stand-in and, once the monitor has given up reaching it (the work is due),
    serve `fake` on the same port, as a restarted server."""
    port = server.port
    await server.close()
    await wait_for(lambda: events(logs, "intervention.due"))
    again = TestServer(fake.app(), host="127.0.0.1", port=port)
    await again.start_server()
    return again


async def across_a_restart(
    fake: FakeOpencode, step: str, record: Callable[[], list[dict]]
) -> tuple[list[dict], FakeOpencode]:
    """A loop on `fake` whose `step` request is held; the server restarts (as `back`, whose
    record of the session `record` gives) until the feedback is sent. The logs, and `back`."""
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        await wait_for(lambda: fake.of(step))
        back = FakeOpencode(messages={"ses_s1": record()})
        back.streams = [back.live]
        server = await restart(server, back, logs)
        await wait_for(lambda: events(logs, "feedback.sent"))
        await stop(server, watch, task)
    return logs, back


async def test_feedback_lost_to_a_restart_is_posted_once_after_the_reconnect():
    # The abort is answered; the server goes away with the feedback in flight, unstored.
    posted = asyncio.Event()
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))], holds={"prompt_async": posted})
    logs, back = await across_a_restart(fake, "prompt_async", lambda: ff.run_record("ses_s1", 4))
    assert len(back.of("prompt_async")) == 1
    assert [e["step"] for e in events(logs, "intervention.due")] == ["feedback"]
    assert events(logs, "feedback.failed") == []
    [outcome] = events(logs, "intervention.outcome")
    assert outcome["outcome"] == "aborted"


async def test_feedback_stored_before_the_restart_is_not_posted_again():
    posted = asyncio.Event()
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4))], holds={"prompt_async": posted}, store_prompts=True
    )
    # The server had stored it when it went away.
    logs, back = await across_a_restart(
        fake, "prompt_async", lambda: [*ff.run_record("ses_s1", 4), *fake.messages["ses_s1"]]
    )
    assert back.of("prompt_async") == []
    [sent] = events(logs, "feedback.sent")
    assert sent["found"] is True


async def test_an_abort_unanswered_before_a_restart_is_confirmed_by_the_read_back():
    # The server took the abort and went away before answering: after the reconnect the
    # run is not busy, so the abort is logged as done (not abort_failed) and the feedback
    # follows, once.
    answered = asyncio.Event()
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))], holds={"abort": answered})
    logs, back = await across_a_restart(fake, "abort", lambda: ff.run_record("ses_s1", 4))
    [outcome] = events(logs, "intervention.outcome")
    assert outcome["outcome"] == "aborted"
    assert outcome["confirmed"] == "run stopped, read back after reconnect"
    assert back.of("abort") == [] and len(back.of("prompt_async")) == 1


def test_due_work_is_bounded_in_count_and_age():
    parts = [f"p{n}" for n in range(4)]
    due: DueWork[str] = DueWork(limit=3, max_age=10.0)
    assert due.add(("s", parts[0]), parts[0], 0.0) == []
    due.add(("s", parts[1]), parts[1], 1.0)
    due.add(("s", parts[2]), parts[2], 2.0)
    assert due.add(("s", parts[3]), parts[3], 3.0) == ["p0"]
    fresh, stale = due.take(11.5)
    assert [d.work for d in fresh] == ["p2", "p3"]
    assert [d.work for d in stale] == ["p1"]
    # Kept again after another failed try: it keeps its age.
    due.add(("s", parts[2]), parts[2], 12.5)
    assert due.take(12.5)[1][0].since == 2.0 and len(due) == 0


def _decision(part_id: str):
    from monitor.core.tracker import Tracker

    [decision] = ff.feed_all(Tracker(), ff.loop_of("ses_s1", 4, prefix=part_id + "_"))
    return dataclasses.replace(decision, part_id=part_id)


async def test_attach_warns_when_a_monitor_already_intervened_in_the_session():

    from monitor.shell.attach import warn_if_followed

    fake = FakeOpencode(
        messages={
            "ses_s1": [*ff.run_record("ses_s1", 4), ff.user_message("ses_s1", MARK + "x")],
            "ses_s2": ff.run_record("ses_s2", 4),
        }
    )
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            api = OpencodeAPI(http, str(server.make_url("")))
            with capture_logs() as logs:
                await warn_if_followed(api, "ses_s1", "/w", 1)
                await warn_if_followed(api, "ses_s2", "/w", 1)
    finally:
        await server.close()
    [warning] = events(logs, "attach.other_monitor")
    assert (warning["session_id"], warning["feedback_messages"]) == ("ses_s1", 1)


@pytest.mark.parametrize("via", ["plugin", "permission"])
async def test_our_own_refusal_of_a_call_held_is_not_taken_for_another_monitors(via: str):
    # We refused call 4 (the plugin threw our feedback, or we rejected its permission
    # request): the record shows it refused with our text. The hold that follows is ours to
    # finish: abort, then the feedback stored for a person; nothing deferred.
    fake = FakeOpencode(messages={"ses_1": refused_record()}, answers={"prompt_async": [204]})
    decision = held_decision()
    if via == "plugin":
        logs = await carried_out(fake, lambda actions: actions.blocked(decision, "call_4"))
    else:
        reply = Reply("per_1", "ses_1", "/w", "reject", message=MARK + "refused", loop=decision)
        logs = await carried_out(fake, lambda actions: actions.answer(reply))
    [outcome] = events(logs, "intervention.outcome")
    assert outcome["outcome"] == "held"
    assert [r.path for r in fake.of("abort")] == ["/session/ses_1/abort"]
    [feedback] = fake.of("prompt_async")
    assert feedback.body["noReply"] is True
    assert events(logs, "feedback.deferred") == []


async def outcome_over(record: object, part_id: str, drain: float = 5, **options: Any) -> dict:
    """Carry out the loop caught at `part_id` against `record` (a stand-in of the API: its
    reads and actions), no waits but `options`' stagger; its one `intervention.outcome`."""

    async def no_wait(seconds: float) -> None:
        await asyncio.sleep(0)

    interventions = Carrier(record, sleep=no_wait, **{"stagger": lambda: 0.0, **options})
    with capture_logs() as logs:
        interventions.submit(_decision(part_id))
        await wait_for(lambda: events(logs, "intervention.outcome"))
        await interventions.drain(drain)
    [logged] = events(logs, "intervention.outcome")
    return logged


class PluginBlocksLate:
    """The record of a server whose plugin another monitor answers: the loop's call shows
    running at the first read, refused by that monitor from the second on (the hook throws a
    moment after the stream shows the call)."""

    def __init__(self) -> None:
        self.reads = 0
        self.aborted: list[str] = []

    async def messages(
        self, session_id: str, directory: str | None, last: int | None = None, route: int = 1
    ):
        self.reads += 1
        record = refused_record()
        if self.reads == 1:
            running = ff.export_part("ses_1", "prt_4", "running", *BASH[1:], tool="bash")
            record[-1] = ff.assistant_message("ses_1", running)
        return record

    async def abort(self, session_id: str, directory: str | None, route: int = 1) -> None:
        self.aborted.append(session_id)


@pytest.mark.parametrize(("plugin_elsewhere", "outcome"), [(True, "deferred"), (False, "aborted")])
async def test_a_loop_the_other_monitors_plugin_blocks_is_not_aborted_again(
    plugin_elsewhere: bool, outcome: str
) -> None:
    # Issue 25: the second monitor of a server aborted runs the first one's plugin had
    # blocked, and gave no feedback. Knowing another monitor answers the plugin, it reads the
    # record again before acting and finds the refusal.
    record = PluginBlocksLate()
    # A feedback would wait: the test ends at the outcome.
    logged = await outcome_over(
        record, "prt_4", drain=0, stagger=lambda: 3600.0, plugin_elsewhere=plugin_elsewhere
    )
    assert logged["outcome"] == outcome
    assert record.aborted == ([] if plugin_elsewhere else ["ses_s1"])
    if plugin_elsewhere:
        assert (logged["reason"], record.reads) == ("call already refused", 2)


class AbortedMeanwhile:
    """The record of a run that ends between our check and our abort: the loop's call
    running at the first read; from the `marked`-th on, the run aborted by another monitor
    (its last message carrying the abort), or (`answered`) ended by the model's answer."""

    def __init__(self, marked: int = 2, answered: bool = False) -> None:
        self.marked, self.answered = marked, answered
        self.reads = 0
        self.aborted: list[str] = []
        self.prompts: list[tuple[str, bool]] = []

    async def messages(
        self, session_id: str, directory: str | None, last: int | None = None, route: int = 1
    ):
        self.reads += 1
        record = ff.run_record("ses_s1", 4)
        if self.answered and self.reads > 1:
            record.append(ff.answer_message("ses_s1"))
        elif self.reads >= self.marked:
            record[-1]["info"]["error"] = {"name": "MessageAbortedError", "data": {}}
        return record

    async def abort(self, session_id: str, directory: str | None, route: int = 1) -> None:
        self.aborted.append(session_id)

    async def prompt(
        self,
        session_id: str,
        directory: str | None,
        text: str,
        no_reply: bool,
        after_part: str,
        route: int = 1,
    ) -> None:
        self.prompts.append((session_id, no_reply))


@pytest.mark.parametrize(
    ("record", "reads", "outcome"),
    [
        (AbortedMeanwhile(), 2, ("deferred", "run already aborted")),
        # The real server marks the aborted message a moment after the run's end.
        (AbortedMeanwhile(marked=3), 3, ("deferred", "run already aborted")),
        (AbortedMeanwhile(marked=99), 4, ("deferred", "run ended without an answer")),
        (AbortedMeanwhile(answered=True), 2, ("nudged", None)),
    ],
    ids=["aborted", "marked-late", "never-marked", "answered"],
)
async def test_a_run_another_monitor_stopped_meanwhile_is_left_to_it(
    record: AbortedMeanwhile, reads: int, outcome: tuple[str, str | None]
):
    # Found on the real server (two `watch`): the first check read the record before the
    # other monitor's abort landed, then our stream showed the run over. Taking that for a run
    # that ended by itself, we posted the late feedback (no reply) and the other monitor,
    # finding it, posted none: the model was never asked to go on. Only a run whose record
    # ends with the model's answer ended by itself; the abort's mark may come a moment late.
    logged = await outcome_over(record, "p4", run_over=lambda decision: True)
    assert record.aborted == []
    assert (logged["outcome"], logged.get("reason")) == outcome
    if outcome[0] == "deferred":
        assert record.prompts == [] and record.reads == reads
    else:
        assert logged["late"] == "run ended before the abort"
        assert record.prompts == [("ses_s1", True)]


def _refused_doom_loop_run() -> list[Any]:
    """A run whose `doom_loop` request a monitor refused (its text in the step's error), the
    three reads aborted, the step's 4th still running."""
    said = f"The user rejected permission ... with the following feedback: {MARK}refused"
    parts = [ff.export_part("ses_1", f"p{n}", "error") for n in (1, 2, 3)]
    for aborted in parts:
        aborted["state"]["error"] = "Tool execution aborted"
    step = ff.assistant_message("ses_1", *parts, ff.export_part("ses_1", "p4", "running"))
    step["info"]["error"] = {"name": "UnknownError", "data": {"message": said}}
    return [ff.user_message("ses_1"), step]


def test_a_monitor_restarted_after_a_refused_doom_loop_leaves_the_loop_alone():
    """Found by tests/test_model.py: a monitor refused OpenCode's `doom_loop` request for a
    step's three identical reads and was restarted before the run went idle; the next
    process read the run back (the three reads aborted, the step's 4th still running) and
    found the loop at the 4th read. The step's error holds the refusal: deferred, no abort."""
    record = _refused_doom_loop_run()
    tracker = Tracker(Detection(permissions="gate"))
    [decision] = tracker.seed("ses_1", list(export_frames(current_run(record))), "/p")
    assert (decision.rule, decision.part_id) == ("cycle", "p4")
    found, turn = life.found(decision, dry_run=False)
    assert found is not None and isinstance(turn.command, life.ReadRecent)
    turn = found.feed(life.Read(record, run_over=False))
    assert turn.command is None  # no abort, no feedback
    [decided] = [report for report in turn.reports if isinstance(report, life.Decided)]
    assert (decided.outcome, decided.fields["reason"]) == (Outcome.DEFERRED, "run already refused")


def test_a_restarted_monitor_judges_the_loop_it_reads_back_on_that_read():
    """Found by tests/test_model.py: as above, and the feedback of the first process had
    failed; the check before acting read the record again, that read failed, and the loop
    was stopped a second time (better act twice than never). The check is made on the record
    the read-back just read: deferred, no read, no abort."""
    monitor = Monitor(Tracker(Detection(permissions="gate")))
    commands = monitor.seed("ses_1", "/p", _refused_doom_loop_run(), 0.0)
    assert [c for c in commands if isinstance(c, Do)] == []
    lines = [c for c in commands if isinstance(c, Log)]
    assert [line.event for line in lines] == [
        "session.seeded",
        "loop.detected",
        "intervention.outcome",
    ]
    outcome = lines[-1].fields
    assert (outcome["outcome"], outcome["reason"]) == ("deferred", "run already refused")
    assert monitor.lives.acting_on("ses_1") is False


def test_a_read_back_loop_nobody_stopped_goes_on_to_its_abort_with_its_line():
    """The read-back's check finds nothing: the next request is the abort, and the loop's
    `loop.detected` goes with it (written once the abort is answered), not before."""
    record = _refused_doom_loop_run()
    del record[1]["info"]["error"]
    for ended in record[1]["parts"][:3]:
        ended["state"] = {**ended["state"], "status": "completed", "output": "same"}
        ended["state"].pop("error", None)
    monitor = Monitor(Tracker(Detection(permissions="gate")))
    commands = monitor.seed("ses_1", "/p", record, 0.0)
    [do] = [c for c in commands if isinstance(c, Do)]
    assert isinstance(do.command, life.Abort) and do.command.session_id == "ses_1"
    assert [line.event for line in do.said] == ["loop.detected"]
    assert [c.event for c in commands if isinstance(c, Log)] == ["session.seeded"]
