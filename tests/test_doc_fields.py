"""Every field a documented query or log sample reads exists on the event it names.

The monitor runs against the stand-in through a loop that is stopped; its log records are the
ground truth. A query that filters `loop.detected` on `outcome` matches nothing in
production, so it must fail here.
"""

from __future__ import annotations

import re
from pathlib import Path

from structlog.testing import capture_logs

from monitor.testing import FakeOpencode, play
from tests.harness import loop_frames, start, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# LogQL: `event="E"` (a label or a `| json` field), then `| field op "value"` filters, and
# the `by (...)` fields an aggregation groups on.
LOGQL = re.compile(r'event="(?P<event>[a-z_.]+)"[^|\n]*(?P<filters>(?:\s*\|[^|\n\[]+)*)')
LOGQL_BY = re.compile(r"by \((?P<by>[\w, ]+)\)\s*\(\s*count_over_time\((?P<query>[^\n]+)")
FILTER = re.compile(r"\|\s*(\w+)\s*(?:=|!=|=~|!~|>|<)")
LINE_FORMAT = re.compile(r"\{\{\s*\.(\w+)")
# jq and Vector: `.event == "E"` (or `.monitor.event`), and the other fields the same
# expression reads.
DOT_EVENT = re.compile(r'select\((?P<expr>[^)]*\.event == "(?P<event>[a-z_.]+)"[^)]*)\)')
DOT_FIELD = re.compile(r"\.(\w+)\s*(?:==|!=|>|<)")
# Text-format samples: `event  key=value key=value`.
SAMPLE = re.compile(r"^\s*(?P<event>[a-z]+\.[a-z_]+)\s{2,}(?P<pairs>\w+=.*)$", re.M)


def documented_reads() -> list[tuple[str, str, set[str]]]:
    """(where, event, fields read) for every query and sample in the docs."""
    reads = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        for match in LOGQL.finditer(text):
            fields = set(FILTER.findall(match["filters"])) - {"json", "event"}
            fields |= set(LINE_FORMAT.findall(match["filters"]))
            reads.append((name, match["event"], fields))
        for match in LOGQL_BY.finditer(text):
            event = re.search(r'event="([a-z_.]+)"', match["query"])
            assert event is not None, match[0]
            reads.append((name, event[1], {f.strip() for f in match["by"].split(",")}))
        for match in DOT_EVENT.finditer(text):
            fields = set(DOT_FIELD.findall(match["expr"])) - {"event", "monitor"}
            reads.append((name, match["event"], fields))
        for match in SAMPLE.finditer(text):
            fields = set(re.findall(r"(\w+)=", match["pairs"]))
            reads.append((name, match["event"], fields))
    return reads


async def stopped_loop_logs() -> list[dict[str, object]]:
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    return logs


def test_the_docs_have_queries_and_samples_to_check():
    events = {event for _, event, _ in documented_reads()}
    assert {"loop.detected", "intervention.outcome", "feedback.sent"} <= events


async def test_every_field_a_doc_reads_is_on_the_event_it_names():
    logs = await stopped_loop_logs()
    logged: dict[str, set[str]] = {}
    for entry in logs:
        logged.setdefault(str(entry["event"]), set()).update(entry)
    missing = [
        (where, event, sorted(fields - logged.get(event, set())))
        for where, event, fields in documented_reads()
        if event in logged and not fields <= logged[event]
    ]
    assert missing == []
    unlogged = {event for _, event, _ in documented_reads()} - set(logged)
    # Events this run does not produce are checked by name in test_docs.py.
    assert unlogged <= {"stream.disconnected", "stream.connect_failed", "stream.reconnected"}


def documented_table(path: Path, heading: str) -> set[str]:
    """The names in the first column of the table under `heading` (`a`, `b` in one cell)."""
    text = path.read_text(encoding="utf-8")
    section = text.split(heading + "\n", 1)[1].split("\n#", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return names


async def test_monitor_started_fields_are_the_documented_ones():
    logs = await stopped_loop_logs()
    [started] = [entry for entry in logs if entry["event"] == "monitor.started"]
    logged = set(started) - {"event", "log_level"}
    assert documented_table(ROOT / "docs" / "logs.md", "### `monitor.started` (info)") == logged


def test_interventions_total_lists_every_outcome_it_counts():
    from monitor.shell.metrics import INTERVENTION_OUTCOMES

    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    [row] = [
        line for line in text.splitlines() if "`opencode_loop_monitor_interventions_total`" in line
    ]
    listed = re.findall(r"`(\w+)`", row.split("|")[3])
    assert listed[0] == "outcome" and set(listed[1:]) == set(INTERVENTION_OUTCOMES)


def test_readme_demo_sample_says_what_the_demo_prints_with_its_defaults():
    # It said "cycles of up to 4 calls" long after the default became 10.
    from monitor.config import load_settings
    from monitor.kit.demo import watching_line

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    [line] = [line for line in text.splitlines() if line.startswith("monitor: watching (")]
    log_path = line.rsplit("its log: ", 1)[1]
    defaults = load_settings({}, {}, isatty=False)
    assert line == watching_line(defaults, False, log_path)
