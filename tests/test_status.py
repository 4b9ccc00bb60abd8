"""`status` against a running monitor: its /status endpoint and the command that reads it."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.cli import main
from monitor.config import load_settings
from monitor.exits import EX_UNAVAILABLE
from monitor.shell.notify import Notifier
from monitor.shell.watch import Watch
from monitor.testing import FakeOpencode, frames
from tests.frames_factory import READ, call, envelope
from tests.harness import FAST, events, loop_frames, wait_for


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENCODE_LOOP_MONITOR_METRICS_ADDR", "OPENCODE_LOOP_MONITOR_CONFIG"):
        monkeypatch.delenv(name, raising=False)


async def test_status_shows_sessions_held_busy_and_the_stream(capsys):
    # s1 loops twice: aborted at call 4, held at 5 (armed; max_interventions 1); s2 made 2 calls.
    # The 5th call comes once the first intervention was carried out: a new one, not the
    # same one still under way.
    s2 = [envelope(f, "/v") for n in (1, 2) for f in call("ses_2", f"g{n}", "grep", {"n": n})]
    fake = FakeOpencode()
    fake.streams = [fake.live]
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}"
    settings = load_settings(
        {
            "url": url,
            "metrics_addr": "127.0.0.1:0",
            "max_interventions": "1",
        },
        {},
        isatty=False,
    )
    watch = Watch(settings, notifier=Notifier(None), timing=FAST)
    task = asyncio.create_task(watch.run())
    try:
        with capture_logs() as logs:
            await wait_for(fake.live_connected.is_set)
            await fake.push(loop_frames("ses_1", 4))
            await wait_for(lambda: len(events(logs, "feedback.sent")) == 1)
            fifth = [envelope(f, "/w") for f in call("ses_1", "p5", "read", READ)]
            await fake.push(frames(*fifth, *s2))
            await wait_for(lambda: len(events(logs, "feedback.sent")) == 2)
        assert watch.metrics_server is not None
        address = f"127.0.0.1:{watch.metrics_server.port}"
        code = await asyncio.to_thread(main, ["status", "--metrics-addr", address, "--json"])
        assert code == 0
        status = json.loads(capsys.readouterr().out)
        code = await asyncio.to_thread(main, ["status", "--metrics-addr", address])
        assert code == 0
        table = capsys.readouterr().out
    finally:
        watch.stop()
        await asyncio.wait_for(task, 5)
        await server.close()

    assert status["stream"]["state"] == "connected"
    assert status["stream"]["frames"] == 1 + 5 * 3 + 2 * 3
    assert status["dry_run"] is False and status["directory"] is None
    assert status["totals"] == {"sessions": 2, "busy": 1, "held": 1, "interventions": 2}
    assert status["sessions"] == [
        {
            "session_id": "ses_1",
            "directory": "/w",
            "state": "held",
            "run_calls": 5,
            "interventions": 2,
        },
        {
            "session_id": "ses_2",
            "directory": "/v",
            "state": "busy",
            "run_calls": 2,
            "interventions": 0,
        },
    ]
    lines = table.splitlines()
    assert lines[0] == f"monitor 0.1.0 watching {url}"
    assert lines[1].startswith(
        "stream: connected to opencode (no version given) (1.x API), 22 frames, last frame "
    )
    assert lines[2] == "sessions known: 2 (busy 1, held 1, idle 0), interventions: 2"
    assert status["role"] == {"state": "acting"} and lines[3] == "role: acting"
    endpoint = status["plugins"]["endpoint"]
    assert endpoint.startswith("unix:") and endpoint.endswith(".sock")
    assert status["plugins"]["directories"] == [] and status["plugins"]["refused"] == 0
    assert lines[4] == f"plugins: none asked yet at {endpoint}"
    assert lines[6:] == [
        "SESSION  STATE  CALLS  INTERVENTIONS  DIRECTORY",
        "ses_1    held       5              2  /w",
        "ses_2    busy       2              0  /v",
    ]


def test_status_without_a_monitor_exits_69(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["status", "--metrics-addr", f"127.0.0.1:{port}"]) == EX_UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith(f"opencode-loop-monitor: no monitor answers on http://127.0.0.1:{port}/")
    assert err.endswith(f"is `watch` running with --metrics-addr 127.0.0.1:{port}?\n")


async def test_status_of_10000_sessions_is_bounded_cached_and_rate_limited(monkeypatch):
    import time

    from monitor.core.status_view import STATUS_SESSIONS_MAX
    from monitor.shell import metrics_server as metrics_module
    from monitor.shell.metrics_server import STATUS_RATE, Cached, RateLimit

    # The burst on a stopped clock: on a busy machine 100 requests took longer than a token's
    # refill (50 ms), and a 21st was answered (1 run in 4 beside the suite).
    monkeypatch.setattr(metrics_module, "RateLimit", lambda rate: RateLimit(rate, lambda: 0.0))
    monkeypatch.setattr(
        metrics_module, "Cached", lambda build, ttl: Cached(build, ttl, lambda: 0.0)
    )

    settings = load_settings(
        {"url": "http://127.0.0.1:9", "metrics_addr": "127.0.0.1:0"}, {}, isatty=False
    )
    watch = Watch(settings, notifier=Notifier(None), timing=FAST)
    for n in range(10_000):
        directory = "/w\n<!channel>" + "d" * 10_000 if n == 0 else f"/p{n}"
        for frame in call(f"ses_{n}", f"prt_{n}", "read", {"n": n})[:2]:  # pending, running
            watch.monitor.tracker.feed(envelope(frame, directory))
    started = time.perf_counter()
    status = watch.status()
    build_ms = (time.perf_counter() - started) * 1000
    assert status["totals"]["sessions"] == 10_000 and status["sessions_omitted"] == 9_900
    assert len(status["sessions"]) == STATUS_SESSIONS_MAX
    hostile = status["sessions"][0]["directory"]
    assert hostile.startswith("/w <!channel>ddd") and len(hostile) == 256
    body = json.dumps(status)
    assert len(body) < 20_000, len(body)
    print(f"status of 10,000 sessions: built in {build_ms:.1f} ms, {len(body)} bytes")

    calls = [0]

    def counted():
        calls[0] += 1
        return status

    metrics = watch.metrics
    assert metrics is not None
    server = await metrics_module.start_metrics_server(metrics, "127.0.0.1", 0, counted)
    try:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as http:
            url = f"http://127.0.0.1:{server.port}/status"

            async def get() -> int:
                async with http.get(url) as response:
                    await response.read()
                    return response.status

            answers = await asyncio.gather(*(get() for _ in range(100)))
        # One build for the burst; the rate limit's burst answered, the rest refused.
        assert calls[0] == 1
        assert answers.count(200) == int(STATUS_RATE) and answers.count(429) == 100 - int(
            STATUS_RATE
        )
    finally:
        await server.close()


def test_status_table_says_how_many_sessions_it_left_out():
    from monitor.shell.status import render_status

    status = {
        "version": "1",
        "url": "http://x",
        "directory": None,
        "dry_run": False,
        "stream": {
            "state": "connected",
            "frames": 1,
            "last_frame_unix": None,
            "server": "opencode (no version given): 1.x API",
        },
        "totals": {"sessions": 101, "busy": 0, "held": 0, "interventions": 0},
        "sessions": [
            {
                "session_id": "ses_1",
                "state": "idle",
                "run_calls": 0,
                "interventions": 0,
                "directory": None,
            }
        ],
        "sessions_omitted": 100,
    }
    assert render_status(status, 0).endswith(
        "... and 100 more (held first, then busy, then idle)\n"
    )


def test_plugins_line_says_when_the_last_request_came():
    # It said "last last frame 3 s ago" of a plugin's request.
    from monitor.shell.status import render_status

    status = {
        "version": "1",
        "url": "http://x",
        "directory": None,
        "dry_run": False,
        "stream": {"state": "connected", "frames": 1, "last_frame_unix": 97.0},
        "totals": {"sessions": 0, "busy": 0, "held": 0, "interventions": 0},
        "sessions": [],
        "plugins": {
            "endpoint": "unix:/run/p.sock",
            "refused": 0,
            "directories": [
                {
                    "directory": "/w",
                    "requests": 5,
                    "blocked": 1,
                    "fell_open": 0,
                    "last_request_unix": 98.0,
                }
            ],
            "unasked_calls": None,
        },
    }
    assert render_status(status, 100).splitlines()[1:] == [
        "stream: connected, 1 frames, last frame 3 s ago",
        "sessions known: 0 (busy 0, held 0, idle 0), interventions: 0",
        "plugins asking at unix:/run/p.sock:",
        "  /w: 5 calls, 1 blocked, 0 fell open, last request 2 s ago",
    ]


@pytest.mark.parametrize(
    ("role", "line"),
    [
        ({"state": "acting"}, ["role: acting"]),
        (
            {"state": "standby", "acting_pid": 4242},
            [
                "role: standby: the monitor with pid 4242 acts for this server; loops are "
                "logged here and left to it, and this one takes over when it stops"
            ],
        ),
        ({"state": "dry run"}, []),
    ],
)
def test_status_says_whether_this_monitor_acts_or_stands_by(role, line):
    from monitor.shell.status import render_status

    status = {
        "version": "1",
        "url": "http://x",
        "directory": None,
        "dry_run": False,
        "role": role,
        "stream": {"state": "connected", "frames": 1, "last_frame_unix": 97.0},
        "totals": {"sessions": 0, "busy": 0, "held": 0, "interventions": 0},
        "sessions": [],
    }
    assert render_status(status, 100).splitlines()[3:] == line


@pytest.mark.parametrize(
    ("server", "line"),
    [
        ("opencode 2.2.5: 2.x API", "stream: connected to opencode 2.2.5 (2.x API), 1 frames, "),
        ("opencode 1.18.33: 1.x and 2.x API", "stream: connected to opencode 1.18.33 (1.x and "),
        (None, "stream: connected, 1 frames, "),  # not connected yet, or an older monitor's
    ],
)
def test_the_stream_line_names_the_server_the_monitor_found(server, line):
    from monitor.shell.status import render_status

    status = {
        "version": "1",
        "url": "http://x",
        "directory": None,
        "dry_run": False,
        "stream": {"state": "connected", "frames": 1, "last_frame_unix": 97.0, "server": server},
        "totals": {"sessions": 0, "busy": 0, "held": 0, "interventions": 0},
        "sessions": [],
    }
    assert render_status(status, 100).splitlines()[1].startswith(line)
