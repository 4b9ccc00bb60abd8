"""The macOS launchd agent: a well-formed plist that runs what the systemd unit runs."""

from __future__ import annotations

import plistlib
import shlex
from pathlib import Path

from tests.units import AGENT, SERVICE, load, value

ROOT = Path(__file__).resolve().parent.parent
# What differs, and only that: systemd hands the password over as a credential.
SYSTEMD_PASSWORD = "${CREDENTIALS_DIRECTORY}/opencode-password"
AGENT_PASSWORD = "/Users/USER/.config/opencode-loop-monitor/password"


def agent() -> dict[str, object]:
    with AGENT.open("rb") as stream:
        return plistlib.load(stream)


def test_the_agent_runs_the_units_command():
    unit_command = shlex.split(value(load(SERVICE), "Service", "ExecStart"))
    expected = [AGENT_PASSWORD if arg == SYSTEMD_PASSWORD else arg for arg in unit_command]
    assert agent()["ProgramArguments"] == expected
    assert SYSTEMD_PASSWORD in unit_command


def test_the_agent_restarts_on_failure_and_logs_unbuffered():
    plist = agent()
    assert plist["Label"] == AGENT.name.removesuffix(".plist")
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["EnvironmentVariables"] == {"PYTHONUNBUFFERED": "1"}
    assert plist["Umask"] == 0o077
    # launchd expands nothing: every path is absolute, with the one placeholder the docs name.
    paths = [plist["StandardOutPath"], plist["StandardErrorPath"], AGENT_PASSWORD]
    assert all(str(path).startswith("/Users/USER/") for path in paths)


def test_the_docs_install_the_agent_they_ship():
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "launchd/dev.opencode-loop-monitor.plist" in operations
    assert "launchctl bootstrap gui/" in operations and "/Users/USER" in operations
