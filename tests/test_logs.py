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
