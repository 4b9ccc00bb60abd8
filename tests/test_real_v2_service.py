"""`watch` with no flags beside OpenCode 2.2.5's background service, as its users run it.

Every `opencode` command a 2.x user types starts one shared server, `opencode serve
--service`, on loopback with a password of its own, and registers its URL, pid and password
in `$XDG_STATE_HOME/opencode/service.json` (V2-REAL-NOTES.md). The user types no URL and no
password: the monitor finds both there, and follows the service when it restarts on another
port with another password. Here the service runs in a throwaway home with the scripted
model; the test stops it (`opencode service stop`, then its process group) also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from monitor.core.feedback import MARK
from monitor.kit.sandbox import (
    ProjectClient2,
    free_loopback_port,
    opencode_config_v2,
    tool_calls,
)
from monitor.kit.scripted_model import ScriptedModel, script
from monitor.service import Refusal, Service, read_service
from monitor.shell.api import basic_auth_header
from tests.harness import MODEL_DELAY
from tests.monitor_process import MonitorProcess

pytestmark = pytest.mark.real_server

READ = ("read", {"path": "README.md"})


@dataclass
class Home:
    """A person's home in which `opencode` runs its background service."""

    root: Path
    binary: Path

    @property
    def env(self) -> dict[str, str]:
        """Their shell's variables: no OPENCODE_* setting of the caller's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
        env.update(
            HOME=str(self.root / "home"),
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_DATA_HOME=str(self.root / "data"),
            XDG_STATE_HOME=str(self.root / "state"),
            XDG_CACHE_HOME=str(self.root / "cache"),
            XDG_RUNTIME_DIR=str(self.root / "run"),
            OPENCODE_DISABLE_MODELS_FETCH="1",
        )
        return env

    @property
    def project(self) -> Path:
        return self.root / "project"

    def opencode(self, *args: str) -> str:
        done = subprocess.run(
            [str(self.binary), *args],
            env=self.env,
            cwd=self.project,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"opencode {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout

    def service(self) -> Service | None:
        registered = read_service(self.root / "state" / "opencode" / "service.json")
        # The real service's registration is the user's own, on loopback: never refused.
        assert not isinstance(registered, Refusal), registered
        return registered

    def start(self, port: int) -> Service:
        """`opencode service set port N` and (re)start: the service registered."""
        self.opencode("service", "set", "port", str(port))
        self.opencode("service", "restart" if self.service() else "start")
        service = self.service()
        assert service is not None and service.url == f"http://127.0.0.1:{port}"
        return service

    def stop(self) -> None:
        """`opencode service stop`; whatever still runs of it is killed."""
        service = self.service()
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.opencode("service", "stop")
        if service is not None and service.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(service.pid, signal.SIGKILL)  # the service leads its own group


@pytest.fixture
def home(opencode2_bin: Path, scripted_model: ScriptedModel) -> Iterator[Home]:
    root = Path(tempfile.mkdtemp(prefix="olm-svc-"))  # short: the monitor's socket is in it
    person = Home(root, opencode2_bin)
    for name in ("home", "config/opencode", "data", "state", "cache", "run", "project"):
        (root / name).mkdir(parents=True, mode=0o700)
    config = opencode_config_v2(scripted_model.url)
    (root / "config" / "opencode" / "opencode.json").write_text(json.dumps(config))
    (person.project / "README.md").write_text("hello from README\n")
    try:
        yield person
    finally:
        person.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def client(http: aiohttp.ClientSession, service: Service, person: Home) -> ProjectClient2:
    assert service.password is not None
    headers = basic_auth_header("opencode", service.password)
    return ProjectClient2(http, service.url, headers, str(person.project))


async def loop_stopped_at_4(
    monitor: MonitorProcess, api: ProjectClient2, interventions: int
) -> dict[str, Any]:
    """An 8-read loop in a new session: stopped at call 4 with one intervention and one
    feedback, which the model reads and answers. The outcome."""
    session = await api.create_session("loop")
    await api.prompt(session["id"], script([READ], 8, delay=MODEL_DELAY))
    record = await api.wait_idle(session["id"], 60, runs=2)
    calls = tool_calls(record)
    assert [call["name"] for call in calls] == ["read"] * 4
    await monitor.wait_event("feedback.sent", interventions)
    outcome = monitor.events("intervention.outcome")[interventions - 1]
    assert (outcome["session_id"], outcome["call_index"]) == (session["id"], 4)
    assert (outcome["outcome"], outcome["rule"]) == ("aborted", "cycle")
    users = [item["text"] for item in record if item.get("type") == "user"]
    assert len(users) == 2 and users[1].startswith(MARK)
    return outcome


async def test_watch_with_no_flags_guards_the_background_service_and_follows_it(
    home: Home, start_monitor: Any, http: aiohttp.ClientSession
) -> None:
    first = home.start(free_loopback_port())
    # As the user types it: no URL, no password, no --api.
    monitor = start_monitor("watch", "--log-format", "json", env=home.env)
    await monitor.wait_event("stream.resynced")
    [detected] = monitor.events("server.detected")
    assert (detected["version"], detected["stream"]) == ("2.2.5", f"{first.url}/api/event")
    [linked] = monitor.events("plugin.linked")
    assert linked["server_pid"] == first.pid
    await loop_stopped_at_4(monitor, client(http, first, home), 1)

    # The service restarts on another port with another password: followed there.
    home.opencode("service", "set", "password", "a-new-password-81d3")
    second = home.start(free_loopback_port())
    assert second.password == "a-new-password-81d3" and second.pid != first.pid
    await monitor.wait_event("server.moved")
    [moved] = monitor.events("server.moved")
    assert (moved["before"], moved["url"]) == (first.url, second.url)
    await monitor.wait_event("stream.resynced", 2)
    await loop_stopped_at_4(monitor, client(http, second, home), 2)
    assert len(monitor.events("intervention.outcome")) == 2
    output = monitor.output()
    assert first.password is not None and first.password not in output
    assert "a-new-password-81d3" not in output
