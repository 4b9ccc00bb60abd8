"""Log lines under journald carry their syslog priority; elsewhere they are plain JSON."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from monitor.shell.logs import configure_logging


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def log_three(path: Path, environ: dict[str, str]) -> list[str]:
    with path.open("w", encoding="utf-8") as stream:
        configure_logging("json", "debug", stream=stream, environ=environ)
        log = structlog.get_logger("test")
        log.debug("a.debug")
        log.info("a.info", n=1)
        log.warning("a.warning")
        log.error("a.error")
    return path.read_text(encoding="utf-8").splitlines()


def identity(path: Path) -> str:
    status = os.stat(path)
    return f"{status.st_dev}:{status.st_ino}"


def test_journal_stream_lines_start_with_their_priority(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    path.touch()
    lines = log_three(path, {"JOURNAL_STREAM": identity(path)})
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>"]
    records = [json.loads(line[3:]) for line in lines]
    assert [(r["event"], r["level"]) for r in records] == [
        ("a.debug", "debug"),
        ("a.info", "info"),
        ("a.warning", "warning"),
        ("a.error", "error"),
    ]


def test_another_stream_gets_no_prefix_even_with_journal_stream_set(tmp_path: Path) -> None:
    journal, other = tmp_path / "journal", tmp_path / "other"
    journal.touch()
    lines = log_three(other, {"JOURNAL_STREAM": identity(journal)})
    assert [json.loads(line)["event"] for line in lines] == [
        "a.debug",
        "a.info",
        "a.warning",
        "a.error",
    ]


def test_no_journal_stream_no_prefix(tmp_path: Path) -> None:
    lines = log_three(tmp_path / "out", {})
    assert all(line.startswith("{") for line in lines)


HOSTILE = "rea\nd\x1b[31m\x00\u202egnp.exe<!channel>"


def log_to(path: Path, fmt: str = "json", **fields: object) -> str:
    with path.open("w", encoding="utf-8") as stream:
        configure_logging(fmt, "info", stream=stream, environ={})
        structlog.get_logger("test").warning("loop.detected", **fields)
    return path.read_text(encoding="utf-8")


def test_names_are_cleaned_in_log_fields(tmp_path: Path) -> None:
    text = log_to(tmp_path / "out", "console", tools=[HOSTILE], directory="/w\r\nx")
    assert text.count("\n") == 1 and "\x1b" not in text and "\x00" not in text
    assert "\u202e" not in text
    record = json.loads(log_to(tmp_path / "out", tools=[HOSTILE], directory="/w\r\nx"))
    assert record["tools"] == ["rea d [31m gnp.exe<!channel>"]
    assert record["directory"] == "/w x"


def test_a_cycle_of_10_kb_names_makes_a_bounded_line(tmp_path: Path) -> None:
    tools = [f"t{n}" + "x" * 10_000 for n in range(10)]
    line = log_to(tmp_path / "out", tools=tools, session_id="ses_1")
    assert line.endswith("\n") and len(line) < 8_000
    record = json.loads(line)
    assert [len(tool) for tool in record["tools"]] == [512] * 10
    assert record["tools"][0].startswith("t0xxx") and record["tools"][0].endswith("…")
    assert record["session_id"] == "ses_1"


def test_long_lists_are_cut_and_say_how_many_went(tmp_path: Path) -> None:
    record = json.loads(log_to(tmp_path / "out", known=[f"/d{n}" for n in range(100)]))
    assert record["known"][:2] == ["/d0", "/d1"] and len(record["known"]) == 33
    assert record["known"][-1] == "… 68 more"


def test_a_line_over_the_limit_is_replaced_by_a_short_one(tmp_path: Path) -> None:
    fields = {f"f{n}": "y" * 500 for n in range(40)}
    record = json.loads(log_to(tmp_path / "out", **fields))
    assert record["event"] == "loop.detected" and record["level"] == "warning"
    assert record["truncated_chars"] > 16384 and "f0" not in record


def test_loop_errors_are_logged_once_per_interval_with_their_count() -> None:
    from structlog.testing import capture_logs

    from monitor.shell.logs import LoopErrors

    now = [0.0]
    handler = LoopErrors(every=10.0, clock=lambda: now[0])
    context = {
        "message": "socket.accept() out of system resource",
        "exception": OSError(24, "Too many open files"),
    }
    with capture_logs() as logs:
        for _ in range(1000):
            handler(None, context)  # type: ignore[arg-type]
        now[0] = 10.0
        handler(None, context)  # type: ignore[arg-type]
    assert [(r["event"], r["error"], r["count"]) for r in logs] == [
        ("loop.error", "Too many open files", 1),
        ("loop.error", "Too many open files", 1000),
    ]
