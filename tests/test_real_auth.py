"""The monitor against a real `opencode serve` that runs with OPENCODE_SERVER_PASSWORD.

The right password (from the variable, or the first line of --password-file) lets it follow
the stream and stop a loop; a wrong or missing one is a configuration error: exit 78 at
once, one line on stderr, no retry. The password never shows in any output.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from monitor.config import SERVER_PASSWORD_VAR, SERVER_USERNAME_VAR
from monitor.kit.sandbox import OpencodeServer, tool_parts
from monitor.kit.scripted_model import ScriptedModel, script

pytestmark = pytest.mark.real_server

PASSWORD = "pw-3c9e71d0b5"
WRONG = "pw-wrong-5a04e2"
READ = ("read", {"filePath": "README.md"})
CONFIG_ERROR_LINE = (
    "opencode-loop-monitor: config error: the server refused our credentials (401): check the "
    "password in OPENCODE_SERVER_PASSWORD or in the --password-file file, and the user name in "
    "OPENCODE_SERVER_USERNAME (default opencode)"
)
NO_PASSWORD_LINE = (
    "opencode-loop-monitor: config error: the server wants a password (401) and none was sent: "
    "set OPENCODE_SERVER_PASSWORD to the password `opencode serve` runs with, or give "
    "--password-file FILE"
)


@pytest.fixture
async def secured_server(
    opencode_bin: Path, scripted_model: ScriptedModel
) -> AsyncIterator[OpencodeServer]:
    async with OpencodeServer(
        opencode_bin, scripted_model.url, env_extra={SERVER_PASSWORD_VAR: PASSWORD}
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def no_inherited_credentials(monkeypatch):
    # The monitor's environment is this process's plus what a test passes: keep it clean.
    monkeypatch.delenv(SERVER_PASSWORD_VAR, raising=False)
    monkeypatch.delenv(SERVER_USERNAME_VAR, raising=False)


def monitor_args(command, server, *flags):
    return [command, *flags, "--url", server.url, "--log-format", "json"]


def assert_no_secret(monitor):
    output = monitor.output()
    assert PASSWORD not in output and WRONG not in output


async def catches_a_loop(monitor, server, http):
    await monitor.wait_event("stream.connected")
    client = server.client(http)
    session = await client.create_session("secured loop")
    await client.prompt_async(session["id"], script([READ], 20, delay=0.2))
    messages = await client.wait_idle(session["id"], 60, user_messages=2)
    assert len(tool_parts(messages)) == 4
    [detected] = monitor.events("intervention.outcome")
    assert detected["outcome"] == "aborted" and detected["session_id"] == session["id"]
    assert monitor.events("feedback.sent")
    code, _ = await monitor.stop()
    assert code == 0


async def test_right_password_from_the_environment(secured_server, start_monitor, http):
    monitor = start_monitor(
        *monitor_args("watch", secured_server), env={SERVER_PASSWORD_VAR: PASSWORD}
    )
    await catches_a_loop(monitor, secured_server, http)
    assert_no_secret(monitor)


async def test_right_password_from_a_file(secured_server, start_monitor, http, tmp_path):
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\nsecond line is ignored\n")
    monitor = start_monitor(
        *monitor_args("watch", secured_server, "--password-file", str(password_file))
    )
    await catches_a_loop(monitor, secured_server, http)
    assert_no_secret(monitor)


async def exits_78_quickly(monitor):
    started = time.monotonic()
    code = await monitor.wait_exit(10)
    took = time.monotonic() - started
    assert code == 78 and took < 5
    assert_no_secret(monitor)
    return monitor.stderr_path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("env", "line"),
    [({SERVER_PASSWORD_VAR: WRONG}, CONFIG_ERROR_LINE), ({}, NO_PASSWORD_LINE)],
    ids=["wrong", "missing"],
)
async def test_watch_refused_exits_78(secured_server, start_monitor, env, line):
    monitor = start_monitor(*monitor_args("watch", secured_server), env=env)
    assert await exits_78_quickly(monitor) == [line]
    assert monitor.events("stream.connected") == []


async def test_wrong_password_from_a_file_exits_78(secured_server, start_monitor, tmp_path):
    password_file = tmp_path / "password"
    password_file.write_text(WRONG + "\n")
    monitor = start_monitor(
        *monitor_args("watch", secured_server, "--password-file", str(password_file))
    )
    assert await exits_78_quickly(monitor) == [CONFIG_ERROR_LINE]


async def test_attach_refused_exits_78(secured_server, start_monitor, http):
    session = await secured_server.client(http).create_session("attach target")
    monitor = start_monitor(
        *monitor_args("attach", secured_server, session["id"]), env={SERVER_PASSWORD_VAR: WRONG}
    )
    [line] = await exits_78_quickly(monitor)
    assert line.startswith("opencode-loop-monitor: config error: ") and "(401)" in line


async def test_attach_with_the_right_password_follows_the_session(
    secured_server, start_monitor, http
):
    session = await secured_server.client(http).create_session("attach target")
    monitor = start_monitor(
        *monitor_args("attach", secured_server, session["id"]),
        env={SERVER_PASSWORD_VAR: PASSWORD},
    )
    [resynced] = await monitor.wait_event("stream.resynced")
    assert resynced["busy"] == 0  # the lookup and the status query passed the password
    async with http.delete(
        f"{secured_server.url}/session/{session['id']}",
        params={"directory": secured_server.directory},
        headers=secured_server.headers,
    ) as response:
        assert response.status == 200
    assert await monitor.wait_exit(10) == 0
    assert_no_secret(monitor)


@pytest.mark.parametrize("command", ["watch", "attach"])
def test_help_never_shows_the_password(command, start_monitor, monkeypatch):
    monitor = start_monitor(command, "--help", env={SERVER_PASSWORD_VAR: PASSWORD})
    assert monitor.process.wait(10) == 0
    assert SERVER_PASSWORD_VAR in monitor.output()  # the variable is named ...
    assert PASSWORD not in monitor.output()  # ... its value never shown
