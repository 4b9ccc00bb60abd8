"""Shared fixtures: a scripted model and a real, isolated `opencode serve` driven by it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path

import aiohttp
import pytest

from monitor.sandbox import OpencodeServer, find_or_install_opencode
from monitor.scripted_model import ScriptedModel
from tests.monitor_process import MonitorProcess

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def opencode_bin() -> Path:
    return find_or_install_opencode(REPO / ".cache" / "opencode")


@pytest.fixture
async def scripted_model() -> AsyncIterator[ScriptedModel]:
    async with ScriptedModel() as model:
        yield model


# Function scope: a start takes about 2 s, and every test gets a server without history.
@pytest.fixture
async def opencode_server(
    opencode_bin: Path, scripted_model: ScriptedModel
) -> AsyncIterator[OpencodeServer]:
    async with OpencodeServer(opencode_bin, scripted_model.url) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
def start_monitor(tmp_path: Path) -> Iterator[Callable[..., MonitorProcess]]:
    """Start `opencode-loop-monitor` subprocesses; every one is killed at teardown."""
    started: list[MonitorProcess] = []

    def start(*args: str, env: Mapping[str, str] | None = None) -> MonitorProcess:
        monitor = MonitorProcess(list(args), tmp_path, env).start()
        started.append(monitor)
        return monitor

    yield start
    for monitor in started:
        monitor.kill()
