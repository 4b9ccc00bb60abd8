"""OpenCode 2.2.5's own streams and read-backs, through the core: given these frames, these
decisions (tests/recordings/v2.2.5, copied from ../shared/opencode/captures-2.2.5; what each
run was is in tests/recordings/README.md and ../shared/opencode/V2-REAL-NOTES.md).

Every frame of every capture is typed or ignored on purpose, none malformed; a loop of
identical calls is found at its 4th call; a shell call's exit status reaches the rules as a
1.x bash's does; `session.execution.*` ends the run; `session.inbox.*` is a user message, and
a person's ends a hold; the plugin's in-band refusal carries our mark; a read-back of the
record rebuilds the run with no call counted twice.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from monitor.core.decisions import Outcome, Plan
from monitor.core.events import (
    MessageUsage,
    SessionIdle,
    SessionSeen,
    TextPart,
    ToolPart,
    UserMessage,
)
from monitor.core.events_v2 import IGNORED, Adapter
from monitor.core.export import (
    answered,
    current_run,
    export_frames,
    feedback_count,
    held_in,
    intervened,
    tool_parts,
)
from monitor.core.export_v2 import inbox_v1_shape, messages_v1_shape
from monitor.core.feedback import MARK
from monitor.core.frames import decode_frame, iter_sse_data
from monitor.core.plan import own_refusal
from monitor.core.plugin_protocol import PluginCall, read_body
from monitor.core.tracker import Detection, Tracker
from tests import frames_factory as ff

CAPTURES = Path(__file__).resolve().parent / "recordings" / "v2.2.5"
STREAMS = sorted(path.name for path in CAPTURES.glob("*.sse"))
DIRECTORY = "$TMP/proj"  # the captures' project folder, as they were recorded

UNGUARDED = "loop-read-10-unguarded.sse"
ABORTED = "loop-read-daemon-abort-feedback.sse"
SHELL = "api-shell-interrupt-noresume-permission.sse"
GATE = "daemon-permission-gate.sse"
REFUSE4 = "plugin-throw-refuse4.sse"
PLUGIN_4096 = "project-plugin-port4096.sse"
PLUGIN_4596 = "project-plugin-port4596.sse"


def frames_of(name: str) -> list[Any]:
    with (CAPTURES / name).open(encoding="utf-8") as lines:
        return [decode_frame(data) for data in iter_sse_data(lines)]


def typed(name: str) -> list[tuple[str, Any]]:
    """Each frame's type and the core's event of it, in order."""
    adapter = Adapter()
    return [(frame["type"], adapter.parse(frame)[1]) for frame in frames_of(name)]


def decisions_of(tracker: Tracker, frames: list[Any]) -> list[tuple[str, int, tuple[str, ...]]]:
    """The rule, call index and tools of each decision the frames lead to."""
    found = []
    for frame in frames:
        for decision in tracker.feed(frame).decisions:
            finding = decision.finding
            found.append((str(finding.rule), decision.call_index, finding.shape()[2]))
    return found


def page(name: str) -> dict[str, Any]:
    """A read-back as the shell asks it (`order=desc`): the captures were read `order=asc`."""
    answer = json.loads((CAPTURES / name).read_text())
    return {**answer, "data": answer["data"][::-1]}


# --- every frame typed or ignored on purpose -------------------------------------------------


@pytest.mark.parametrize("name", STREAMS)
def test_no_frame_of_a_2_2_5_capture_is_malformed(name: str) -> None:
    tracker = Tracker()
    fed = [tracker.feed(frame) for frame in frames_of(name)]
    assert [f.malformed for f in fed if f.malformed] == []
    assert tracker.malformed_total == 0


@pytest.mark.parametrize("name", STREAMS)
def test_every_frame_is_an_event_or_a_type_ignored_on_purpose(name: str) -> None:
    assert [kind for kind, event in typed(name) if event is None and kind not in IGNORED] == []


def test_what_each_2_2_5_type_is_read_as() -> None:
    seen: dict[str, set[str]] = {}
    for name in STREAMS:
        for kind, event in typed(name):
            seen.setdefault(kind, set()).add(type(event).__name__)
    assert {kind: sorted(names) for kind, names in seen.items() if kind not in IGNORED} == {
        "session.created": ["SessionSeen"],
        "session.inbox.enqueued": ["UserMessage"],
        "session.inbox.delivered": ["TextPart"],
        "session.execution.started": ["SessionSeen"],
        "session.execution.succeeded": ["SessionIdle"],
        "session.execution.interrupted": ["SessionIdle"],
        "session.step.started": ["WorkspaceState"],
        "session.step.ended": ["MessageUsage"],
        "session.step.failed": ["MessageUsage"],
        "session.text.started": ["TextPart"],
        "session.text.delta": ["PartDelta"],
        "session.text.ended": ["TextPart"],
        "session.tool.input.started": ["ToolPart"],
        "session.tool.called": ["ToolPart"],
        "session.tool.success": ["ToolPart"],
        "session.tool.failed": ["ToolPart"],
        "permission.asked": ["PermissionAsked"],
        "permission.replied": ["PermissionReplied"],
    }
    # Every type ignored on purpose was met but these, which 2.2.5 did not send here (the two
    # last seen on the real server: tests/test_events_v2.py).
    assert sorted(set(IGNORED) - set(seen)) == [
        "session.tool.input.delta",
        "shell.deleted",
        "worktree.resolved",
    ]


# --- the decisions of each capture -----------------------------------------------------------


def test_ten_identical_reads_are_a_cycle_found_at_the_fourth() -> None:
    tracker = Tracker()
    found = decisions_of(tracker, frames_of(UNGUARDED))
    # Nobody stops the run: the same loop again at each later call, not a second loop.
    assert found == [("cycle", n, ("read",)) for n in range(4, 11)]
    [view] = tracker.sessions_view()
    assert (view.calls, view.busy, view.interventions) == (10, False, 1)


def test_the_fourth_call_is_the_loops_with_its_part_id_and_plan() -> None:
    tracker = Tracker()
    decisions = [d for frame in frames_of(UNGUARDED) for d in tracker.feed(frame).decisions]
    first = decisions[0]
    assert (first.session_id, first.part_id, first.call_index, first.plan, first.route) == (
        "ses_dada9007effeQuLwCqyE4OuLCx",
        "msg_2525700d9001aDUzxEhOPvVU4Z:call_3",
        4,
        Plan.REFUSE,
        2,
    )
    assert first.directory == DIRECTORY
    assert {d.plan for d in decisions[1:]} == {Plan.DEFER}


@pytest.mark.parametrize(
    ("name", "found"),
    [
        (ABORTED, [("cycle", 4, ("read",))]),
        # `shell ls` four times: one tool to the rules, named bash as on 1.x.
        (SHELL, [("cycle", 4, ("bash",)), ("cycle", 5, ("bash",))]),
        (GATE, [("cycle", 4, ("read",))]),
        (REFUSE4, [("cycle", 4, ("read",))] + [("cycle", n, ("read",)) for n in range(5, 9)]),
        (PLUGIN_4096, [("cycle", 4, ("read",)), ("cycle", 5, ("read",)), ("cycle", 6, ("read",))]),
        (PLUGIN_4596, [("cycle", 4, ("read",))]),
    ],
)
def test_each_capture_gives_its_decisions(name: str, found: list[tuple[str, int, tuple]]) -> None:
    assert decisions_of(Tracker(), frames_of(name)) == found


def test_the_permission_gate_approves_three_reads_and_refuses_the_fourths_request() -> None:
    tracker = Tracker(Detection(permissions="approve"))
    replies = [r for frame in frames_of(GATE) for r in tracker.feed(frame).replies]
    assert [r.reply for r in replies] == ["once", "once", "once", "reject"]
    assert [r.route for r in replies] == [2] * 4
    refused = replies[-1]
    assert refused.loop is not None and refused.loop.call_index == 4
    assert refused.message is not None and refused.message.startswith(MARK)
    # The call the request names (`source.id`): the stream's call 4.
    assert refused.loop.part_id == "msg_2525aa6db0017UxNZrndpXndjF:call_3"


# --- a shell call's exit status --------------------------------------------------------------


def test_a_shell_calls_exit_status_reaches_the_call_as_bash_metadata() -> None:
    ends = [e for _, e in typed(SHELL) if isinstance(e, ToolPart) and e.status == "completed"]
    assert [(e.tool, e.input, e.metadata, e.output) for e in ends] == [
        (
            "bash",
            {"command": "ls"},
            {"status": "completed", "truncated": False, "exit": 0},
            "README.md\n",
        )
    ] * 5


def shell_failing(frames: list[Any]) -> list[Any]:
    """The shell capture's five `ls` calls made five different commands that each fail with
    the same message and exit status 2, as a model retrying a broken build would."""
    failing = copy.deepcopy(frames)
    calls = 0
    for frame in failing:
        data = frame.get("data", {})
        if frame["type"] == "session.tool.called" and data["input"] == {"command": "ls"}:
            calls += 1
            data["input"] = {"command": f"make target{calls}"}
        if frame["type"] == "session.tool.success" and "exit" in data["metadata"]:
            data["metadata"]["exit"] = 2
            data["content"] = [{"type": "text", "text": "make: *** No rule. Stop.\n"}]
    return failing


def classic_failing() -> list[dict[str, Any]]:
    """The same failures as 1.x's bash says them: `completed`, `metadata.exit` 2."""
    frames = []
    for n in range(1, 6):
        command = {"command": f"make target{n}"}
        ran = ff.call("ses_1", f"prt_{n}", "bash", command, "make: *** No rule. Stop.\n")
        ran[-1]["properties"]["part"]["state"]["metadata"] = {"exit": 2}
        frames += ran
    return frames


def test_a_failing_shell_call_reaches_the_failure_rule_as_a_failing_bash_on_1_x() -> None:
    on_2 = decisions_of(Tracker(), shell_failing(frames_of(SHELL)))
    on_1 = decisions_of(Tracker(), classic_failing())
    assert on_2 == on_1 == [("failure", 4, ("bash",))]
    # With exit 0 the same commands are no failure at all.
    succeeding = shell_failing(frames_of(SHELL))
    for frame in succeeding:
        if frame["type"] == "session.tool.success" and "exit" in frame["data"]["metadata"]:
            frame["data"]["metadata"]["exit"] = 0
    assert decisions_of(Tracker(), succeeding) == []


# --- the run's end ---------------------------------------------------------------------------


def without_the_answers_step_end(frames: list[Any]) -> list[Any]:
    """The run with no `step.ended {finish: "stop"}`, which ends a run on its own (1.18.33
    sends no other end): only `execution.*` can end it then."""
    return [f for f in frames if f.get("data", {}).get("finish") != "stop"]


@pytest.mark.parametrize(
    ("kind", "name"),
    [("session.execution.succeeded", UNGUARDED), ("session.execution.interrupted", ABORTED)],
)
def test_execution_ends_the_run(kind: str, name: str) -> None:
    tracker = Tracker()
    frames = without_the_answers_step_end(frames_of(name))
    end = next(i for i, frame in enumerate(frames) if frame["type"] == kind)
    for frame in frames[:end]:
        tracker.feed(frame)
    assert list(tracker.running()) == [frames[end]["data"]["sessionID"]]
    tracker.feed(frames[end])
    assert tracker.running() == {}


def test_a_run_begins_at_execution_started_and_a_failed_step_counts_its_spend() -> None:
    events = [e for kind, e in typed(SHELL) if kind.startswith("session.execution")]
    session = "ses_dada80dbeffeJfYlh6SfpoWCQt"
    assert events[0] == SessionSeen(session, None, busy=True)  # no `location` on execution.*
    assert events[1] == SessionIdle(session, None)
    [failed, *_] = [e for kind, e in typed(SHELL) if kind == "session.step.failed"]
    assert failed == MessageUsage(session, "msg_252580c83001MT5ASkYEEInQ1B", 0, 0.0, DIRECTORY)


# --- a user's message ------------------------------------------------------------------------


def test_the_inbox_is_a_user_message_then_its_text_once_delivered() -> None:
    events = [(kind, e) for kind, e in typed(SHELL) if kind.startswith("session.inbox")]
    session = "ses_dada80dbeffeJfYlh6SfpoWCQt"
    prompt = "msg_25257fc9a001B7ATHZ0RaE5enP"
    text = '{"pattern": [["shell", {"command": "ls"}]], "calls": 30, "delay": 0.7}'
    assert events[:2] == [
        ("session.inbox.enqueued", UserMessage(session, prompt, DIRECTORY, text)),
        (
            "session.inbox.delivered",
            TextPart(session, f"{prompt}:prompt", "text", text, False, False, DIRECTORY, prompt),
        ),
    ]
    # Posted with `resume: false`: stored, never delivered, no text told.
    assert [kind for kind, _ in events] == [
        "session.inbox.enqueued",
        "session.inbox.delivered",
        "session.inbox.enqueued",
        "session.inbox.enqueued",
        "session.inbox.delivered",
    ]


def inbox(session: str, inbox_id: str, text: str, seq: int) -> list[dict[str, Any]]:
    """A user message as 2.2.5 streams it: stored, then taken by a run."""
    where = {"directory": DIRECTORY}
    item = {"type": "user", "payload": {"text": text}, "delivery": "steer"}
    return [
        {
            "type": "session.inbox.enqueued",
            "location": where,
            "data": {"inboxID": inbox_id, "sessionID": session, "item": item},
            "durable": {"aggregateID": session, "seq": seq, "version": 1},
        },
        {
            "type": "session.inbox.delivered",
            "location": where,
            "data": {"sessionID": session, "inboxID": inbox_id},
            "durable": {"aggregateID": session, "seq": seq + 1, "version": 1},
        },
    ]


def test_a_hold_on_2_2_5_ends_when_a_persons_message_is_stored() -> None:
    tracker = Tracker()
    frames = frames_of(ABORTED)
    session = "ses_dada84ebeffe65zoQFEFeebprM"
    at = next(i for i, frame in enumerate(frames) if tracker.feed(frame).decisions)
    tracker = Tracker()
    decisions = []
    for frame in frames[: at + 1]:
        decisions += tracker.feed(frame).decisions
    [decision] = decisions
    tracker.outcome(decision, Outcome.HELD)
    # The rest: the abort's ends, our feedback stored and delivered, the model's answer.
    for frame in frames[at + 1 :]:
        tracker.feed(frame)
    assert tracker.held() == {session: DIRECTORY}
    last = max(frame["durable"]["seq"] for frame in frames if "durable" in frame)
    enqueued, delivered = inbox(session, "msg_person", "Read the other file.", last + 1)
    # Stored (posted with `resume: false`, it waits in the inbox): a person has written, as
    # the read-back of the record and the inbox says after a restart (`export.held_in`).
    tracker.feed(enqueued)
    assert tracker.held_sessions == 0
    tracker.feed(delivered)
    assert tracker.held_sessions == 0


def test_our_feedback_delivered_ends_no_hold_and_a_message_is_told_once() -> None:
    tracker = Tracker(Detection(on_loop="hold"))
    frames = frames_of(UNGUARDED)
    session = "ses_dada9007effeQuLwCqyE4OuLCx"
    decisions = [d for frame in frames for d in tracker.feed(frame).decisions]
    tracker.outcome(decisions[0], Outcome.HELD)
    mine = inbox(session, "msg_feedback", decisions[0].feedback, 500)
    for frame in mine:
        tracker.feed(frame)
    assert tracker.held_sessions == 1
    person = inbox(session, "msg_person", "go on", 502)
    adapter = tracker.adapter
    for frame in person:
        tracker.feed(frame)
    assert tracker.held_sessions == 0
    # The same frames again (a replay overlapping the stream): nothing told twice.
    assert [adapter.parse(frame)[1] for frame in person] == [None, None]
    # A delivery this process never saw stored (a restart) tells nothing: the read-back does.
    unseen = inbox(session, "msg_earlier", "hello", 600)[1]
    assert adapter.parse(unseen)[1] is None


def test_a_synthetic_note_in_the_inbox_is_no_users_message() -> None:
    enqueued, _ = inbox("ses_1", "msg_note", "a note", 1)
    enqueued["data"]["item"]["type"] = "synthetic"
    assert Adapter().parse(enqueued) == ("session.inbox.enqueued", None)


# --- the plugin's refusal --------------------------------------------------------------------


def failures(name: str) -> list[str]:
    return [e.error for _, e in typed(name) if isinstance(e, ToolPart) and e.status == "error"]


def test_the_plugins_in_band_refusals_carry_our_mark_as_on_1_x() -> None:
    # The project's plugin, asking nobody (the daemon listened on another port): its own rule
    # refused call 4 with `permission.rejected`, its text our own refusal's.
    [own] = failures(PLUGIN_4596)
    assert own.startswith(MARK) and own_refusal(own)
    # A plugin's thrown error (`{"type": "unknown", "message": ...}`): its message alone.
    assert failures(REFUSE4) == [
        f"{MARK}refused by refuse4, call {n} of the same read" for n in range(4, 9)
    ]
    # The daemon's refusal through the plugin: a monitor's, not the plugin's own.
    assert [own_refusal(error) for error in failures(PLUGIN_4096)] == [False] * 3
    assert all(error.startswith(MARK) for error in failures(PLUGIN_4096))


def test_a_refusal_by_the_plugins_own_rule_is_the_loops_one_intervention() -> None:
    # A monitor that waits for a loop's call to end where no plugin asked it (the refusal
    # comes after `tool.called` on 2.2.5: the hook runs after it) takes the refusal for
    # its own block, as 1.x's `tests/test_own_refusal.py`.
    tracker = Tracker(own_refusal_wait=1.0)
    decisions = [d for frame in frames_of(PLUGIN_4596) for d in tracker.feed(frame).decisions]
    [decision] = decisions
    assert (decision.call_index, decision.refused, decision.plan) == (4, True, Plan.REFUSE)
    assert decision.part_id == "msg_25259834a001qtc0S79tGPmUts:call_3"


# --- the plugin's question -------------------------------------------------------------------


def question(tool: str, args: dict[str, Any]) -> PluginCall:
    body = {"session_id": "ses_1", "call_id": "call_0", "tool": tool, "args": args}
    asked = read_body(json.dumps(body).encode())
    assert isinstance(asked, PluginCall)
    return asked


def test_the_plugins_question_names_a_2_x_call_as_the_stream_does() -> None:
    shell = question("shell", {"command": "ls", "timeout": 5})
    assert (shell.tool, dict(shell.args)) == ("bash", {"command": "ls", "timeout": 5})
    read = question("read", {"path": "README.md"})
    assert (read.tool, dict(read.args)) == ("read", {"filePath": "README.md"})
    # A 1.x call is asked about as it is.
    classic = question("read", {"filePath": "README.md"})
    assert (classic.tool, dict(classic.args)) == ("read", {"filePath": "README.md"})


def test_a_shell_call_asked_about_and_streamed_is_one_call_of_one_tool() -> None:
    # The real run logged "3 calls (read, shell, bash)": the question's `shell` and the
    # stream's `bash` were two tools. Three shell calls asked, then streamed, and a 4th.
    tracker = Tracker()
    frames = frames_of(SHELL)
    session = "ses_dada80dbeffeJfYlh6SfpoWCQt"
    found = []
    for frame in frames:
        data = frame.get("data", {})
        if frame["type"] == "session.tool.called" and data.get("sessionID") == session:
            body = {
                "session_id": session,
                "call_id": data["id"],
                "message_id": data["assistantMessageID"],
                "tool": "shell",
                "args": data["input"],
                "directory": "/proj",
            }
            asked = read_body(json.dumps(body).encode())
            assert isinstance(asked, PluginCall)
            judged = tracker.judge(asked)
            if judged.decision is not None:
                shape = judged.decision.finding.shape()
                found.append(("asked", judged.decision.call_index, shape[2]))
                tracker.outcome(judged.decision, Outcome.BLOCKED)
        for decision in tracker.feed(frame).decisions:
            found.append(("stream", decision.call_index, decision.finding.shape()[2]))
    # Asked as `shell`, streamed as `bash`: one call each (named apart, they were ten calls
    # and the loop `(shell, bash)` found at the 6th), the 4th refused where it asked.
    assert found == [("asked", 4, ("bash",)), ("asked", 5, ("bash",))]
    assert {view.session_id: view.calls for view in tracker.sessions_view()}[session] == 5


# --- the read-back ---------------------------------------------------------------------------


def test_the_read_back_of_2_2_5_is_the_record_in_1_x_shape() -> None:
    session = "ses_dada84ebeffe65zoQFEFeebprM"
    messages = messages_v1_shape(page("messages-daemon-abort.json"), session)
    # The two `idle` items (one per run's end) are no messages.
    assert [m["info"]["role"] for m in messages] == [
        "user",
        *["assistant"] * 4,
        "user",
        "assistant",
    ]
    parts = [part for message in messages for part in tool_parts(message)]
    on_stream = [
        e.part_id for _, e in typed(ABORTED) if isinstance(e, ToolPart) and e.status == "pending"
    ]
    assert [part["id"] for part in parts] == on_stream
    assert [(p["tool"], p["state"]["status"], p["state"]["input"]) for p in parts] == [
        ("read", "completed", {"filePath": "README.md"})
    ] * 3 + [("read", "error", {"filePath": "README.md"})]
    assert parts[0]["state"]["output"] == "Read file README.md, lines 1-1\n1: hello from README"
    assert parts[0]["state"]["metadata"] == {"truncated": False}
    assert parts[3]["state"]["error"] == "Tool execution interrupted"
    # The interrupted step reads as 1.x's aborted message; the run after the feedback answered.
    assert messages[4]["info"]["error"] == {
        "name": "MessageAbortedError",
        "data": {"message": "Step interrupted"},
    }
    assert answered(messages) and feedback_count(messages) == 1
    assert intervened(messages, on_stream[3]) == "feedback already in the session"
    assert intervened(messages[:5], on_stream[3]) == "run already aborted"


def test_a_monitors_refusal_read_back_from_2_2_5_is_an_intervention_already_made() -> None:
    session = "ses_dada605c4ffeYFtBttz6Qcnp9O"
    messages = messages_v1_shape(page("messages-plugin-held.json"), session)
    parts = [part for message in messages for part in tool_parts(message)]
    assert [part["state"]["status"] for part in parts] == ["completed"] * 3 + ["error"] * 3
    assert intervened(messages, parts[3]["id"]) == "call already refused"
    assert not answered(messages)  # the run was interrupted: its `idle` is left out


def test_a_read_back_after_a_reconnect_rebuilds_the_run_with_no_call_counted_twice() -> None:
    # The stream brings calls 1 and 2 and drops; the record is read with call 3 done; the
    # stream's next frames bring call 3 again, then call 4.
    session = "ses_dada84ebeffe65zoQFEFeebprM"
    frames = frames_of(ABORTED)
    ends = [
        i
        for i, frame in enumerate(frames)
        if frame["type"] == "session.tool.success" and frame["data"]["sessionID"] == session
    ]
    tracker = Tracker()
    assert decisions_of(tracker, frames[: ends[1] + 1]) == []
    record = page("messages-daemon-abort.json")
    record["data"] = record["data"][-4:]  # the prompt and calls 1-3, newest first
    messages = messages_v1_shape(record, session)
    assert tracker.seed(session, list(export_frames(current_run(messages))), DIRECTORY) == []
    assert decisions_of(tracker, frames[ends[1] + 1 :]) == [("cycle", 4, ("read",))]
    [view] = tracker.sessions_view()
    assert view.calls == 4


def test_the_inbox_read_back_tells_a_held_session() -> None:
    session = "ses_dada605c4ffeYFtBttz6Qcnp9O"
    messages = messages_v1_shape(page("messages-plugin-held.json"), session)
    waiting = inbox_v1_shape(json.loads((CAPTURES / "inbox-after-hold.json").read_text()), session)
    [feedback] = waiting
    assert feedback["info"] == {
        "id": "msg_2525a01ed001OyVhB7ngrHgb5D",
        "sessionID": session,
        "role": "user",
        "time": {"created": 1796677960175},
    }
    # The hold's feedback waits in the inbox, not in `/message`: read after the record.
    assert not held_in(messages)
    assert held_in(messages + waiting)
    assert feedback_count(messages + waiting) == 1
    # Items of other kinds are no user's message.
    assert inbox_v1_shape({"data": [{"id": "m", "type": "synthetic", "payload": {}}]}, "s") == []
