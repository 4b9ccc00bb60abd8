"""One acting monitor per server, whatever the URL's spelling or the start order (issue 43):
`watch`es in process against the stand-in, sharing one folder of role locks as the monitors
of one user do (monitor.shell.acting). The monitor the plugin asks is the one that acts; a
standby refuses no question on its own account, logs its loops under its own name, counts
none of them as its loops, and checks its settings as it starts."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.core.monitor import STANDBY
from monitor.core.plugin_protocol import RequestRefused
from monitor.errors import ConfigError
from monitor.shell.acting import Role
from monitor.shell.notify import Notifier
from monitor.shell.watch import Watch
from monitor.testing import FakeOpencode
from tests.harness import FAST, events, loop_frames, wait_for
from tests.monitor_process import MonitorProcess

# A poll every 50 ms: a hand-over within the test's waits.
QUICK = dataclasses.replace(FAST, takeover=0.05)
# No poll within a test: a role stays as it was taken.
NEVER = dataclasses.replace(FAST, takeover=3600.0)
SESSION = "ses_dd4d5c831ffemmgMvdYdtbM3cW"
CALL = {
    "session_id": SESSION,
    "call_id": "call_4",
    "tool": "read",
    "args": {"filePath": "/w/README.md"},
    "directory": "/w",
}

Running = tuple[Watch, "asyncio.Task[int]"]


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeOpencode, str]]:
    fake = FakeOpencode()
    fake.streams = [fake.live] * 4
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        fake.close()
        await server.close()


class Monitors:
    """Watches started in this process, each stopped at the end, also when a test fails."""

    def __init__(self) -> None:
        self.running: list[Running] = []

    def start(self, url: str, roles: Path, timing: Any = QUICK, **flags: Any) -> Watch:
        settings = load_settings(
            {"url": url, "metrics_addr": "127.0.0.1:0", **flags}, {}, isatty=False
        )
        watch = Watch(settings, notifier=Notifier(None), timing=timing, roles=roles)
        self.running.append((watch, asyncio.create_task(watch.run())))
        return watch

    async def stop(self) -> None:
        for watch, task in reversed(self.running):
            watch.stop()
            await asyncio.gather(asyncio.wait_for(task, 5), return_exceptions=True)


@pytest.fixture
async def monitors() -> AsyncIterator[Monitors]:
    started = Monitors()
    try:
        yield started
    finally:
        await started.stop()


def loops_counted(watch: Watch) -> float:
    """`loops_detected_total`, summed over its labels."""
    assert watch.metrics is not None
    text = generate_latest(watch.metrics.registry).decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("opencode_loop_monitor_loops_detected_total{")
    )


async def one_loop_once(fake: FakeOpencode, logs: list[dict[str, Any]]) -> list[str]:
    """Push a loop of 4 identical reads to every watch; the outcomes, once each logged one."""
    await wait_for(lambda: len(events(logs, "stream.resynced")) >= 2)
    await fake.push(loop_frames(SESSION, 4))
    await wait_for(lambda: len(events(logs, "intervention.outcome")) >= 2)
    await wait_for(lambda: fake.of("prompt_async"))
    return sorted(str(o["outcome"]) for o in events(logs, "intervention.outcome"))


async def test_two_spellings_of_one_server_give_one_acting_monitor_and_one_intervention(
    fake: tuple[FakeOpencode, str], folder: Path, monitors: Monitors
) -> None:
    server, url = fake
    port = url.rsplit(":", 1)[1]
    with capture_logs() as logs:
        first = monitors.start(f"http://127.0.0.1:{port}", folder, plugin_socket="off")
        await wait_for(lambda: events(logs, "monitor.acting"))
        second = monitors.start(f"http://localhost:{port}", folder, plugin_socket="off")
        await wait_for(lambda: events(logs, "monitor.standby"))
        assert first.role is not None and first.role.acting
        assert second.role is not None and not second.role.acting
        assert await one_loop_once(server, logs) == ["aborted", "standby"]
    assert len(server.of("abort")) == len(server.of("prompt_async")) == 1
    # What counts `loop.detected` lines, or the loops metric, counts this loop once.
    assert len(events(logs, "loop.detected")) == len(events(logs, "loop.standby")) == 1
    assert (loops_counted(first), loops_counted(second)) == (1, 0)


@pytest.mark.parametrize("endpoint_first", [True, False])
async def test_the_monitor_serving_the_endpoint_acts_whichever_starts_first(
    fake: tuple[FakeOpencode, str], folder: Path, monitors: Monitors, endpoint_first: bool
) -> None:
    server, url = fake
    socket = str(folder / "plugin.sock")
    with capture_logs() as logs:
        if endpoint_first:
            served = monitors.start(url, folder, plugin_socket=socket)
            await wait_for(lambda: events(logs, "plugin.listening"))
            bare = monitors.start(url, folder, plugin_socket="off")
            await wait_for(lambda: events(logs, "monitor.standby"))
        else:
            bare = monitors.start(url, folder, plugin_socket="off")
            await wait_for(lambda: events(logs, "monitor.acting"))
            served = monitors.start(url, folder, plugin_socket=socket)
            # It stands by for a poll, serving its endpoint; the bare one gives it the role.
            await wait_for(lambda: events(logs, "monitor.took_over"))
            assert len(events(logs, "monitor.gave_way")) == 1
        assert served.role is not None and served.role.acting and served.plugins.server
        assert bare.role is not None and not bare.role.acting
        assert await one_loop_once(server, logs) == ["aborted", "standby"]
        await asyncio.sleep(5 * QUICK.takeover)  # polls go on: nobody takes the role back
        assert served.role.acting and not bare.role.acting
    assert len(server.of("abort")) == 1
    assert (loops_counted(served), loops_counted(bare)) == (1, 0)
    assert len(events(logs, "monitor.gave_way")) == (0 if endpoint_first else 1)


async def test_a_standby_serving_the_endpoint_answers_503_so_the_plugins_own_rule_judges(
    fake: tuple[FakeOpencode, str], folder: Path, monitors: Monitors
) -> None:
    # The moment between an endpoint monitor's start and the bare one's next poll, held.
    _, url = fake
    socket = folder / "plugin.sock"
    with capture_logs() as logs:
        bare = monitors.start(url, folder, NEVER, plugin_socket="off")
        await wait_for(lambda: events(logs, "monitor.acting"))
        served = monitors.start(url, folder, NEVER, plugin_socket=str(socket))
        await wait_for(lambda: events(logs, "plugin.listening"))
        assert served.role is not None and not served.role.acting
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(socket))) as http:
            async with http.post("http://localhost/v1/decide", json=CALL) as answer:
                assert (answer.status, await answer.json()) == (503, {"error": STANDBY})
        assert bare.role is not None and bare.role.acting
    [refused] = events(logs, "plugin.refused")
    assert (refused["status"], refused["reason"]) == (503, STANDBY)


async def test_a_standby_without_the_endpoint_refuses_no_question(
    fake: tuple[FakeOpencode, str], folder: Path, monitors: Monitors
) -> None:
    from monitor.core.plugin_protocol import PluginCall

    _, url = fake
    with capture_logs() as logs:
        acting = monitors.start(url, folder, NEVER, plugin_socket="off")
        await wait_for(lambda: events(logs, "monitor.acting"))
        standby = monitors.start(url, folder, NEVER, plugin_socket="off")
        await wait_for(lambda: len(events(logs, "stream.resynced")) == 2)
    assert acting.role is not None and acting.role.acting
    asked = PluginCall(**CALL)  # type: ignore[arg-type]
    assert standby.plugins.judge(asked) == RequestRefused(503, STANDBY)


# -- a standby checks its settings as it starts ---------------------------------------------


async def test_a_standby_with_a_socket_folder_others_can_write_fails_at_start(
    fake: tuple[FakeOpencode, str], folder: Path, monitors: Monitors
) -> None:
    _, url = fake
    acting = Role(folder, url, endpoint=True)
    assert acting.try_acting()  # another monitor serves the endpoint and acts
    open_folder = folder / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    try:
        standby = monitors.start(url, folder, plugin_socket=str(open_folder / "plugin.sock"))
        _, task = monitors.running[-1]
        with pytest.raises(ConfigError, match="others can open it"):
            await asyncio.wait_for(task, 5)
        assert standby.role is None
    finally:
        acting.close()


async def test_a_standby_with_a_token_file_open_to_others_fails_at_start(
    fake: tuple[FakeOpencode, str], folder: Path, monitors: Monitors
) -> None:
    _, url = fake
    acting = Role(folder, url, endpoint=True)
    assert acting.try_acting()
    token = folder / "token"
    token.write_text("a-token-of-this-user\n")
    token.chmod(0o644)
    try:
        monitors.start(url, folder, plugin_addr="127.0.0.1:0", plugin_token_file=str(token))
        _, task = monitors.running[-1]
        with pytest.raises(ConfigError, match="open to others"):
            await asyncio.wait_for(task, 5)
    finally:
        acting.close()


async def test_the_watch_command_of_a_standby_with_a_foreign_token_exits_78_at_start(
    start_monitor: Any, runtime_dir: Path, folder: Path
) -> None:
    url = "http://127.0.0.1:9"  # nothing listens: the check comes before any connect
    acting = Role(runtime_dir / "opencode-loop-monitor", url, endpoint=True)
    (runtime_dir / "opencode-loop-monitor").mkdir(mode=0o700)
    assert acting.try_acting()
    token = folder / "token"
    token.write_text("a-token-of-this-user\n")
    token.chmod(0o640)
    try:
        standby: MonitorProcess = start_monitor(
            "watch",
            "--url",
            url,
            "--log-format",
            "json",
            "--plugin-addr",
            "127.0.0.1:0",
            "--plugin-token-file",
            str(token),
        )
        assert await standby.wait_exit(20) == 78
        assert "open to others" in standby.output()
    finally:
        acting.close()
