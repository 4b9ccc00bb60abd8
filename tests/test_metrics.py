"""Metrics and health endpoints, scraped over HTTP from a real server on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.core.events import _PARSERS, KNOWN_EVENT_TYPES, parse_event
from monitor.shell.metrics import Metrics, readiness
from monitor.shell.metrics_server import MetricsServer, start_metrics_server

P = "opencode_loop_monitor_"
LIMIT = 25.0


@dataclass
class State:
    """What the shell would expose: the stream's state, the tracker's size, a fake clock."""

    connected: bool = False
    sessions: int = 0
    known: int = 0
    last_frame_at: float | None = None
    now: float = 1000.0
    wall: float = 1_700_000_000.0  # the Unix time when the monotonic clock reads `now`


def event_type(frame: object) -> str:
    """The bounded label the tracker gives a frame, which metrics count frames by."""
    return parse_event(frame)[0]


@pytest.fixture
def state() -> State:
    return State()


@pytest.fixture
def metrics(state: State) -> Metrics:
    return Metrics(
        connected=lambda: state.connected,
        sessions=lambda: state.sessions,
        known=lambda: state.known,
        last_frame_at=lambda: state.last_frame_at,
        clock=lambda: state.now,
        read_limit=LIMIT,
        wall_clock=lambda: state.wall,
    )


@pytest.fixture
async def server(metrics: Metrics) -> AsyncIterator[MetricsServer]:
    running = await start_metrics_server(metrics, "127.0.0.1", 0)
    try:
        yield running
    finally:
        await running.close()


async def get(server: MetricsServer, path: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        async with http.get(f"http://127.0.0.1:{server.port}{path}") as response:
            return response.status, response.headers["Content-Type"], await response.text()


async def scrape(server: MetricsServer) -> set[str]:
    status, _, text = await get(server, "/metrics")
    assert status == 200
    return {line for line in text.splitlines() if line and not line.startswith("#")}


async def test_counters_appear_with_exact_values(metrics, server):
    metrics.frame("message.part.updated")
    metrics.frame("message.part.updated")
    metrics.frame("server.heartbeat")
    metrics.malformed()
    metrics.reconnect()
    metrics.loop(2)
    metrics.intervention("aborted")
    metrics.intervention("dry_run")
    metrics.intervention("dry_run")

    lines = await scrape(server)

    assert {
        f'{P}frames_total{{event_type="message.part.updated"}} 2.0',
        f'{P}frames_total{{event_type="server.heartbeat"}} 1.0',
        f"{P}malformed_frames_total 1.0",
        f"{P}stream_reconnects_total 1.0",
        f'{P}loops_detected_total{{cycle_length="2",rule="cycle"}} 1.0',
        f'{P}interventions_total{{outcome="aborted"}} 1.0',
        f"{P}dry_run_loops_left_running_total 2.0",
    } <= lines
    # Nothing was stopped in dry run: the interventions counter does not say otherwise.
    assert not any('outcome="dry_run"' in line for line in lines)


async def test_outcomes_start_at_zero(server):
    lines = await scrape(server)
    for outcome in ("aborted", "held", "rejected", "answered", "abort_failed", "cancelled"):
        assert f'{P}interventions_total{{outcome="{outcome}"}} 0.0' in lines
    assert f"{P}dry_run_loops_left_running_total 0.0" in lines


async def test_gauges_are_read_at_scrape_time(state, server):
    state.connected, state.sessions, state.last_frame_at, state.now = True, 3, 993.0, 1000.0
    state.known = 5
    lines = await scrape(server)
    assert {
        f"{P}stream_connected 1.0",
        f"{P}sessions_busy 3.0",
        f"{P}sessions_known 5.0",
        f"{P}seconds_since_last_frame 7.0",
    } <= lines

    state.connected, state.sessions, state.now = False, 0, 1030.5
    lines = await scrape(server)
    assert {
        f"{P}stream_connected 0.0",
        f"{P}sessions_busy 0.0",
        f"{P}seconds_since_last_frame 37.5",
    } <= lines


async def test_seconds_since_last_frame_counts_from_start_before_any_frame(state, server):
    # The fixture created the metrics at now=1000: no frame yet means "since start".
    state.now = 1012.0
    assert f"{P}seconds_since_last_frame 12.0" in await scrape(server)


async def test_no_session_id_in_any_label(state, metrics, server):
    state.connected, state.sessions, state.last_frame_at = True, 5, state.now
    metrics.frame(event_type({"type": "session.idle", "properties": {"sessionID": "ses_1"}}))
    metrics.malformed()
    metrics.reconnect()
    metrics.loop(3)
    metrics.intervention("held")

    _, _, text = await get(server, "/metrics")

    labels = {
        name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for name in sample.labels
    }
    assert labels == {
        "event_type",
        "cycle_length",
        "outcome",
        "rule",
        "reason",
        "version",
        "python_version",
    }
    assert "ses_1" not in text
    assert all(
        family.name.startswith((P, "process_")) for family in text_string_to_metric_families(text)
    )


async def test_unknown_event_types_share_one_label_value(metrics, server):
    for n in range(500):
        metrics.frame(event_type({"type": f"hostile.{n}", "properties": {}}))
    metrics.frame("not.even.from.event_type")

    lines = await scrape(server)

    frame_lines = {line for line in lines if line.startswith(f"{P}frames_total")}
    assert frame_lines == {f'{P}frames_total{{event_type="other"}} 501.0'}


async def test_healthz_answers_while_the_loop_runs(server):
    assert await get(server, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")


async def test_readyz_follows_the_stream(state, server):
    status, _, text = await get(server, "/readyz")
    assert (status, text) == (503, "not ready: event stream not connected\n")

    state.connected = True
    status, _, text = await get(server, "/readyz")
    assert (status, text) == (503, "not ready: no frame received yet\n")

    state.last_frame_at = state.now
    assert (await get(server, "/readyz"))[::2] == (200, "ready\n")

    state.now += LIMIT + 1
    status, _, text = await get(server, "/readyz")
    assert (status, text) == (503, "not ready: no frame for 26 s\n")

    state.last_frame_at = state.now
    assert (await get(server, "/readyz"))[0] == 200

    state.connected = False
    assert (await get(server, "/readyz"))[0] == 503


async def test_metrics_content_type_is_prometheus_text(server):
    status, content_type, _ = await get(server, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=")


async def test_port_zero_binds_a_free_port_and_a_taken_port_fails(metrics, server):
    assert server.port > 0
    with pytest.raises(OSError):
        await start_metrics_server(metrics, "127.0.0.1", server.port)


async def test_instances_keep_their_own_registries(state, metrics):
    other = Metrics(lambda: False, lambda: 0, lambda: None, clock=lambda: state.now)
    metrics.loop(2)
    other.loop(2)
    other.loop(2)
    assert (
        f'{P}loops_detected_total{{cycle_length="2",rule="cycle"}} 1.0'
        in prometheus_client.generate_latest(metrics.registry).decode()
    )
    assert (
        f'{P}loops_detected_total{{cycle_length="2",rule="cycle"}} 2.0'
        in prometheus_client.generate_latest(other.registry).decode()
    )


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ({"type": "message.part.updated", "properties": {}}, "message.part.updated"),
        ({"directory": "/w", "payload": {"type": "session.idle"}}, "session.idle"),
        ({"payload": {"type": "server.heartbeat", "properties": {}}}, "server.heartbeat"),
        ({"directory": "/d", "payload": {"type": "sync", "syncEvent": {"type": "x"}}}, "sync"),
        ({"type": "some.future.event"}, "other"),
        ({"payload": {"type": "x" * 10_000}}, "other"),
        ({"properties": {}}, "malformed"),
        ({"type": 7}, "malformed"),
        ({"payload": "session.idle"}, "malformed"),
        ({"payload": {"properties": {}}}, "malformed"),
        (["type", "session.idle"], "malformed"),
        (None, "malformed"),
    ],
)
def test_event_type(frame, expected):
    assert event_type(frame) == expected


def test_known_event_types_include_what_the_tracker_reads():
    assert {
        "message.part.updated",
        "session.status",
        "session.idle",
        "session.created",
        "session.updated",
        "session.deleted",
        "server.connected",
        "server.heartbeat",
        "sync",
    } <= KNOWN_EVENT_TYPES
    assert "other" not in KNOWN_EVENT_TYPES and "malformed" not in KNOWN_EVENT_TYPES


def test_every_type_the_tracker_parses_is_its_own_label():
    # `parse_event` labels a parsed frame by its type without looking it up again.
    assert set(_PARSERS) <= KNOWN_EVENT_TYPES
    assert set(_PARSERS) >= {"message.part.updated", "message.part.delta", "file.edited"}


@pytest.mark.parametrize(
    ("connected", "last_frame_at", "now", "expected"),
    [
        (False, 100.0, 100.0, "event stream not connected"),
        (True, None, 100.0, "no frame received yet"),
        (True, 100.0, 100.0, None),
        (True, 100.0, 100.0 + LIMIT, None),  # exactly at the limit still counts
        (True, 100.0, 100.0 + LIMIT + 0.5, "no frame for 26 s"),
    ],
)
def test_readiness(connected, last_frame_at, now, expected):
    assert readiness(connected, last_frame_at, now, LIMIT) == expected


async def test_build_info_process_metrics_and_last_frame_timestamp(state, server):
    import platform

    from monitor import __version__

    lines = await scrape(server)
    python = platform.python_version()
    assert f'{P}build_info{{python_version="{python}",version="{__version__}"}} 1.0' in lines
    assert f"{P}last_frame_timestamp_seconds 0.0" in lines  # no frame yet
    assert any(line.startswith("process_resident_memory_bytes ") for line in lines)
    assert any(line.startswith("process_start_time_seconds ") for line in lines)
    state.last_frame_at = state.now - 7.0
    assert f"{P}last_frame_timestamp_seconds 1.699999993e+09" in await scrape(server)


async def test_openmetrics_and_gzip_when_the_scraper_asks(metrics, server):
    import gzip

    metrics.loop(2)
    url = f"http://127.0.0.1:{server.port}/metrics"
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        headers = {
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "identity",
        }
        async with http.get(url, headers=headers) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            text = await response.text()
        assert text.endswith("# EOF\n")
        assert f'{P}loops_detected_total{{cycle_length="2",rule="cycle"}} 1.0' in text
        async with http.get(url, headers={"Accept-Encoding": "gzip"}) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            plain = gzip.decompress(await response.read()).decode()
        assert f'{P}loops_detected_total{{cycle_length="2",rule="cycle"}} 1.0' in plain
        async with http.get(url, headers={"Accept-Encoding": "identity"}) as response:
            assert "Content-Encoding" not in response.headers


async def test_loops_are_counted_by_rule_with_a_bounded_label(metrics, server):
    metrics.loop(1, "failure")
    metrics.loop(1, "wait")
    metrics.loop(1, "made-up")
    lines = await scrape(server)
    assert {
        f'{P}loops_detected_total{{cycle_length="1",rule="failure"}} 1.0',
        f'{P}loops_detected_total{{cycle_length="1",rule="wait"}} 1.0',
        f'{P}loops_detected_total{{cycle_length="1",rule="other"}} 1.0',
    } <= lines


async def test_tokens_and_cost_are_counted_by_directory_with_a_bounded_label(metrics, server):
    from monitor.core.tracker import Tracker
    from monitor.shell.metrics import MAX_DIRECTORIES

    tracker = Tracker()
    info = {"id": "msg_1", "sessionID": "ses_a", "role": "assistant", "cost": 0.25}
    info["finish"] = "tool-calls"
    for tokens in (100, 160):  # the same message as it grows: 160 tokens in all
        frame = {
            "type": "message.updated",
            "properties": {"info": {**info, "tokens": {"input": tokens}}},
        }
        fed = tracker.feed({"directory": "/home/dev/app", "project": "p", "payload": frame})
        assert fed.spent is not None
        metrics.spent(*fed.spent)
    for n in range(MAX_DIRECTORIES + 1):
        metrics.spent(f"/d{n}", 1, 0.0)
    lines = await scrape(server)
    assert {
        f'{P}tokens_total{{directory="/home/dev/app"}} 160.0',
        f'{P}cost_usd_total{{directory="/home/dev/app"}} 0.25',
        f'{P}tokens_total{{directory="other"}} 2.0',
    } <= lines
    assert not any("ses_a" in line for line in lines)


async def test_no_created_series_beside_the_counters(metrics, server):
    """Issue 32: a `_created` series for every counter, which says only when this started."""
    metrics.frame("server.heartbeat")
    metrics.loop(2)
    lines = await scrape(server)
    assert f'{P}frames_total{{event_type="server.heartbeat"}} 1.0' in lines
    assert [line for line in lines if "_created" in line] == []
