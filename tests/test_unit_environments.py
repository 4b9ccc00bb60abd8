"""Each shipped service definition's command, started in the environment its manager gives it.

Not under systemd or launchd themselves (a test machine runs neither for us): the command,
the variables and the folders the manager hands the process, and nothing else (no HOME, or
one that cannot be written). Each must reach the server, serve the plugin endpoint where
the plugin of the set-up asks, and keep running.
"""

from __future__ import annotations

import json
import os
import plistlib
import secrets
import shlex
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from monitor.cli import main
from monitor.config import load_settings
from monitor.core.plugin_protocol import question_mac
from monitor.kit.sandbox import free_loopback_port
from monitor.shell.endpoint import plugin_endpoint
from monitor.shell.plugin_install import asked_at, installed_endpoint
from monitor.testing import FakeOpencode, play
from tests.harness import status
from tests.monitor_process import CONSOLE_SCRIPT, MonitorProcess
from tests.units import (
    INSTALLED_BINARY,
    SERVICE,
    TCP_DROP_IN,
    TEMPLATE,
    USER_UNIT,
    load,
    value,
    values,
)

PASSWORD = "s3cret"
CALL = {
    "session_id": "ses_dd4d5c831ffemmgMvdYdtbM3cW",
    "call_id": "call_0",
    "tool": "bash",
    "args": {"command": "true"},
    "directory": "/srv/project",
}


@pytest.fixture
def root() -> Iterator[Path]:
    # Short: a Unix socket's path holds at most 107 bytes, and pytest's tmp_path is long.
    with tempfile.TemporaryDirectory(prefix="olm-u-", dir="/tmp") as name:
        yield Path(name)


@pytest.fixture
async def server() -> Iterator[tuple[FakeOpencode, str]]:
    fake = FakeOpencode(streams=[play()])
    test_server = TestServer(fake.app(), host="127.0.0.1")
    await test_server.start_server()
    try:
        yield fake, str(test_server.make_url("")).rstrip("/")
    finally:
        await test_server.close()


@pytest.fixture
def monitors() -> Iterator[list[MonitorProcess]]:
    started: list[MonitorProcess] = []
    yield started
    for monitor in started:
        monitor.kill()


def unwritable_home(root: Path) -> str:
    """A home nobody can write, not even root (which these tests may run as): under a file."""
    (root / "file").write_text("")
    return str(root / "file" / "home")


def folder(path: Path, mode: int = 0o700) -> Path:
    """A folder as the manager makes it (RuntimeDirectoryMode=, StateDirectoryMode=)."""
    path.mkdir(parents=True)
    path.chmod(mode)
    return path


def systemd_command(unit: Path, specifiers: Mapping[str, str], url: str) -> list[str]:
    """ExecStart= as systemd runs it: specifiers and ${VARS} expanded, the server's URL ours."""
    text = value(load(unit), "Service", "ExecStart")
    for specifier, meaning in specifiers.items():
        text = text.replace(specifier, meaning)
    argv = [str(CONSOLE_SCRIPT) if arg == INSTALLED_BINARY else arg for arg in shlex.split(text)]
    if "--url" in argv:
        argv[argv.index("--url") + 1] = url
    else:  # a unit that finds its server: the test's is given (no service is registered)
        argv[2:2] = ["--url", url]
    if "--metrics-addr" in argv:  # 127.0.0.1:9464 may be taken on a test machine
        argv[argv.index("--metrics-addr") + 1] = f"127.0.0.1:{free_loopback_port()}"
    return argv


def unit_environment(units: list[Path], specifiers: Mapping[str, str]) -> dict[str, str]:
    """The unit's Environment= lines, later files (drop-ins) overriding earlier ones."""
    env: dict[str, str] = {}
    for unit in units:
        for line in values(load(unit), "Service", "Environment"):
            for assignment in shlex.split(line):
                name, _, setting = assignment.partition("=")
                for specifier, meaning in specifiers.items():
                    setting = setting.replace(specifier, meaning)
                env[name] = setting
    return env


def credentials(units: list[Path], into: Path, files: Mapping[str, str]) -> None:
    """LoadCredential=: each named file copied into the credentials folder, mode 0400."""
    for unit in units:
        for line in values(load(unit), "Service", "LoadCredential"):
            name, _, source = line.partition(":")
            copy = into / name
            copy.write_text(files[source])
            copy.chmod(0o400)


def start(
    monitors: list[MonitorProcess], argv: list[str], env: dict[str, str], root: Path
) -> MonitorProcess:
    monitor = MonitorProcess([], root, None)
    monitor.args = argv
    # Only what the manager gives: not this test's environment.
    monitor.env = {"PATH": os.environ["PATH"], **env}
    monitors.append(monitor.start())
    return monitor


async def serves_plugins(monitor: MonitorProcess, token: str | None = None) -> str:
    """Wait until the monitor watches and serves plugins; ask it once. Where it listens."""
    # Resynced: until the first connect's resync has ended, every question is answered 503.
    records = await monitor.wait_for(
        lambda rs: {"stream.resynced", "plugin.listening"} <= {r.get("event") for r in rs}
    )
    [listening] = [r for r in records if r.get("event") == "plugin.listening"]
    body = json.dumps(CALL).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:  # signed, as the plugin signs (the token in the clear is refused)
        nonce = secrets.token_hex(16)
        headers["Authorization"] = f"OLM-HMAC {nonce} {question_mac(token, nonce, body)}"
    if listening["port"] is None:
        connector = aiohttp.UnixConnector(listening["socket"])
        url = "http://localhost/v1/decide"
    else:
        connector = aiohttp.TCPConnector()
        url = f"http://127.0.0.1:{listening['port']}/v1/decide"
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.post(url, data=body, headers=headers) as answer:
            assert (answer.status, await answer.json()) == (200, {"verdict": "allow"})
    assert monitor.process is not None and monitor.process.poll() is None
    return str(listening["socket"] if listening["port"] is None else listening["port"])


def system_environment(root: Path, name: str, units: list[Path]) -> tuple[dict[str, str], dict]:
    """What systemd gives a DynamicUser= service: its folders and credentials, no home."""
    runtime = folder(root / "run" / name)
    state = folder(root / "lib" / "opencode-loop-monitor")
    creds = folder(root / "credentials", 0o500)
    specifiers = {"${CREDENTIALS_DIRECTORY}": str(creds), "%d": str(creds)}
    env = {
        **unit_environment(units, specifiers),
        "RUNTIME_DIRECTORY": str(runtime),
        "STATE_DIRECTORY": str(state),
        "CREDENTIALS_DIRECTORY": str(creds),
        "INVOCATION_ID": "0" * 32,
    }
    return env, {"specifiers": specifiers, "creds": creds, "runtime": runtime}


@pytest.mark.parametrize("home", ["none", "unwritable"])
async def test_system_unit_runs_under_its_sandbox(root, server, monitors, home):
    fake, url = server
    env, given = system_environment(root, "opencode-loop-monitor", [SERVICE])
    if home == "unwritable":
        env["HOME"] = unwritable_home(root)
    credentials([SERVICE], given["creds"], {"/etc/opencode-loop-monitor/password": PASSWORD})
    monitor = start(monitors, systemd_command(SERVICE, given["specifiers"], url), env, root)
    socket = await serves_plugins(monitor)
    assert Path(socket).parent == given["runtime"]


async def test_template_instance_runs_under_its_sandbox(root, server, monitors):
    _, url = server
    env, given = system_environment(root, "opencode-loop-monitor/server1", [TEMPLATE])
    # EnvironmentFile=/etc/opencode-loop-monitor/%i.env, as the operator writes it.
    env["OPENCODE_LOOP_MONITOR_URL"] = url
    credentials([TEMPLATE], given["creds"], {"/etc/opencode-loop-monitor/%i.password": PASSWORD})
    monitor = start(monitors, systemd_command(TEMPLATE, given["specifiers"], url), env, root)
    socket = await serves_plugins(monitor)
    assert Path(socket).parent == given["runtime"]


async def test_system_unit_with_the_tcp_drop_in_serves_another_users_plugin(root, server, monitors):
    _, url = server
    units = [SERVICE, TCP_DROP_IN]
    env, given = system_environment(root, "opencode-loop-monitor", units)
    assert env["OPENCODE_LOOP_MONITOR_PLUGIN_ADDR"] == "127.0.0.1:9465"
    env["OPENCODE_LOOP_MONITOR_PLUGIN_ADDR"] = "127.0.0.1:0"  # a free port on a test machine
    token = "t" * 43
    credentials(
        units,
        given["creds"],
        {
            "/etc/opencode-loop-monitor/password": PASSWORD,
            "/etc/opencode-loop-monitor/plugin-token": token + "\n",
        },
    )
    monitor = start(monitors, systemd_command(SERVICE, given["specifiers"], url), env, root)
    await serves_plugins(monitor, token)


async def test_user_unit_serves_where_plugin_install_points(root, server, monitors):
    _, url = server
    home = folder(root / "home", 0o755)
    xdg_runtime = folder(root / "run" / "user")
    runtime = folder(xdg_runtime / "opencode-loop-monitor")
    specifiers = {"%h": str(home)}
    env = {
        **unit_environment([USER_UNIT], specifiers),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(xdg_runtime),
        "RUNTIME_DIRECTORY": str(runtime),
    }
    argv = systemd_command(USER_UNIT, specifiers, url)
    monitor = start(monitors, argv, env, root)
    socket = await serves_plugins(monitor)
    # `plugin install` in the person's shell (the same login, so the same $XDG_RUNTIME_DIR).
    shell = {"HOME": str(home), "XDG_RUNTIME_DIR": str(xdg_runtime)}
    endpoint = plugin_endpoint(load_settings({"url": url}, shell, isatty=False), shell)
    assert endpoint is not None and str(endpoint.socket) == socket
    # Issue 45: `status` answered nothing after this set-up; it shows the monitor now.
    code, out = await status(argv[argv.index("--metrics-addr") + 1])
    assert code == 0 and "role: acting" in out.splitlines(), out
    assert f"plugins asking at unix:{socket}:" in out.splitlines()


@pytest.mark.parametrize("shell_runtime", [False, True], ids=["plain-shell", "xdg-shell"])
async def test_launchd_agent_unit_prints_serves_where_plugin_install_points(
    root, server, monitors, monkeypatch, capsys, shell_runtime
):
    """`plugin install` and `unit --launchd` in the person's shell, then the plist's
    ProgramArguments run as launchd runs them: with the person's HOME, USER and SHELL, its
    short PATH, no XDG_* (issue 45: a shell with $XDG_RUNTIME_DIR pointed the plugin
    elsewhere than the agent served), and the plist's own variables."""
    _, url = server
    home = folder(root / "Users" / "u", 0o755)
    folder(home / "Library" / "Logs", 0o755)
    for name in list(os.environ):
        if name.startswith(("XDG_", "OPENCODE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    if shell_runtime:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder(root / "run" / "user")))
    assert main(["plugin", "install"]) == 0
    metrics = f"127.0.0.1:{free_loopback_port()}"  # the default, 9464, may be taken here
    assert main(["unit", "--launchd", "--url", url, "--metrics-addr", metrics]) == 0
    printed = capsys.readouterr()
    assert "warning" not in printed.err
    agent = plistlib.loads(printed.out[printed.out.index("<?xml") :].encode())
    argv = agent["ProgramArguments"]
    assert argv[0] == str(CONSOLE_SCRIPT)
    env = {
        **agent["EnvironmentVariables"],
        "HOME": str(home),
        "USER": "u",
        "SHELL": "/bin/sh",
        "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
    }
    monitor = start(monitors, argv, env, root)
    socket = await serves_plugins(monitor)
    installed = installed_endpoint(
        (home / ".config" / "opencode" / "plugins" / "opencode-loop-monitor.ts").read_text()
    )
    assert installed is not None and asked_at(installed, url) == socket
    # `status` in the person's shell, with no flag but the address it was printed with.
    code, out = await status(metrics)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"monitor 0.1.0 watching {url}" and "role: acting" in lines
    # The monitor, its role and the plugin asking (serves_plugins asked once, as a plugin).
    assert f"plugins asking at unix:{socket}:" in lines
    assert "  /srv/project: 1 calls, 0 blocked, 0 fell open, last request " in out
