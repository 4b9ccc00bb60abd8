"""The command line: given these arguments and this environment, this output and exit status."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from monitor import __version__
from monitor.cli import COMMANDS, main
from monitor.config import (
    SERVER_PASSWORD_VAR,
    SETTINGS_BY_NAME,
    STATUS_ADDRESS,
    Group,
    Settings,
    settings_for,
)
from monitor.core.limits import DetectionError
from monitor.errors import (
    ConfigError,
    CredentialsRefused,
    InputError,
    Refused,
    ServerAway,
    SessionGone,
)
from monitor.exits import EX_CONFIG
from monitor.kit.sandbox import SandboxError

REPO = Path(__file__).resolve().parent.parent
SECRET = "hunter2-Zq9!secret"
WATCH = next(command for command in COMMANDS if command.name == "watch")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() reads os.environ; the developer's or CI's own settings must not leak in.
    for name in list(os.environ):
        if name.startswith("OPENCODE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def run_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[Callable[[Settings], int]], list[Settings]]:
    """Replace monitor.shell.watch with a fake run_watch; returns the settings it got."""

    def install(behaviour: Callable[[Settings], int]) -> list[Settings]:
        calls: list[Settings] = []

        def fake(settings: Settings) -> int:
            calls.append(settings)
            return behaviour(settings)

        monkeypatch.setitem(
            sys.modules, "monitor.shell.watch", types.SimpleNamespace(run_watch=fake)
        )
        return calls

    return install


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"opencode-loop-monitor {__version__}\n"


def test_help_explains_the_tool_and_lists_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "opencode serve" in out
    for command in COMMANDS:
        assert command.name in out and command.summary in out


def test_watch_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for setting in settings_for(WATCH.uses):
        assert setting.flag in out
        assert f"env {setting.env_var}; default: {setting.default_text}" in out
    assert "--no-dry-run" in out


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_watch_gets_the_settings_and_its_status_is_returned(
    run_watch, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = run_watch(lambda settings: 3)
    monkeypatch.setenv("OPENCODE_LOOP_MONITOR_REPEATS", "2")
    assert (
        main(
            [
                "watch",
                "--max-period",
                "5",
                "--ignore-tool",
                "todowrite",
                "--ignore-tool",
                "question",
            ]
        )
        == 3
    )
    [settings] = calls
    assert (settings.max_period, settings.repeats) == (5, 2)
    assert settings.ignore_tool == frozenset({"todowrite", "question"})


def test_interrupt_exits_130_quietly(run_watch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(settings: Settings) -> int:
        raise KeyboardInterrupt

    run_watch(interrupted)
    assert main(["watch"]) == 130
    assert capsys.readouterr().err == ""


def test_config_error_while_running_exits_78(run_watch, capsys: pytest.CaptureFixture[str]) -> None:
    def rejected(settings: Settings) -> int:
        raise ConfigError("server rejected the credentials for user opencode")

    run_watch(rejected)
    assert main(["watch"]) == EX_CONFIG
    assert capsys.readouterr().err == (
        "opencode-loop-monitor: config error: server rejected the credentials for user opencode\n"
    )


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (
            CredentialsRefused("GET /path", "check the password"),
            78,
            "config error: GET /path: check the password",
        ),
        (InputError("r.sse: not a recording"), 2, "input error: r.sse: not a recording"),
        (
            ServerAway("POST /session/ses_1/abort: ClientOSError"),
            69,
            "server error: POST /session/ses_1/abort: ClientOSError",
        ),
        (
            SessionGone("GET /session/ses_1: not found (404)"),
            69,
            "server error: GET /session/ses_1: not found (404)",
        ),
        (Refused("GET /path: refused (403)", 403), 69, "server error: GET /path: refused (403)"),
        (
            DetectionError("history", 8, 40, (("max_period", 10), ("repeats", 4)), "to see"),
            78,
            "config error: history must be at least 40 = max_period 10 * repeats 4 to see, not 8",
        ),
        (SandboxError("server was never started"), 1, "error: server was never started"),
    ],
)
def test_each_kind_of_error_ends_the_command_in_one_line_with_its_status(
    run_watch, capsys: pytest.CaptureFixture[str], error: Exception, status: int, line: str
) -> None:
    # Issue 30: a ServerError that reached the command line ended it with a traceback.
    def failing(settings: Settings) -> int:
        raise error

    run_watch(failing)
    assert main(["watch"]) == status
    assert capsys.readouterr().err == f"opencode-loop-monitor: {line}\n"


# (setting, value as text, part of the message) — each is tried as a flag, a variable and a
# TOML string, and must stop the monitor with one line naming the setting and the source.
BAD_VALUES = [
    (
        "url",
        "ftp://example.com",
        'expected an http:// or https:// URL such as http://127.0.0.1:4096, got "ftp://example.com"',
    ),
    ("url", "http://", 'got "http://"'),
    ("url", "http://host:99999", 'got "http://host:99999"'),
    ("url", "http://host/?x=1", "without ?query or #fragment"),
    ("max_period", "abc", 'expected an integer from 1 to 10, got "abc"'),
    ("max_period", "0", 'expected an integer from 1 to 10, got "0"'),
    ("max_period", "11", 'expected an integer from 1 to 10, got "11"'),
    ("repeats", "1", 'expected an integer >= 2, got "1"'),
    ("history", "3", 'expected an integer >= 4, got "3"'),
    ("history", "8", "must be at least 30 = max_period 10 (default) * repeats 3 (default)"),
    ("match", "output", 'expected one of input, input+output, got "output"'),
    (
        "ignore_tool",
        "two words",
        'expected a tool name such as todowrite, got "two words"',
    ),
    ("ignore_arg", "bash", 'expected TOOL.KEY such as bash.description, got "bash"'),
    ("ignore_arg", ".description", 'got ".description"'),
    ("ignore_arg", "bash.", 'got "bash."'),
    ("dry_run", "maybe", "expected true or false"),
    ("on_loop", "retry", 'expected one of resume, hold, got "retry"'),
    ("max_interventions", "-1", 'expected an integer >= 0, got "-1"'),
    ("log_format", "xml", 'expected one of auto, json, console, got "xml"'),
    ("log_level", "trace", 'expected one of debug, info, warning, error, got "trace"'),
    (
        "metrics_addr",
        "9464",
        'expected HOST:PORT with a port from 0 to 65535, such as 127.0.0.1:9464, got "9464"',
    ),
    ("metrics_addr", "localhost:65536", 'got "localhost:65536"'),
    ("metrics_addr", "::1:9464", 'got "::1:9464"'),
]


def _numeric(name: str) -> bool:
    try:
        return type(SETTINGS_BY_NAME[name].parse("5")) is int
    except ValueError:
        return False


def _given_as(
    source: str, name: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], str]:
    """Put the value in `source`; return the argv to run and the source's label in errors."""
    setting = SETTINGS_BY_NAME[name]
    if source == "flag":
        return ["watch", setting.flag, text], setting.flag
    if source == "env":
        monkeypatch.setenv(setting.env_var, text)
        return ["watch"], setting.env_var
    path = tmp_path / "monitor.toml"
    value: object = [text] if setting.repeatable else text
    if _numeric(name) and text.lstrip("-").isdigit():
        value = int(text)  # a TOML number: a quoted one is an error of its own
    path.write_text(f"{name} = {json.dumps(value)}\n", encoding="utf-8")
    return ["watch", "--config", str(path)], str(path)


BAD_VALUE_CASES = [
    (source, *case)
    for case in BAD_VALUES
    for source in ("flag", "env", "file")
    if not (source == "flag" and SETTINGS_BY_NAME[case[0]].is_switch)  # --dry-run takes no value
]


@pytest.mark.parametrize(("source", "name", "text", "expected"), BAD_VALUE_CASES)
def test_bad_value_names_setting_and_source_and_exits_78(
    source: str,
    name: str,
    text: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, label = _given_as(source, name, text, tmp_path, monkeypatch)
    assert main(argv) == EX_CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"opencode-loop-monitor: config error: {name} in {label}: ")
    if source == "file" and _numeric(name) and text.lstrip("-").isdigit():
        expected = expected.replace(f'"{text}"', text)  # written as a TOML number
    assert expected in err
    assert err.count("\n") == 1 and err.endswith("\n")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "config in --config: cannot read {path}: No such file or directory"),
        ("max_period = = 4\n", "config in --config: {path} is not valid TOML: "),
        (
            "max_perod = 4\n",
            "max_perod in {path}: unknown key (did you mean max_period?)",
        ),
    ],
)
def test_config_file_problems_exit_78(
    content: str | None,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "monitor.toml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["watch", "--config", str(path)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("opencode-loop-monitor: config error: " + expected.format(path=path))
    assert err.count("\n") == 1


# --- the password stays secret -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["watch", "--help"],
        ["watch", "--max-period", "abc"],
        ["watch", "--url", f"http://opencode:{SECRET}@127.0.0.1:4096"],
        ["watch", "--password-file", "/nonexistent/password"],
    ],
)
def test_password_never_printed(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(SERVER_PASSWORD_VAR, SECRET)
    main(argv)
    captured = capsys.readouterr()
    assert captured.out or captured.err  # something was printed, and it holds no secret
    assert SECRET not in captured.out + captured.err


def test_password_file_content_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "password"
    path.write_bytes(b"\n" + SECRET.encode())  # empty first line: rejected
    assert main(["watch", "--password-file", str(path)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert str(path) in err and SECRET not in err


def test_python_dash_m_monitor_help_runs() -> None:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("OPENCODE_")
    }
    result = subprocess.run(
        [sys.executable, "-m", "monitor", "--help"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "watch" in result.stdout


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_each_command_help_shows_its_description_and_exit_statuses(command, capsys):
    [spec] = [c for c in COMMANDS if c.name == command]
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert spec.description.splitlines()[0] in out  # kept as written, not rewrapped
    assert spec.epilog.splitlines()[0] in out and "exit status" in spec.epilog


def options_in(help_text: str) -> set[str]:
    """The flags a --help lists as options (not those its prose mentions)."""
    found: set[str] = set()
    for line in help_text.splitlines():
        # An option's line starts at column 2 with its flags; prose and wrapped help do not.
        if re.match(r"^  -", line):
            found.update(re.findall(r"--[\w-]+", re.split(r"\s{2,}", line.strip())[0]))
    return found


def setting_flags(*names: str) -> set[str]:
    flags = set()
    for setting in settings_for(()) + tuple(SETTINGS_BY_NAME[name] for name in names):
        flags.add(setting.flag)
        if setting.is_switch:
            flags.add("--no-" + setting.flag[2:])
    return flags


def group_flags(*groups: Group) -> set[str]:
    return setting_flags(*(s.name for s in settings_for(groups)))


# Issue 32: `plugin install --help` listed --directory and --api (the flags of `plugin`),
# `status --help` offered --record FILE. Each command's own flags, written out.
OWN_FLAGS: dict[tuple[str, ...], set[str]] = {
    ("watch",): group_flags(*Group),
    ("attach",): group_flags(Group.CONNECTION, Group.DETECTION, Group.ACTION, Group.LOGGING),
    ("replay",): group_flags(Group.DETECTION) | {"--fail-on-detect"},
    ("evaluate",): group_flags(Group.DETECTION) | {"--cache"},
    ("demo",): group_flags(Group.DETECTION, Group.ACTION, Group.LOGGING)
    | {"--cache-dir", "--plugin", "--opencode"},
    ("model",): setting_flags() | {"--port", "--opencode"},
    ("status",): setting_flags("metrics_addr") | {"--json"},
    ("unit",): setting_flags("url", "password_file", "metrics_addr") | {"--launchd"},
    ("plugin",): set(),
    # --url: the documented flag of earlier releases, taken with a note (issue 45).
    ("plugin", "install"): group_flags(Group.PLUGIN) | {"--project", "--url"},
    ("plugin", "uninstall"): setting_flags() | {"--project"},
    ("plugin", "status"): setting_flags("url") | group_flags(Group.PLUGIN) | {"--project"},
}


def test_every_command_is_in_the_table_of_its_own_flags() -> None:
    paths = {(c.name,) for c in COMMANDS}
    paths |= {(c.name, sub.name) for c in COMMANDS for sub in c.subcommands}
    assert paths == set(OWN_FLAGS)


@pytest.mark.parametrize("path", list(OWN_FLAGS), ids=" ".join)
def test_each_commands_help_lists_only_its_own_flags(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*path, "--help"]) == 0
    assert options_in(capsys.readouterr().out) == OWN_FLAGS[path] | {"--help"}


def test_the_flags_of_one_command_are_refused_by_another(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["status", "--record", "x.sse"]) == 2
    assert "unrecognized arguments: --record x.sse" in capsys.readouterr().err
    assert main(["plugin", "install", "--api", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: opencode-loop-monitor plugin install ")
    assert "unrecognized arguments: --api 2" in err


def prose_flags(description: str) -> set[str]:
    """The flags a description names as this command's: not those of another command or an
    example (in backticks, or on an indented line of commands)."""
    prose = "\n".join(line for line in description.splitlines() if not line.startswith("  "))
    return set(re.findall(r"--[a-z][\w-]*", re.sub(r"`[^`]*`", "", prose)))


def commands_and_actions() -> list[tuple[tuple[str, ...], str]]:
    found = [((c.name,), c.description) for c in COMMANDS if not c.subcommands]
    found += [((c.name, a.name), a.description) for c in COMMANDS for a in c.subcommands]
    return found


@pytest.mark.parametrize(("path", "description"), commands_and_actions(), ids=str)
def test_each_description_names_only_flags_its_command_takes(
    path: tuple[str, ...], description: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: `status --help` spoke of watch's --metrics-addr as its own flag line did."""
    assert main([*path, "--help"]) == 0
    assert prose_flags(description) <= options_in(capsys.readouterr().out)


def test_the_checks_of_descriptions_catch_a_flag_of_another_command() -> None:
    assert prose_flags("Asks on --metrics-addr, as `watch --record FILE` writes.") == {
        "--metrics-addr"
    }
    assert prose_flags("Install it with:\n  systemctl --user enable --now x") == set()


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", [(), ("watch",)], ids=["top", "watch"])
def test_the_help_names_the_plugins_in_band_refusal(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: the help said the monitor aborts the session or refuses a permission
    request; with the recommended set-up the plugin refuses the call in band."""
    assert main([*path, "--help"]) == 0
    out = one_line(capsys.readouterr().out)
    assert "`plugin install`" in out and "the recommended set-up" in out
    assert "the call that completes a loop is refused before it runs" in out or (
        "the call that completes the loop is refused before it runs" in out
    )
    assert "goes on in the same run" in out


def test_status_help_says_where_status_asks(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45: the description said it asks 127.0.0.1:9464, the flag line (watch's words)
    "serve Prometheus /metrics ... default: none"."""
    assert main(["status", "--help"]) == 0
    out = one_line(capsys.readouterr().out)
    setting = SETTINGS_BY_NAME["metrics_addr"]
    [flag_line] = re.findall(r"--metrics-addr HOST:PORT ([^]]*\])", out)
    assert flag_line == (
        "where the monitor serves /status: the HOST:PORT of its --metrics-addr "
        f"[env {setting.env_var}; default: {STATUS_ADDRESS}]"
    )
    assert "serve Prometheus" not in out
    assert f"on {STATUS_ADDRESS}, where this command asks" in out


def test_status_asks_the_address_its_help_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.shell import status

    asked = []

    def fetch(address: object, timeout: float = 0.0) -> dict[str, object]:
        asked.append(address)
        raise OSError("nothing there")

    monkeypatch.setattr(status, "fetch_status", fetch)
    assert main(["status"]) == 69
    assert asked == [STATUS_ADDRESS]


@pytest.fixture
def short_path() -> Iterator[Path]:
    # Short: a socket's path under it holds at most 107 bytes; pytest's tmp_path is long.
    with tempfile.TemporaryDirectory(prefix="olm-") as name:
        yield Path(name)


def test_plugin_install_takes_the_url_of_earlier_releases_with_a_note(
    short_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: `plugin install --url http://127.0.0.1:4096`, the README's command until this
    release, ended in a bare "unrecognized arguments" (rc 2)."""
    tmp_path = short_path
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    plugin = tmp_path / "config" / "opencode" / "plugins" / "opencode-loop-monitor.ts"
    assert main(["plugin", "install"]) == 0
    written = plugin.read_text()
    assert capsys.readouterr().err == ""
    assert main(["plugin", "install", "--url", "http://127.0.0.1:4096"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "opencode-loop-monitor plugin install: note: --url is no longer needed: the plugin "
        "finds the monitor of the server it runs in, whatever its port; accepted for scripts "
        "written for earlier releases, it names the server whose monitor is asked only where "
        "the plugin cannot learn its own server's URL\n"
    )
    assert captured.out.startswith(f"wrote {plugin}\n")
    assert plugin.read_text() == written  # the default server's URL: the same plugin


def test_each_plugin_action_help_shows_its_own_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    [plugin] = [c for c in COMMANDS if c.name == "plugin"]
    for action in plugin.subcommands:
        assert main(["plugin", action.name, "--help"]) == 0
        out = capsys.readouterr().out
        assert action.description.splitlines()[0] in out
        assert action.epilog.splitlines()[0] in out and "exit status" in action.epilog


# --- strict parsing ------------------------------------------------------------------------


def test_flags_are_never_abbreviated(run_watch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = run_watch(lambda settings: 0)
    assert main(["watch", "--rep", "4"]) == 2
    err = capsys.readouterr().err
    assert calls == []
    assert err.startswith("usage: opencode-loop-monitor watch ")
    assert err.endswith(
        "opencode-loop-monitor watch: error: unrecognized arguments: --rep 4"
        " (did you mean --repeats?)\n"
    )


def test_misspelled_command_gets_a_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wach", "--url", "http://127.0.0.1:4096"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: opencode-loop-monitor ")
    assert err.endswith(
        "error: unknown command 'wach' (did you mean watch?); the commands: watch, attach, "
        "replay, evaluate, demo, model, status, unit, plugin\n"
    )


def test_unknown_flag_gets_the_subcommands_usage_and_a_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["replay", "--fail-on-detection", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: opencode-loop-monitor replay ")
    assert "unrecognized arguments: --fail-on-detection (did you mean --fail-on-detect?)" in err


def test_unknown_variable_is_warned_about_and_ignored(
    run_watch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = run_watch(lambda settings: 0)
    monkeypatch.setenv("OPENCODE_LOOP_MONITOR_REPEAT", "5")
    monkeypatch.setenv("OPENCODE_LOOP_MONITOR_MAX_PERIOD", "3")
    assert main(["watch"]) == 0
    assert capsys.readouterr().err == (
        "opencode-loop-monitor: warning: OPENCODE_LOOP_MONITOR_REPEAT is not a setting and is "
        "ignored (did you mean OPENCODE_LOOP_MONITOR_REPEATS?)\n"
    )
    [settings] = calls
    assert (settings.repeats, settings.max_period) == (3, 3)


def test_every_exit_status_named_at_the_top_is_named_by_a_command() -> None:
    from monitor.cli import EPILOG

    for status in ("0", "78", "130"):
        assert f" {status} " in EPILOG
        assert all(f" {status} " in command.epilog.replace("\n", " ") for command in COMMANDS)


# Each command that takes detection settings, and the function of its own it runs.
RUNNERS = [
    (["watch"], "monitor.shell.watch", "run_watch"),
    (["replay", "trace.sse"], "monitor.shell.replay", "run_replay"),
    (["demo"], "monitor.kit.demo", "run_demo"),
]


@pytest.mark.parametrize(("argv", "module", "function"), RUNNERS)
def test_repeats_4_as_the_docs_suggest_runs_with_a_history_that_holds_it(
    argv: list[str], module: str, function: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[Settings] = []

    def fake(settings: Settings, *args: object, **kwargs: object) -> int:
        got.append(settings)
        return 0

    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{function: fake}))
    assert main([*argv, "--repeats", "4"]) == 0
    [settings] = got
    # max_period 10 * repeats 4: the longest loop fits.
    assert (settings.repeats, settings.history) == (4, 40)


def test_history_too_small_for_repeats_names_the_flag_and_the_fix(
    run_watch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = run_watch(lambda settings: 0)
    assert main(["watch", "--history", "8", "--repeats", "4"]) == EX_CONFIG
    assert calls == []
    assert capsys.readouterr().err == (
        "opencode-loop-monitor: config error: history in --history: must be at least 40 = "
        "max_period 10 (default) * repeats 4 (--repeats) so the longest loop fits, not 8; "
        "set --history 40 or more, or leave history unset to derive it\n"
    )
