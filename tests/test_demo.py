"""What the demo tells a person, from the records and frames it is given (no server), on
either release's stream."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.config import load_settings
from monitor.core.feedback import feedback_text
from monitor.core.findings import CallCycle
from monitor.kit.demo import DRY_RUN_ANSWER, EDITIONS, Printer, Sessions2, _summary, _watched
from monitor.kit.sandbox import RELEASE_2, OpencodeServer, OpencodeServer2
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


def parts(*statuses: str) -> list[tuple[str, str]]:
    return [(f"prt_{n + 1}", status) for n, status in enumerate(statuses)]


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


# OpenCode 2.2.5's stream (V2-REAL-NOTES.md section 3): `{type, data}`, a call named by
# tool.input.started and run from tool.called, user messages as inbox items.


def frame2(kind: str, **data: object) -> dict[str, object]:
    return {"id": "evt_1", "type": kind, "data": {"sessionID": SESSION, **data}}


def call2(number: int, tool: str, args: dict[str, object]) -> list[dict[str, object]]:
    call = {"assistantMessageID": f"msg_a{number}", "id": f"call_{number - 1}"}
    return [
        frame2("session.tool.input.started", **call, name=tool),
        frame2("session.tool.input.ended", **call, text="{}"),
        frame2("session.tool.called", **call, input=args, executed=False),
        frame2("session.tool.success", **call, content=[], executed=False),
    ]


def inbox2(text: str) -> dict[str, object]:
    item = {"type": "user", "payload": {"text": text, "files": []}, "delivery": "steer"}
    return frame2("session.inbox.enqueued", inboxID="msg_u", item=item)


def printer2() -> tuple[Printer, io.StringIO]:
    out = io.StringIO()
    printer = Printer(out, RELEASE_2)
    printer.session_id, printer.directory = SESSION, "/tmp/sandbox/project"
    return printer, out


def outcome2(name: str) -> dict[str, object]:
    # The monitor names a 2.x call by its assistant message and its id.
    record = outcome(name) | {"part_id": "msg_a6:call_5", "tools": ["read", "bash"]}
    return record


def test_a_2_x_story_is_told_as_the_1_x_one() -> None:
    printer, out = printer2()
    printer.server_frame({"id": "evt_0", "type": "server.connected", "data": {}})
    assert printer.server_connected.is_set()
    printer.server_frame(inbox2('{"pattern": []}'))  # the script: not feedback
    for number in range(1, 7):
        if number % 2:
            args: dict[str, object] = {"path": "/tmp/sandbox/project/README.md"}
            frames = call2(number, "read", args)
        else:
            frames = call2(number, "shell", {"command": "ls"})
        for frame in frames[:3] if number == 6 else frames:
            printer.server_frame(frame)
    # The interrupt is on the stream before the monitor logs what it did: said after it.
    printer.server_frame(frame2("session.execution.interrupted", reason="user"))
    printer.monitor_record(outcome2("aborted"))
    printer.server_frame(inbox2("Automatic notice: stop.\n\nMore."))
    printer.server_frame(frame2("session.text.ended", assistantMessageID="msg_b", text="OK."))
    printer.server_frame(frame2("session.text.ended", text="other", sessionID="ses_other"))
    assert out.getvalue().splitlines() == [
        "  call 1   read   README.md",
        "  call 2   shell  ls",
        "  call 3   read   README.md",
        "  call 4   shell  ls",
        "  call 5   read   README.md",
        "  call 6   shell  ls",
        "monitor: loop detected on call 6: 2 calls (read, bash) repeated 3 times; "
        "session aborted (None ms)",
        "server: run aborted (session.execution.interrupted)",
        'monitor: feedback sent to the model: "Automatic notice: stop."',
        'model: "OK."',
    ]
    assert printer.answered.is_set()


def test_a_2_x_call_refused_by_the_plugin_is_said_after_its_own_line() -> None:
    """2.2.5 shows `tool.called` before the plugin's hook runs; the plugin asked the monitor
    before that: the refusal waits for the call's line, as on 1.x."""
    printer, out = printer2()
    for number in range(1, 6):
        for frame in call2(number, "shell", {"command": "ls"}):
            printer.server_frame(frame)
    printer.monitor_record(outcome2("blocked"))
    [*_, started, _, called, _] = call2(6, "shell", {"command": "ls"})
    printer.server_frame(started)
    printer.server_frame(called)
    assert out.getvalue().splitlines()[-2:] == [
        "  call 6   shell  ls",
        "monitor: loop detected on call 6: 2 calls (read, bash) repeated 3 times; "
        "refused in band by the plugin: it never ran",
    ]


def test_a_2_x_step_that_fails_otherwise_than_by_an_interrupt_is_said() -> None:
    printer, out = printer2()
    error = {"type": "aborted", "message": "Step interrupted"}
    printer.server_frame(frame2("session.step.failed", error=error))
    assert out.getvalue() == ""  # the interrupt's line says it
    printer.server_frame(frame2("session.step.failed", error={"type": "unknown"}))
    assert out.getvalue() == "server: run failed (unknown)\n"


def test_a_2_x_record_names_its_calls_as_the_monitor_does() -> None:
    tool = {"type": "tool", "id": "call_5", "name": "shell", "state": {"status": "error"}}
    record = [
        {"type": "user", "id": "msg_u", "text": "script"},
        {"type": "assistant", "id": "msg_a6", "content": [{"type": "text"}, tool]},
        {"type": "idle", "id": "idl_1", "outcome": "succeeded"},
    ]
    sessions = Sessions2(client=None, gated=False)  # type: ignore[arg-type]
    assert sessions.calls(record) == [("msg_a6:call_5", "error")]


def test_the_demo_watches_its_sandbox_and_never_a_registered_service(tmp_path: Path) -> None:
    """Given no --url, settings follow OpenCode 2's background service when one is
    registered (monitor/service.py): the demo's monitor must watch its own server, with its
    own password (2.x) or none (1.x's sandbox has none)."""
    state = tmp_path / "state" / "opencode"
    state.mkdir(parents=True)
    service = '{"url": "http://127.0.0.1:49374", "password": "theirs", "pid": 1}'
    (state / "service.json").write_text(service)
    environ = {"XDG_STATE_HOME": str(tmp_path / "state"), "OPENCODE_SERVER_PASSWORD": "mine"}
    settings = load_settings({}, environ, isatty=False)
    assert settings.service is not None and settings.url == "http://127.0.0.1:49374"
    server2 = OpencodeServer2(Path("opencode"), "http://127.0.0.1:1/v1", port=4100)
    watched = _watched(settings, server2)
    assert (watched.url, watched.service, watched.password, watched.directory) == (
        "http://127.0.0.1:4100",
        None,
        server2.password,
        None,
    )
    server1 = OpencodeServer(Path("opencode"), "http://127.0.0.1:1/v1", port=4101)
    server1._directory = "/tmp/project"
    watched = _watched(settings, server1)
    assert (watched.url, watched.service, watched.password, watched.directory) == (
        "http://127.0.0.1:4101",
        None,
        None,
        "/tmp/project",
    )


@pytest.mark.parametrize(("flag", "version"), [([], "1.18.33"), (["--opencode", "2"], "2.2.5")])
def test_demo_opencode_picks_the_release(
    flag: list[str], version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = []

    def fake(settings: object, cache_dir: Path, **kwargs: str) -> int:
        got.append(kwargs["opencode"])
        return 0

    monkeypatch.setattr("monitor.kit.demo.run_demo", fake)
    assert main(["demo", *flag]) == 0
    [opencode] = got
    assert EDITIONS[opencode].release.version == version


def test_the_help_says_what_each_release_installs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for edition in EDITIONS.values():
        assert edition.release.spec in help_text and edition.size in help_text
    assert "CACHE_DIR/opencode-2" in help_text and "$OPENCODE2_BIN" in help_text


def test_the_install_line_names_the_package_its_folder_and_its_size(tmp_path: Path) -> None:
    from monitor.kit import demo

    out = io.StringIO()

    def no_install(cache_dir: Path, release: object) -> Path:
        raise demo.SandboxError("not here")

    settings = load_settings({}, {}, isatty=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "find_or_install_opencode", no_install)
        assert demo.run_demo(settings, tmp_path, out, opencode="2") == 1
    assert out.getvalue() == (
        "opencode-loop-monitor demo: finding opencode 2.2.5 (if needed, npm installs "
        f"@opencode/cli@2.2.5 into {tmp_path}/opencode-2: about 480 MB, once)\n"
    )
