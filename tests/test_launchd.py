"""The macOS launchd agent: `unit --launchd` prints a well-formed plist for this install and
home (plistlib parses what `plutil -lint` would: plutil is not on Linux), serving /status where
`status` asks and the plugin where the installed plugin asks, naming a password file, never a
password; the shipped file is its text for /opt. Its command run as launchd runs it is in
tests/test_unit_environments.py."""

from __future__ import annotations

import os
import plistlib
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.config import SERVER_PASSWORD_VAR, STATUS_ADDRESS
from monitor.shell.launchd import (
    AGENT_PATH,
    LABEL,
    agent_environment,
    check_command,
    render_agent,
)
from tests.units import AGENT, SERVICE, load, value

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD_PASSWORD = "${CREDENTIALS_DIRECTORY}/opencode-password"
OPT_HOME = Path("/Users/USER")
OPT_SOCKET = OPT_HOME / ".local" / "state" / "opencode-loop-monitor" / "plugin-4096.sock"
CONSOLE_SCRIPT = Path(sys.executable).parent / "opencode-loop-monitor"


def agent() -> dict[str, object]:
    with AGENT.open("rb") as stream:
        return plistlib.load(stream)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A person's home and shell: no password, no plugin yet, no XDG variables but the
    runtime folder a shell on Linux has (a macOS shell may have it set too)."""
    # Short: sockets are named under it, and a socket's path holds 103 bytes on macOS.
    with tempfile.TemporaryDirectory(prefix="olm-h-") as name:
        folder = Path(name)
        for variable in list(os.environ):
            if variable.startswith(("OPENCODE_", "XDG_")):
                monkeypatch.delenv(variable)
        monkeypatch.setenv("HOME", str(folder))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder / "run"))
        yield folder


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, str, str]:
    """`unit --launchd ARGS`: the plist parsed, its text, and what went to stderr."""
    assert main(["unit", "--launchd", *args]) == 0
    captured = capsys.readouterr()
    return plistlib.loads(captured.out.encode()), captured.out, captured.err


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_shipped_agent_is_the_printed_one_for_the_opt_install() -> None:
    from monitor.shell.unit import INSTALLED_BINARY

    plugin = ["--plugin-socket", str(OPT_SOCKET)]
    assert AGENT.read_text() == render_agent([INSTALLED_BINARY], None, OPT_HOME, plugin)


def test_the_shipped_agent_runs_the_units_command_serving_status_and_the_plugin() -> None:
    unit_command = shlex.split(value(load(SERVICE), "Service", "ExecStart"))
    # The user's agent finds its server itself (no --url), as the user unit does.
    dropped = ("--password-file", SYSTEMD_PASSWORD, "--url", "http://127.0.0.1:4096")
    without_password = [arg for arg in unit_command if arg not in dropped]
    expected = without_password[:-2] + [
        "--metrics-addr",
        str(STATUS_ADDRESS),
        "--plugin-socket",
        str(OPT_SOCKET),
        *without_password[-2:],
    ]
    assert agent()["ProgramArguments"] == expected
    # Issue 45: no placeholder password is needed to run it (it named one by default).
    assert "--password-file" not in agent()["ProgramArguments"]


def test_the_agent_restarts_on_failure_and_logs_unbuffered():
    plist = agent()
    assert plist["Label"] == LABEL == AGENT.name.removesuffix(".plist")
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["EnvironmentVariables"] == {"PYTHONUNBUFFERED": "1"}
    assert plist["Umask"] == 0o077
    # launchd expands nothing: every path is absolute, under the home it was printed for.
    assert (
        plist["StandardOutPath"]
        == plist["StandardErrorPath"]
        == ("/Users/USER/Library/Logs/opencode-loop-monitor.log")
    )


def test_the_printed_agent_runs_this_install_for_this_home(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["plugin", "install"])
    capsys.readouterr()
    plist, _, err = printed(capsys)
    argv = plist["ProgramArguments"]
    assert argv[:2] == [str(CONSOLE_SCRIPT), "watch"] and os.access(argv[0], os.X_OK)
    # No --url given: the agent finds its server (OpenCode 2's registered service, or 4096).
    assert "--url" not in argv
    # Issue 45: `status` asked 127.0.0.1:9464, which neither service served.
    assert flag(argv, "--metrics-addr") == str(STATUS_ADDRESS)
    assert argv[-2:] == ["--log-format", "json"]
    assert plist["StandardOutPath"] == str(home / "Library" / "Logs" / "opencode-loop-monitor.log")
    assert err == ""  # the plugin is installed, the command runs, no password anywhere
    assert AGENT_PATH == f"Library/LaunchAgents/{LABEL}.plist"


def test_the_agent_serves_where_the_installed_plugin_asks_whatever_the_shell_derived(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plugin install` from a shell with $XDG_RUNTIME_DIR points the plugin there; the agent,
    which launchd gives no XDG_* variable, would serve in ~/.local/state: told where."""
    assert main(["plugin", "install"]) == 0
    capsys.readouterr()
    monkeypatch.delenv("XDG_RUNTIME_DIR")  # a later shell, as the agent's
    plist, _, err = printed(capsys, "--url", "http://127.0.0.1:4100")
    socket = home / "run" / "opencode-loop-monitor" / "plugin-4100.sock"
    assert flag(plist["ProgramArguments"], "--plugin-socket") == str(socket)
    assert err == ""


def test_a_plugin_asking_over_tcp_gets_an_agent_serving_tcp(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = home / "token"
    assert main(["plugin", "install", "--plugin-addr", "127.0.0.1:9465", "--plugin-token-file",
                 str(token)]) == 0  # fmt: skip
    capsys.readouterr()
    plist, _, _ = printed(capsys)
    argv = plist["ProgramArguments"]
    assert (flag(argv, "--plugin-addr"), flag(argv, "--plugin-token-file")) == (
        "127.0.0.1:9465",
        str(token),
    )
    assert "--plugin-socket" not in argv


def test_no_plugin_installed_is_said_and_the_agent_serves_where_install_will_point(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plist, _, err = printed(capsys)
    socket = home / "run" / "opencode-loop-monitor" / "plugin-4096.sock"
    assert flag(plist["ProgramArguments"], "--plugin-socket") == str(socket)
    plugin = home / ".config" / "opencode" / "plugins" / "opencode-loop-monitor.ts"
    assert err == (
        f"opencode-loop-monitor unit: warning: no plugin installed at {plugin}: run "
        "`opencode-loop-monitor plugin install` (then restart OpenCode); it will ask where "
        "this agent serves\n"
    )
    main(["plugin", "install"])
    out = capsys.readouterr().out
    assert f"at {socket.parent}/plugin-PORT.sock" in out


def test_the_agent_names_a_password_file_never_the_password(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    main(["plugin", "install"])
    capsys.readouterr()
    password = home / "password"
    password.write_text("s3cret-pw\n")
    password.chmod(0o644)
    monkeypatch.chdir(home)
    plist, text, err = printed(capsys, "--password-file", "password")
    # Made whole: launchd starts the agent in /.
    assert flag(plist["ProgramArguments"], "--password-file") == str(password)
    assert "s3cret-pw" not in text + err
    assert err == (
        "opencode-loop-monitor unit: warning: password_file password is readable by every "
        "user (chmod o-r)\n"
    )


def test_a_password_only_in_the_shell_is_warned_about(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    main(["plugin", "install"])
    capsys.readouterr()
    monkeypatch.setenv(SERVER_PASSWORD_VAR, "s3cret-pw")
    plist, text, err = printed(capsys)
    assert "--password-file" not in plist["ProgramArguments"]
    assert "s3cret-pw" not in text + err
    assert err == (
        f"opencode-loop-monitor unit: warning: {SERVER_PASSWORD_VAR} is set in this shell, but "
        "launchd gives the agent none of its variables: write the password to a file only you "
        "can read (chmod 600) and run `unit --launchd --password-file FILE` (the plist names the "
        "file, never the password)\n"
    )


def test_a_command_that_does_not_run_as_launchd_runs_it_is_warned_about(home: Path) -> None:
    """macOS's own python3 (3.9) cannot import the monitor: a venv made with it, or a venv
    whose Python was removed, gives an agent that exits at once, again and again."""
    environment = agent_environment(home, os.environ)
    assert environment["PATH"] == "/usr/bin:/bin:/usr/sbin:/sbin"
    assert not any(name.startswith("XDG_") for name in environment)
    assert check_command([str(CONSOLE_SCRIPT)], environment) is None
    old = home / "opencode-loop-monitor"
    old.write_text(
        "#!/bin/sh\necho 'SyntaxError: match statements need Python 3.10 or later' >&2\nexit 1\n"
    )
    old.chmod(0o755)
    warning = check_command([str(old)], environment)
    assert warning is not None
    assert warning.startswith(
        "the agent's command does not run as launchd would run it (SyntaxError: match "
        "statements need Python 3.10 or later): the monitor needs Python 3.11 or later"
    )
    assert check_command([str(home / "gone" / "python3"), "-m", "monitor"], environment)


def test_a_socket_path_too_long_for_macos_is_warned_about(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = home / "d" / "plugin.sock"
    long = long.parent.with_name("d" * (105 - len(str(long)) + 1)) / long.name
    assert len(str(long)) == 105  # under Linux's 107 bytes, over macOS's 103
    assert main(["plugin", "install", "--plugin-socket", str(long)]) == 0
    capsys.readouterr()
    plist, _, err = printed(capsys)
    assert flag(plist["ProgramArguments"], "--plugin-socket") == str(long)
    assert err.startswith(f"opencode-loop-monitor unit: warning: plugin socket {long}: longer ")


def test_the_docs_install_the_agent_unit_prints_without_a_placeholder_password():
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    macos = operations.split("## macOS: a launchd agent", 1)[1].split("\n## ", 1)[0]
    assert "opencode-loop-monitor unit --launchd >" in macos
    assert "launchctl bootstrap gui/" in macos
    assert "Python 3.11" in macos
    # Issue 45: a step wrote a placeholder password the reader then had to replace.
    assert "the-server-password" not in macos and "printf" not in macos
    assert "sed " not in macos  # nothing to edit by hand
