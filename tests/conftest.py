"""Shared fixtures: a scripted model and a real, isolated `opencode serve` driven by it."""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import aiohttp
import pytest

from monitor.kit.sandbox import (
    RELEASE_2,
    OpencodeServer,
    OpencodeServer2,
    ProjectClient2,
    default_cache_dir,
    find_or_install_opencode,
)
from monitor.kit.scripted_model import ScriptedModel
from monitor.shell.endpoint import PluginEndpoint
from tests.harness import REPO
from tests.monitor_process import MonitorProcess
from tests.overshoot import overshoot


@pytest.fixture(scope="session")
def opencode_bin() -> Path:
    # The cache `demo` uses too: one install of opencode-ai serves both.
    return find_or_install_opencode(default_cache_dir())


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


@pytest.fixture(scope="session")
def opencode2_bin() -> Path:
    """OpenCode 2.2.5: ``$OPENCODE2_BIN``, or its install in the cache's `opencode-2` folder
    (npm installs it there on first use)."""
    return find_or_install_opencode(default_cache_dir(), RELEASE_2)


@pytest.fixture
async def opencode2_server(
    opencode2_bin: Path, scripted_model: ScriptedModel
) -> AsyncIterator[OpencodeServer2]:
    """A real, isolated OpenCode 2.2.5 on the scripted model, with a generated password
    (`headers`); stopped with everything it started at teardown, also when the test fails."""
    async with OpencodeServer2(opencode2_bin, scripted_model.url) as server:
        yield server


@pytest.fixture
def opencode2_client(
    opencode2_server: OpencodeServer2, http: aiohttp.ClientSession
) -> ProjectClient2:
    """The `/api` client of `opencode2_server`'s project."""
    return opencode2_server.client(http)


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder of its own with a short path: the sockets made in it must fit a Unix socket
    path (107 bytes at most), which pytest's tmp_path can exceed."""
    with tempfile.TemporaryDirectory(prefix="olm-", ignore_cleanup_errors=True) as name:
        yield Path(name)


@pytest.fixture
def socket_path(folder: Path) -> Path:
    """A plugin socket path of its own (the monitor's `--plugin-socket`)."""
    return folder / "plugin.sock"


@pytest.fixture
async def plugin_server(
    opencode_bin: Path, scripted_model: ScriptedModel, socket_path: Path
) -> AsyncIterator[OpencodeServer]:
    """A real server with the monitor's plugin installed, asking at `socket_path`."""
    endpoint = PluginEndpoint(socket_path)
    async with OpencodeServer(opencode_bin, scripted_model.url, plugin=endpoint) as server:
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


OVERSHOOT_FILE = REPO / ".cache" / "overshoot.jsonl"


def pytest_sessionstart(session: pytest.Session) -> None:
    # One file per test run: bench/run.py reports its sum (docs/performance.md). Emptied once,
    # by the main process: pytest-xdist's workers (which have `workerinput`) only append to it.
    if not hasattr(session.config, "workerinput"):
        OVERSHOOT_FILE.parent.mkdir(parents=True, exist_ok=True)
        OVERSHOOT_FILE.write_text("")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The real-trajectory corpus is unpacked on first use into one folder of /tmp (the
    # `corpus` fixture of test_progress_rules.py): its tests share one worker, so that two
    # workers never unpack it at once (with `--dist loadgroup`, as README.md runs the suite).
    for item in items:
        module = getattr(item, "module", None)
        in_module = module is not None and module.__name__.endswith("test_progress_rules")
        if in_module and "corpus" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("realtraj-corpus"))


# Under pytest-xdist every test holds LOCK shared; an `alone` test holds it exclusive, so it runs
# while no other worker runs a test. GATE gives it the turn: without it, the other workers'
# shared holds overlap and it would wait for the end of the run.
LOCK, GATE = (REPO / ".cache" / name for name in ("alone.lock", "alone-gate.lock"))
_held: dict[Path, TextIO] = {}


def _flock(path: Path, operation: int) -> None:
    if path not in _held:
        path.parent.mkdir(parents=True, exist_ok=True)
        _held[path] = path.open("a")
    fcntl.flock(_held[path], operation)


@contextmanager
def _turn(alone: bool) -> Iterator[None]:
    _flock(GATE, fcntl.LOCK_EX)
    try:
        _flock(LOCK, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        if not alone:
            _flock(GATE, fcntl.LOCK_UN)
    try:
        yield
    finally:
        _flock(LOCK, fcntl.LOCK_UN)
        if alone:
            _flock(GATE, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    if not hasattr(item.config, "workerinput"):  # not under pytest-xdist: one test at a time
        return (yield)
    # Tests whose assertions hold on a quiet machine only (a rate over wall time, how soon
    # the monitor stops a fast stream) carry @pytest.mark.alone.
    with _turn(item.get_closest_marker("alone") is not None):
        return (yield)


@pytest.fixture(scope="session")
def _overshoot_file() -> Path:
    return OVERSHOOT_FILE


@pytest.fixture
def measure_overshoot(
    request: pytest.FixtureRequest, _overshoot_file: Path
) -> Callable[[list[dict], list[str]], int]:
    """Count the overshoot of a real-server loop and keep it for the benchmark table."""

    def measure(messages: list[dict], part_ids: list[str]) -> int:
        calls = overshoot(messages, part_ids)
        record = {"test": request.node.nodeid, "loops": len(part_ids), "overshoot": calls}
        with _overshoot_file.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
        return calls

    return measure


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime folder of each test's own ($XDG_RUNTIME_DIR): the monitors a test starts, in
    process or not, keep their default sockets and the lock of the acting monitor
    (monitor.shell.acting) there, apart from other tests' and from the user's."""
    # Short: the default plugin socket is made in it, and a socket path holds 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="olm-rt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
