"""The systemd units: the settings the daemon relies on, and systemd's own verdict on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.config import SERVER_PASSWORD_VAR, STATUS_ADDRESS
from tests.units import (
    INSTALLED_BINARY,
    SERVICE,
    TCP_DROP_IN,
    TEMPLATE,
    USER_UNIT,
    load,
    parse_unit,
    value,
    values,
)

both_units = pytest.mark.parametrize("path", [SERVICE, TEMPLATE], ids=["service", "template"])


def test_parse_unit_joins_continuations_and_keeps_repeats() -> None:
    unit = parse_unit(
        "# comment\n[Service]\nExecStart=/bin/a \\\n    --b \\\n  c\nX=1\n; other\nX=\n"
    )
    assert unit == {"Service": [("ExecStart", "/bin/a --b c"), ("X", "1"), ("X", "")]}


@both_units
def test_notify_watchdog_and_restart_policy(path: Path) -> None:
    unit = load(path)
    assert value(unit, "Service", "Type") == "notify"
    # Only the daemon itself may report readiness; nothing it might spawn.
    assert value(unit, "Service", "NotifyAccess") == "main"
    assert value(unit, "Service", "WatchdogSec") == "30s"
    assert value(unit, "Service", "Restart") == "on-failure"
    # 78 is the daemon's configuration error (bad settings, 401): restarting cannot help.
    assert "78" in value(unit, "Service", "RestartPreventExitStatus").split()


@both_units
def test_open_file_limit_is_raised_well_above_the_connection_caps(path: Path) -> None:
    from monitor.shell import decide, metrics_server

    # systemd's default (1024) is what a flood of idle metrics connections exhausted; the
    # plugin endpoint's cap stays below it too, for a monitor started by hand (issue 25).
    caps = metrics_server.MAX_CONNECTIONS + decide.MAX_CONNECTIONS
    assert int(value(load(path), "Service", "LimitNOFILE")) >= 8 * 1024 > 16 * caps
    assert 4 * caps < 1024


@both_units
def test_runs_unprivileged_and_confined(path: Path) -> None:
    unit = load(path)
    expected = {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes",
        "RestrictRealtime": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
    }
    assert {key: value(unit, "Service", key) for key in expected} == expected
    assert values(unit, "Service", "SystemCallFilter")[0] == "@system-service"
    # AF_UNIX for $NOTIFY_SOCKET, AF_INET/AF_INET6 for the server; nothing else.
    families = value(unit, "Service", "RestrictAddressFamilies").split()
    assert sorted(families) == ["AF_INET", "AF_INET6", "AF_UNIX"]


@both_units
def test_password_comes_from_a_credential(path: Path) -> None:
    unit = load(path)
    credential_id, _, source = value(unit, "Service", "LoadCredential").partition(":")
    assert source.startswith("/etc/opencode-loop-monitor/")
    exec_start = value(unit, "Service", "ExecStart")
    assert f"--password-file ${{CREDENTIALS_DIRECTORY}}/{credential_id}" in exec_start


@both_units
def test_recordings_have_a_private_state_directory(path: Path) -> None:
    unit = load(path)
    assert value(unit, "Service", "StateDirectory") == "opencode-loop-monitor"
    assert value(unit, "Service", "StateDirectoryMode") == "0700"


@pytest.mark.parametrize(
    ("path", "folder"),
    [
        (SERVICE, "opencode-loop-monitor"),
        # Each instance its own: systemd removes a runtime folder when its unit stops.
        (TEMPLATE, "opencode-loop-monitor/%i"),
        # Under $XDG_RUNTIME_DIR: where `plugin install` in the person's shell points.
        (USER_UNIT, "opencode-loop-monitor"),
    ],
    ids=["service", "template", "user"],
)
def test_plugin_socket_goes_to_a_private_runtime_directory(path: Path, folder: str) -> None:
    # The daemon refuses a socket folder open to others (monitor.shell.decide.private_dir).
    unit = load(path)
    assert value(unit, "Service", "RuntimeDirectory") == folder
    assert value(unit, "Service", "RuntimeDirectoryMode") == "0700"


def test_user_unit_runs_the_system_units_command_and_policy() -> None:
    user, system = load(USER_UNIT), load(SERVICE)
    # The same command, without the credential (a person's own server usually has no
    # password, OpenCode 2's service registers its own), serving /status where `status` asks
    # (issue 45: it answered nothing there), and with no --url: the person's own server is
    # found (OpenCode 2's background service, else 4096; the system unit's has no person).
    assert value(user, "Service", "ExecStart") == value(system, "Service", "ExecStart").replace(
        " --password-file ${CREDENTIALS_DIRECTORY}/opencode-password",
        f" --metrics-addr {STATUS_ADDRESS}",
    ).replace(" --url http://127.0.0.1:4096", "")
    for key in ("Type", "NotifyAccess", "WatchdogSec", "Restart", "RestartPreventExitStatus"):
        assert value(user, "Service", key) == value(system, "Service", key), key
    assert value(user, "Service", "EnvironmentFile") == (
        "-%h/.config/opencode-loop-monitor/monitor.env"
    )
    assert value(user, "Install", "WantedBy") == "default.target"


def test_tcp_drop_in_hands_the_token_over_as_a_credential() -> None:
    drop_in = load(TCP_DROP_IN)
    name, _, source = value(drop_in, "Service", "LoadCredential").partition(":")
    assert source == "/etc/opencode-loop-monitor/plugin-token"
    assert values(drop_in, "Service", "Environment") == [
        "OPENCODE_LOOP_MONITOR_PLUGIN_ADDR=127.0.0.1:9465",
        f"OPENCODE_LOOP_MONITOR_PLUGIN_TOKEN_FILE=%d/{name}",
    ]


@both_units
def test_exec_start_watches_and_logs_json(path: Path) -> None:
    argv = value(load(path), "Service", "ExecStart").split()
    assert argv[:2] == [INSTALLED_BINARY, "watch"]
    assert argv[argv.index("--log-format") + 1] == "json"


def test_service_watches_the_default_server() -> None:
    argv = value(load(SERVICE), "Service", "ExecStart").split()
    assert argv[argv.index("--url") + 1] == "http://127.0.0.1:4096"
    # Optional overrides; "-" means a missing file is fine.
    assert (
        value(load(SERVICE), "Service", "EnvironmentFile")
        == "-/etc/opencode-loop-monitor/monitor.env"
    )


def test_template_instance_selects_the_server() -> None:
    unit = load(TEMPLATE)
    # Required (no "-"): without it the instance would quietly watch the default URL.
    assert value(unit, "Service", "EnvironmentFile") == "/etc/opencode-loop-monitor/%i.env"
    assert (
        value(unit, "Service", "LoadCredential")
        == "opencode-password:/etc/opencode-loop-monitor/%i.password"
    )
    assert "--url" not in value(unit, "Service", "ExecStart").split()
    assert "%i" in value(unit, "Unit", "Description")


def test_template_differs_from_service_only_per_instance() -> None:
    # The template is a copy; this keeps a hardening change from reaching only one of them.
    per_instance = {
        "Description",
        "ExecStart",
        "LoadCredential",
        "EnvironmentFile",
        "SyslogIdentifier",
        "RuntimeDirectory",
    }
    service, template = load(SERVICE), load(TEMPLATE)
    assert service.keys() == template.keys()
    for section in service:
        assert [kv for kv in service[section] if kv[0] not in per_instance] == [
            kv for kv in template[section] if kv[0] not in per_instance
        ], section


# systemd's own check. Skipped only where the tool is missing; .ci/run installs it.

systemd_analyze = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    systemd_analyze is None, reason="systemd-analyze not installed (Debian package 'systemd')"
)


def verify_problems(unit_dir: Path, unit_name: str, *options: str, **env: str) -> list[str]:
    """What ``systemd-analyze verify`` says is wrong with our unit.

    verify exits 0 on most mistakes (an unknown key, an unparsable value) and only
    prints "file:line: ..., ignoring", so the output is what counts. Lines that do not
    name our unit come from the environment (other units on the machine, no running
    systemd in a container) and are left out.
    """
    assert systemd_analyze is not None
    result = subprocess.run(
        [systemd_analyze, *options, "verify", "--man=no", str(unit_dir / unit_name)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = (result.stdout + result.stderr).splitlines()
    problems = [line for line in lines if "opencode-loop-monitor" in line]
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}")
    return problems


def installable_copy(unit: Path, into: Path) -> Path:
    """The unit, unchanged but for ExecStart pointing at an executable that exists here.

    verify insists that the binary exists, and nothing is installed under /opt on a
    test machine. The interpreter stands in for the console script it would run.
    """
    text = unit.read_text()
    assert text.count(INSTALLED_BINARY) == 1
    copy = into / unit.name
    copy.write_text(text.replace(INSTALLED_BINARY, sys.executable))
    return copy


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("unit", "name"),
    [(SERVICE, SERVICE.name), (TEMPLATE, "opencode-loop-monitor@server1.service")],
    ids=["service", "template-instance"],
)
def test_systemd_analyze_verify(unit: Path, name: str, tmp_path: Path) -> None:
    # The template is verified as an instance so that %i is expanded as systemd would.
    installable_copy(unit, tmp_path)
    assert verify_problems(tmp_path, name) == []


@needs_systemd_analyze
def test_systemd_analyze_verify_user_unit(tmp_path: Path) -> None:
    # A user manager needs $XDG_RUNTIME_DIR, as the one of a login has.
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    installable_copy(USER_UNIT, tmp_path)
    assert verify_problems(tmp_path, USER_UNIT.name, "--user", XDG_RUNTIME_DIR=str(runtime)) == []


@needs_systemd_analyze
def test_systemd_analyze_verify_with_the_tcp_drop_in(tmp_path: Path) -> None:
    installable_copy(SERVICE, tmp_path)
    drop_ins = tmp_path / f"{SERVICE.name}.d"
    drop_ins.mkdir()
    copy = drop_ins / TCP_DROP_IN.name
    copy.write_text(TCP_DROP_IN.read_text())
    # systemd reads drop-ins from its unit path, not beside the file it is given.
    path = {"SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    assert verify_problems(tmp_path, SERVICE.name, **path) == []
    # And it does read this one: a bad specifier in it is reported.
    copy.write_text(TCP_DROP_IN.read_text().replace("%d/", "%Q/"))
    assert any(
        "plugin-over-tcp.conf" in line for line in verify_problems(tmp_path, SERVICE.name, **path)
    )


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("setting", "broken", "reported"),
    [
        ("Type=notify", "Type=notfy", "notfy"),
        ("ProtectHome=yes", "ProtectHom=yes", "ProtectHom"),
        ("RestrictAddressFamilies=AF_UNIX", "RestrictAddressFamilies=AF_UNIKS", "AF_UNIKS"),
    ],
)
def test_verify_reports_a_broken_setting(
    setting: str, broken: str, reported: str, tmp_path: Path
) -> None:
    # Guards the filter above: if a systemd release changed its wording so that real
    # errors were dropped as noise, test_systemd_analyze_verify would pass vacuously.
    copy = installable_copy(SERVICE, tmp_path)
    copy.write_text(copy.read_text().replace(setting, broken, 1))
    problems = verify_problems(tmp_path, SERVICE.name)
    assert any(reported in line for line in problems), problems


# `opencode-loop-monitor unit`: the user unit for the install that runs it (issue 32: the
# shipped unit names /opt, which the README's install into a clone's .venv does not give).


def printed_unit(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    from monitor.cli import main

    assert main(["unit", *args]) == 0
    return capsys.readouterr().out


def test_the_shipped_user_unit_is_the_printed_one_for_the_opt_install() -> None:
    from monitor.shell.unit import INSTALLED_BINARY as UNIT_BINARY
    from monitor.shell.unit import render

    assert UNIT_BINARY == INSTALLED_BINARY
    assert USER_UNIT.read_text() == render([INSTALLED_BINARY])


def test_the_printed_unit_runs_the_console_script_of_this_install(
    capsys: pytest.CaptureFixture[str],
) -> None:
    unit = parse_unit(printed_unit(capsys))
    argv = value(unit, "Service", "ExecStart").split()
    # The venv the README's commands make (here: the one running the tests).
    assert argv[0] == str(Path(sys.executable).parent / "opencode-loop-monitor")
    assert os.access(argv[0], os.X_OK)
    assert argv[1:] == [
        "watch",
        "--metrics-addr",
        "127.0.0.1:9464",
        "--log-format",
        "json",
    ]
    # Nothing else differs from the shipped unit.
    shipped = load(USER_UNIT)
    assert {k: v for k, v in unit.items() if k != "Service"} == {
        k: v for k, v in shipped.items() if k != "Service"
    }
    assert [kv for kv in unit["Service"] if kv[0] != "ExecStart"] == [
        kv for kv in shipped["Service"] if kv[0] != "ExecStart"
    ]


def test_the_printed_unit_watches_the_url_given_as_one_word(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from monitor.shell.unit import render

    argv = value(
        parse_unit(printed_unit(capsys, "--url", "http://[::1]:5000")), "Service", "ExecStart"
    )
    assert argv.split()[2:4] == ["--url", "http://[::1]:5000"]
    # systemd's specifiers and variables are escaped, and a path with a space is quoted.
    text = render(["/home/a b/%x/$HOME/bin/opencode-loop-monitor"], "http://127.0.0.1:4096")
    assert 'ExecStart="/home/a b/%%x/$$HOME/bin/opencode-loop-monitor" watch' in text


@needs_systemd_analyze
def test_systemd_analyze_verify_passes_on_the_printed_unit_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    (tmp_path / USER_UNIT.name).write_text(printed_unit(capsys))
    assert verify_problems(tmp_path, USER_UNIT.name, "--user", XDG_RUNTIME_DIR=str(runtime)) == []


def test_the_printed_unit_names_a_password_file_never_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret-pw\n")
    password.chmod(0o600)
    monkeypatch.chdir(tmp_path)
    text = printed_unit(capsys, "--password-file", "password")  # made whole: systemd runs in /
    argv = value(parse_unit(text), "Service", "ExecStart").split()
    assert argv[argv.index("--password-file") + 1] == str(password)
    assert "s3cret-pw" not in text


def test_a_password_only_in_the_shell_is_warned_about(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit's service does not inherit the shell's variables: a server password set only
    there would be a 401 at the service's start (exit 78)."""
    from monitor.cli import main

    monkeypatch.setenv(SERVER_PASSWORD_VAR, "s3cret-pw")
    assert main(["unit"]) == 0
    captured = capsys.readouterr()
    assert "s3cret-pw" not in captured.out + captured.err
    assert captured.err == (
        f"opencode-loop-monitor unit: warning: {SERVER_PASSWORD_VAR} is set in this shell, but "
        f"the unit's service does not inherit it: put {SERVER_PASSWORD_VAR}=... in "
        "~/.config/opencode-loop-monitor/monitor.env (chmod 600), or run `unit --password-file "
        "FILE`\n"
    )
