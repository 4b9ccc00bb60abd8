"""Replay: given these recordings and flags, these detection lines, this summary, this status."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monitor.shell.replay as replay_module
from monitor.cli import main
from monitor.core.events import Malformed
from monitor.core.export import export_frames
from monitor.core.frames import iter_sse_data
from monitor.core.replay import (
    FileReplay,
    Format,
    RecordingError,
    bounded_lines,
    progress_text,
    sniff_format,
)
from monitor.core.tracker import Detection
from monitor.exits import EX_DETECTED, EX_PIPE, EX_USAGE
from monitor.shell.replay import Progress, replay_files
from tests import frames_factory as ff
from tests.captures import CAPTURES, capture_frames

REPO = Path(__file__).resolve().parent.parent
ONE_TOOL = CAPTURES / "one-tool-8-calls-no-guard.event.sse"
TWO_CYCLE = CAPTURES / "two-cycle-40-calls-no-guard.event.sse"
ABORT_EVENT = CAPTURES / "loop-abort-feedback.event.sse"
ABORT_GLOBAL = CAPTURES / "loop-abort-feedback.global.sse"

ONE_TOOL_SESSION = "ses_dd6889fa4ffeDlmaT86ONwYfWm"
ONE_TOOL_PARTS = ["prt_229776465001jK6sb9iP16JWPv", "prt_2297767a8001XjOKeDrU2rNezx"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() reads os.environ; the developer's or CI's own settings must not leak in.
    for name in list(os.environ):
        if name.startswith("OPENCODE_"):
            monkeypatch.delenv(name)


class Run:
    """The result of one replay_files call: status, parsed stdout lines, stderr text."""

    def __init__(self, status: int, out: str, err: str) -> None:
        self.status = status
        self.lines = [json.loads(line) for line in out.splitlines()]
        self.err = err

    @property
    def detections(self) -> list[dict[str, Any]]:
        return self.lines[:-1]

    @property
    def summary(self) -> dict[str, Any]:
        return self.lines[-1]


def replay(
    *paths: Path | str,
    detection: Detection = Detection(),
    isatty: bool = False,
    fail_on_detect: bool = False,
    stdin: bytes = b"",
) -> Run:
    out, err = io.StringIO(), io.StringIO()
    status = replay_files(
        [str(path) for path in paths],
        detection,
        out=out,
        err=err,
        isatty=isatty,
        fail_on_detect=fail_on_detect,
        stdin=io.BytesIO(stdin),
    )
    return Run(status, out.getvalue(), err.getvalue())


def detected(file: str, session: str, part: str, position: int, length: int, tools: list[str]):
    return {
        "event": "loop.detected",
        "rule": "cycle",
        "file": file,
        "session_id": session,
        "part_id": part,
        "position": position,
        "cycle_length": length,
        "repetitions": 4 if length == 1 else 3,
        "tools": tools,
        "finding": f"{length} call{'s' if length > 1 else ''} ({', '.join(tools)}) repeated "
        f"{4 if length == 1 else 3} times",
    }


def summary(files: int, frames: int, malformed: int, sessions: int, detections: int) -> dict:
    return {
        "event": "replay.summary",
        "files": files,
        "frames": frames,
        "malformed": malformed,
        "sessions": sessions,
        "detections": detections,
    }


def write_sse(path: Path, frames: list[object]) -> Path:
    path.write_text("".join(f"data: {json.dumps(frame)}\n\n" for frame in frames))
    return path


# --- telling the formats apart ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("first_line", "expected"),
    [
        ('data: {"type":"server.connected"}\n', Format.SSE),
        ("data:{}\n", Format.SSE),
        (": keep-alive\n", Format.SSE),
        ("event: message\n", Format.SSE),
        ("id: 7\n", Format.SSE),
        ("retry: 1000\n", Format.SSE),
        ('{"type": "server.connected", "properties": {}}\n', Format.JSON_LINES),
        ('{"payload": {"type": "server.heartbeat"}}\r\n', Format.JSON_LINES),
        ("\ufeff" + '{"type": "x"}\n', Format.JSON_LINES),
        ('[{"info": {}, "parts": []}]\n', Format.EXPORT),
        ("[\n", Format.EXPORT),
    ],
)
def test_the_first_line_tells_the_format(first_line: str, expected: Format) -> None:
    assert sniff_format(first_line) is expected


@pytest.mark.parametrize("first_line", ["hello\n", "{\n", '{"type": \n', "42\n", "datum: x\n"])
def test_other_first_lines_are_not_recordings(first_line: str) -> None:
    with pytest.raises(RecordingError):
        sniff_format(first_line)


# --- the captures of the real server ---------------------------------------------------------
# Which calls of each capture are loops is the tracker's to say (tests/test_tracker.py); here:
# that replay reports them, file by file, with the right summary.


def test_one_tool_capture_gives_its_two_detections() -> None:
    run = replay(ONE_TOOL)
    file = str(ONE_TOOL)
    assert run.detections == [
        detected(file, ONE_TOOL_SESSION, ONE_TOOL_PARTS[0], 4, 1, ["read"]),
        detected(file, ONE_TOOL_SESSION, ONE_TOOL_PARTS[1], 8, 1, ["read"]),
    ]
    assert run.summary == summary(files=1, frames=201, malformed=0, sessions=2, detections=2)
    assert run.status == 0 and run.err == ""


def test_both_stream_forms_of_one_run_give_the_same_summary_but_frames() -> None:
    event, global_ = replay(ABORT_EVENT).summary, replay(ABORT_GLOBAL).summary
    assert (event["frames"], global_["frames"]) == (135, 224)  # /global/event adds sync copies
    assert {**event, "frames": 0} == {**global_, "frames": 0}
    assert event == summary(files=1, frames=135, malformed=0, sessions=1, detections=0)


def test_files_are_replayed_independently_and_summed() -> None:
    run = replay(ONE_TOOL, TWO_CYCLE, ONE_TOOL)
    # The second copy of the one-tool capture starts a fresh tracker: the same positions again.
    assert [(line["file"], line["position"]) for line in run.detections] == [
        (str(ONE_TOOL), 4),
        (str(ONE_TOOL), 8),
        *((str(TWO_CYCLE), position) for position in (6, 12, 18, 24, 30, 36)),
        (str(ONE_TOOL), 4),
        (str(ONE_TOOL), 8),
    ]
    assert run.summary == summary(files=3, frames=1001, malformed=0, sessions=5, detections=10)


def test_detection_lines_never_carry_arguments_or_outputs(tmp_path: Path) -> None:
    secret = "s3cr3t-in-the-arguments"
    frames = [f for _ in range(4) for f in ff.call("ses_a", f"prt_{_}", "bash", {"c": secret})]
    out = io.StringIO()
    replay_files(
        [str(write_sse(tmp_path / "s.sse", frames))],
        Detection(),
        out=out,
        err=io.StringIO(),
        isatty=False,
    )
    assert '"loop.detected"' in out.getvalue() and secret not in out.getvalue()


# --- JSON Lines and session exports ----------------------------------------------------------


@pytest.mark.parametrize("capture", [ONE_TOOL, TWO_CYCLE, ABORT_GLOBAL])
def test_json_lines_of_a_capture_give_the_same_detections(capture: Path, tmp_path: Path) -> None:
    jsonl = tmp_path / "capture.jsonl"
    with open(capture, encoding="utf-8") as lines:
        jsonl.write_text("".join(data + "\n" for data in iter_sse_data(lines)))
    from_sse, from_jsonl = replay(capture), replay(jsonl)
    assert [{**line, "file": ""} for line in from_jsonl.detections] == [
        {**line, "file": ""} for line in from_sse.detections
    ]
    assert from_jsonl.summary == from_sse.summary


def export_of(capture: str, session: str) -> list[dict]:
    """The session export the server would answer after this capture: each message once, in
    order, with each part in its last state."""
    infos: dict[str, dict] = {}
    parts: dict[str, dict[str, dict]] = {}
    for frame in capture_frames(capture):
        event = frame.get("payload", frame)
        props = event.get("properties", {})
        if event["type"] == "message.updated" and props["info"]["sessionID"] == session:
            infos[props["info"]["id"]] = props["info"]
            parts.setdefault(props["info"]["id"], {})
        elif event["type"] == "message.part.updated" and props["part"]["sessionID"] == session:
            part = props["part"]
            parts.setdefault(part["messageID"], {})[part["id"]] = part
    return [{"info": infos[id_], "parts": list(parts[id_].values())} for id_ in infos]


def test_session_export_built_from_a_capture_gives_its_detections(tmp_path: Path) -> None:
    export = export_of(ONE_TOOL.name, ONE_TOOL_SESSION)
    assert len(export) > 8 and all(m["info"]["role"] in ("user", "assistant") for m in export)
    path = tmp_path / "session.json"
    path.write_text(json.dumps(export, indent=2))  # pretty-printed, as `curl | jq` saves it
    run = replay(path)
    assert run.detections == [
        detected(str(path), ONE_TOOL_SESSION, ONE_TOOL_PARTS[0], 4, 1, ["read"]),
        detected(str(path), ONE_TOOL_SESSION, ONE_TOOL_PARTS[1], 8, 1, ["read"]),
    ]
    assert run.summary["sessions"] == 1 and run.summary["malformed"] == 0


def message(role: str, session: str, msg: str, tool_parts: list[tuple[str, dict]]) -> dict:
    parts: list[dict] = [{"id": f"prt_{msg}_text", "type": "text", "text": "hello"}]
    for part_id, tool_input in tool_parts:
        parts.append(
            {
                "id": part_id,
                "sessionID": session,
                "messageID": msg,
                "type": "tool",
                "callID": "call_0",
                "tool": "read",
                "state": {"status": "completed", "input": tool_input, "output": "x"},
            }
        )
    return {"info": {"id": msg, "sessionID": session, "role": role}, "parts": parts}


def reads(first: int, count: int) -> list[tuple[str, dict]]:
    return [(f"prt_{n}", {"filePath": "a.py"}) for n in range(first, first + count)]


def test_a_user_message_in_an_export_starts_a_new_run() -> None:
    with_prompt = [
        message("user", "ses_x", "msg_1", []),
        message("assistant", "ses_x", "msg_2", reads(1, 3)),
        message("user", "ses_x", "msg_3", []),  # the run ended; this prompt starts another
        message("assistant", "ses_x", "msg_4", reads(4, 4)),
    ]
    without_prompt = [m for m in with_prompt if m["info"]["id"] != "msg_3"]

    def positions(export: list[dict]) -> list[tuple[str, int]]:
        replay = FileReplay("export.json", Detection())
        records = [r for frame in export_frames(export) for r in replay.feed_frame(frame)]
        return [(r["part_id"], r["position"]) for r in records]

    # Three reads, a prompt, four reads: only the second run's fourth read is a loop.
    assert positions(with_prompt) == [("prt_7", 7)]
    # One run of seven reads: the fourth is.
    assert positions(without_prompt) == [("prt_4", 4)]


def test_export_frames_are_the_stream_frames_of_the_tool_parts() -> None:
    export = [
        message("user", "ses_x", "msg_1", []),
        message("assistant", "ses_x", "msg_2", reads(1, 1)),
        message("user", "ses_x", "msg_3", []),
        "not a message",
    ]
    frames = list(export_frames(export))
    assert frames == [
        {
            "type": "message.part.updated",
            "properties": {"sessionID": "ses_x", "part": export[1]["parts"][1]},
        },
        {"type": "session.idle", "properties": {"sessionID": "ses_x"}},
        Malformed("export: message is not {info, parts}"),
    ]


def test_an_export_that_is_not_json_is_a_file_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[{"info": {}, "parts": [')
    run = replay(path)
    assert run.status == EX_USAGE
    assert run.err == (
        f"opencode-loop-monitor replay: {path}: starts with [ but is not a valid JSON "
        "session export\n"
    )


# --- malformed input, file errors, standard input ---------------------------------------------


def test_bad_lines_count_as_malformed_and_the_rest_is_replayed(tmp_path: Path) -> None:
    good = [f for n in range(4) for f in ff.call("ses_a", f"prt_{n}", "read", {"p": 1})]
    lines = [json.dumps(frame) for frame in good]
    lines[2:2] = ["not json", "[1, 2]", '{"type": "session.idle", "properties": {}}', "\xff{"]
    path = tmp_path / "events.jsonl"
    path.write_bytes("\n\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")
    run = replay(path)
    assert [line["part_id"] for line in run.detections] == ["prt_3"]
    assert run.summary == summary(files=1, frames=16, malformed=4, sessions=1, detections=1)
    assert run.status == 0


def test_a_missing_file_is_named_and_the_others_still_replayed(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sse"
    run = replay(missing, ONE_TOOL)
    assert (
        run.err
        == f"opencode-loop-monitor replay: cannot read {missing}: No such file or directory\n"
    )
    assert len(run.detections) == 2
    assert run.summary == summary(files=1, frames=201, malformed=0, sessions=2, detections=2)
    assert run.status == EX_USAGE


def test_a_file_that_is_not_a_recording_is_a_file_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("\n\nhello\n")
    run = replay(path, fail_on_detect=True)
    assert run.err.startswith(f"opencode-loop-monitor replay: {path}: not a recording")
    assert run.summary == summary(files=0, frames=0, malformed=0, sessions=0, detections=0)
    assert run.status == EX_USAGE


def test_a_directory_is_a_file_error(tmp_path: Path) -> None:
    run = replay(tmp_path)
    assert run.err == f"opencode-loop-monitor replay: cannot read {tmp_path}: Is a directory\n"
    assert run.status == EX_USAGE


def test_an_empty_file_is_an_empty_recording(tmp_path: Path) -> None:
    path = tmp_path / "empty.sse"
    path.write_text("\n")
    run = replay(path)
    assert run.summary == summary(files=1, frames=0, malformed=0, sessions=0, detections=0)
    assert (run.status, run.err) == (0, "")


def test_dash_reads_standard_input() -> None:
    run = replay("-", stdin=ONE_TOOL.read_bytes())
    assert [(line["file"], line["position"]) for line in run.detections] == [("-", 4), ("-", 8)]
    assert run.summary["frames"] == 201


def test_an_overlong_line_is_cut_counted_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_module, "MAX_LINE_BYTES", 600)
    huge = ff.tool_part("ses_a", "prt_huge", "read", "running", {"filePath": "x" * 5000})
    frames = [f for n in range(4) for f in ff.call("ses_a", f"prt_{n}", "read", {"p": 1})]
    assert all(len(json.dumps(frame)) < 500 for frame in frames)
    path = write_sse(tmp_path / "huge.sse", [frames[0], huge, *frames[1:]])
    run = replay(path)
    assert [line["part_id"] for line in run.detections] == ["prt_3"]
    assert run.summary == summary(files=1, frames=13, malformed=1, sessions=1, detections=1)


# --- exit status and flags through the command line ------------------------------------------


def test_fail_on_detect_sets_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--fail-on-detect", str(ONE_TOOL)]) == EX_DETECTED
    assert main(["replay", "--fail-on-detect", str(ABORT_EVENT)]) == 0
    assert main(["replay", str(ONE_TOOL)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["event"] for line in out] == [
        *["loop.detected"] * 2 + ["replay.summary"],
        "replay.summary",
        *["loop.detected"] * 2 + ["replay.summary"],
    ]


def test_detection_flags_change_what_is_found(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--max-period",
        "1",
        "--revisits",
        "0",
        "--circles",
        "0",
        "--fail-on-detect",
        str(TWO_CYCLE),
    ]
    assert main(["replay", *args]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [summary(files=1, frames=599, malformed=0, sessions=1, detections=0)]
    # Two repetitions of the A,B cycle are enough: one every four calls.
    assert main(["replay", "--repeats", "2", str(TWO_CYCLE)]) == 0
    positions = [json.loads(line)["position"] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert positions == list(range(4, 41, 4))


def test_bad_detection_flags_are_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--max-period", "11", str(TWO_CYCLE)]) == 78
    captured = capsys.readouterr()
    assert "max_period in --max-period: expected an integer from 1 to 10" in captured.err
    assert captured.out == ""


def test_the_installed_command_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--fail-on-detect", str(ONE_TOOL)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")},
    )
    assert (result.returncode, result.stderr) == (1, "")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["part_id"] for line in lines[:-1]] == ONE_TOOL_PARTS
    assert lines[-1] == summary(files=1, frames=201, malformed=0, sessions=2, detections=2)


def test_a_reader_that_leaves_early_ends_the_replay_quietly(tmp_path: Path) -> None:
    path = tmp_path / "many.sse"
    path.write_text("".join(f"data: {json.dumps(frame)}\n\n" for frame in large_frames(40_000)))
    process = subprocess.Popen(
        [sys.executable, "-m", "monitor", "replay", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = json.loads(process.stdout.readline())  # `| head -1`
    process.stdout.close()
    assert process.wait(timeout=60) == EX_PIPE
    assert first["event"] == "loop.detected" and process.stderr.read() == b""
    process.stderr.close()


# --- progress on a terminal ------------------------------------------------------------------


def test_progress_text() -> None:
    assert progress_text("file.sse", 12_345_678, 40_000_000, 51234) == (
        "file.sse: 12.3 MB / 40.0 MB, 51234 frames"
    )
    assert progress_text("-", 2_000_000, None, 7) == "-: 2.0 MB, 7 frames"


def test_progress_shows_only_on_a_terminal() -> None:
    size = ONE_TOOL.stat().st_size
    assert replay(ONE_TOOL, isatty=False).err == ""
    err = replay(ONE_TOOL, isatty=True).err
    # Drawn once at the first line, then throttled; erased before output and at the end.
    assert err.startswith(f"\r{ONE_TOOL}: 0.0 MB / {size / 1e6:.1f} MB, 0 frames\x1b[K")
    assert err.endswith("\r\x1b[K")


def test_progress_redraws_at_most_every_interval() -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = Progress(stream, enabled=True, clock=lambda: now[0], interval=0.25)
    for step in range(10):
        now[0] = step * 0.125  # exact in binary, so the comparisons are too
        progress.update("f", step, 10, step)
    draws = stream.getvalue().split("\r")[1:]
    assert draws == [f"f: 0.0 MB / 0.0 MB, {n} frames\x1b[K" for n in (0, 2, 4, 6, 8)]


def test_progress_is_erased_before_output_only_on_a_shared_terminal() -> None:
    for shares_screen, expected in (
        (False, "\rf: 0.0 MB, 1 frames\x1b[K"),
        (True, "\x1b[K\r\x1b[K"),
    ):
        stream = io.StringIO()
        progress = Progress(stream, enabled=True, shares_screen=shares_screen)
        progress.update("f", 0, None, 1)
        progress.before_output()
        assert stream.getvalue().endswith(expected)


# --- a large file in bounded memory ----------------------------------------------------------


def large_frames(count: int) -> Iterator[dict]:
    """Tool calls of 20 sessions in turn, each session repeating a read five times."""
    output = "x" * 100
    for n in range(count // 2):
        session, call = f"ses_{n % 20:02d}", n // 20
        tool_input = {"filePath": f"/src/file_{call // 5}.py", "limit": 200}
        for status in ("running", "completed"):
            yield ff.tool_part(session, f"prt_{n}", "read", status, tool_input, output=output)


class Sink(io.TextIOBase):
    """Counts the lines written to it and keeps none, so only the replay's memory is measured."""

    def __init__(self) -> None:
        self.lines = 0
        self.last = ""

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        self.last = text
        return len(text)


def test_a_large_file_streams_in_bounded_memory(tmp_path: Path) -> None:
    count = 60_000
    path = tmp_path / "large.sse"
    with open(path, "w", encoding="utf-8") as file:
        for frame in large_frames(count):
            file.write(f"data: {json.dumps(frame)}\n\n")
    size = path.stat().st_size
    assert size > 15_000_000  # several times the memory bound below

    out = Sink()
    tracemalloc.start()
    try:
        started = time.perf_counter()
        status = replay_files([str(path)], Detection(), out=out, err=io.StringIO(), isatty=False)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    # Each session reads each file five times: the fourth read is a loop, every 5 calls.
    assert json.loads(out.last) == summary(
        files=1, frames=count, malformed=0, sessions=20, detections=count // 2 // 5
    )
    assert status == 0 and out.lines == count // 2 // 5 + 1
    # A few MB whatever the file's size: nothing is kept per frame.
    assert peak < 2_000_000, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"
    print(f"\n{size / 1e6:.0f} MB, {count} frames: {elapsed:.1f} s, peak {peak / 1e6:.2f} MB")


def test_replay_reports_text_loops_by_rule():
    trace = Path(__file__).resolve().parent / "corpus" / "one-line-repeated.text-loop.sse"
    run = replay(str(trace))
    [line] = run.detections
    assert (line["rule"], line["position"], line["cycle_length"], line["repetitions"]) == (
        "text_repeat",
        29,
        1,
        5,
    )
    assert line["tools"] == [] and run.status == 0
    assert line["finding"] == "the same sentence 5 times in a row"


def test_bounded_lines_cut_a_long_line_and_count_every_byte_read() -> None:
    # What readline(4) returns for b"ab\nlong line\ncd": the long line in pieces of 4.
    reads = [b"ab\n", b"long", b" lin", b"e\n", b"cd"]
    assert list(bounded_lines(reads, 4)) == [(3, "ab\n"), (13, "long\n"), (15, "cd")]


@pytest.mark.parametrize("stream", ["api", "global", "event", "replay-after-3"])
def test_a_new_engine_recording_gives_the_same_detections_as_the_1_x_one(stream: str) -> None:
    # tests/recordings/engine: the same 8 identical reads as ONE_TOOL, run by 1.18.33's new
    # engine (2.x events) and read on each of its streams and the session's replay.
    path = CAPTURES / "engine" / f"new-engine-8-reads.{stream}.sse"
    run = replay(path)
    assert [(d["position"], d["cycle_length"], d["tools"]) for d in run.detections] == [
        (4, 1, ["read"]),
        (8, 1, ["read"]),
    ]
    assert run.summary["malformed"] == 0 and run.summary["sessions"] == 1
