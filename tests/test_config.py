"""The settings layer: given flags, environment and a TOML file, these settings or this error."""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from pathlib import Path
from typing import Any

import pytest

from monitor.config import (
    SERVER_PASSWORD_VAR,
    SERVER_USERNAME_VAR,
    SETTINGS,
    SETTINGS_BY_NAME,
    Group,
    ListenAddress,
    Settings,
    detection_of,
    guard_of,
    load_settings,
)
from monitor.errors import ConfigError
from monitor.service import Refusal, Registry, Service, read_service

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SECRET = "hunter2-Zq9!secret"


def load(
    tmp_path: Path,
    *,
    flags: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    toml: str | None = None,
    isatty: bool = False,
    uses: tuple[Group, ...] = tuple(Group),
) -> Settings:
    flags = dict(flags or {})
    if toml is not None:
        path = tmp_path / "monitor.toml"
        path.write_text(toml, encoding="utf-8")
        flags["config"] = str(path)
    return load_settings(flags, env or {}, isatty=isatty, uses=uses)


def load_error(tmp_path: Path, **sources: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, **sources)
    return str(caught.value)


# --- defaults and precedence -------------------------------------------------------------


def test_defaults_are_the_documented_ones(tmp_path: Path) -> None:
    settings = load(tmp_path)
    assert dataclasses.asdict(settings) == {
        "config": None,
        "url": "http://127.0.0.1:4096",
        "directory": None,
        "api": "auto",
        "remote_service": False,
        "password_file": None,
        "max_period": 10,
        "repeats": 3,
        "history": 32,
        "rules": "opencode",
        "profile": "opencode",
        "failure_repeats": 4,
        "wait_calls": 20,
        "match": "input",
        "ignore_tool": frozenset(),
        "ignore_arg": {},
        "text_repeats": 5,
        "text_steps": 8,
        "no_progress_runs": 5,
        "revisits": 12,
        "circles": 10,
        "runaway_updates": 20,
        "call_seconds": 0,
        "run_budget": {"steps": None, "tokens": None, "cost": None},
        "tree_budget": {"steps": None, "tokens": None, "cost": None},
        "tree_depth": 3,
        "tree_fanout": 20,
        "max_sessions": 10_000,
        "dry_run": False,
        "on_loop": "resume",
        "max_interventions": 2,
        "first_action": "block",
        "permissions": "gate",
        "permission_grace": 30,
        "log_format": "json",
        "log_level": "info",
        "record": None,
        "metrics_addr": None,
        "plugin_socket": "auto",
        "plugin_addr": None,
        "plugin_token_file": None,
        "notify_url": None,
        "username": "opencode",
        "password": None,
        "warnings": (),
        "service": None,  # no home in `env`: no registration to look for
    }


# (setting, flag value, env text, TOML line, which source should win)
PRECEDENCE = [
    ("max_period", "5", "6", "max_period = 7", "flag"),
    ("max_period", None, "6", "max_period = 7", "env"),
    ("max_period", None, None, "max_period = 7", "file"),
    ("max_period", None, None, None, "default"),
    ("ignore_tool", ["a"], "b,c", 'ignore_tool = ["d"]', "flag"),
    ("ignore_tool", None, "b,c", 'ignore_tool = ["d"]', "env"),
    ("ignore_tool", None, None, 'ignore_tool = ["d"]', "file"),
    ("ignore_tool", None, None, None, "default"),
    (
        "dry_run",
        False,
        "yes",
        "dry_run = true",
        "flag",
    ),  # --no-dry-run beats the others
    ("dry_run", None, "no", "dry_run = true", "env"),
    ("dry_run", None, None, "dry_run = true", "file"),
]
WINNERS = {
    "max_period": {"flag": 5, "env": 6, "file": 7, "default": 10},
    "ignore_tool": {
        "flag": frozenset({"a"}),
        "env": frozenset({"b", "c"}),
        "file": frozenset({"d"}),
        "default": frozenset(),
    },
    "dry_run": {"flag": False, "env": False, "file": True},
}


@pytest.mark.parametrize(("name", "flag", "env", "line", "winner"), PRECEDENCE)
def test_flag_beats_env_beats_file_beats_default(
    tmp_path: Path, name: str, flag: Any, env: str | None, line: str | None, winner: str
) -> None:
    setting = SETTINGS_BY_NAME[name]
    settings = load(
        tmp_path,
        flags={} if flag is None else {name: flag},
        env={} if env is None else {setting.env_var: env},
        toml=line,
    )
    assert getattr(settings, name) == WINNERS[name][winner]


@pytest.mark.parametrize("text", ["", "  "])
def test_empty_variable_counts_as_unset(tmp_path: Path, text: str) -> None:
    settings = load(tmp_path, env={"OPENCODE_LOOP_MONITOR_MAX_PERIOD": text}, toml="max_period = 7")
    assert settings.max_period == 7


def test_settings_of_unused_groups_keep_defaults(tmp_path: Path) -> None:
    # A shared environment or file may carry values meant for another subcommand.
    settings = load(
        tmp_path,
        env={"OPENCODE_LOOP_MONITOR_METRICS_ADDR": "not an address"},
        toml='record = "frames.jsonl"',
        uses=(Group.CONNECTION,),
    )
    assert (settings.metrics_addr, settings.record) == (None, None)


# --- values that parse -------------------------------------------------------------------

# (setting, text as in a flag or variable, parsed value)
PARSED = [
    ("url", "https://example.com:8443/opencode/", "https://example.com:8443/opencode"),
    ("url", " http://[::1]:4096 ", "http://[::1]:4096"),
    ("directory", "/srv/project", "/srv/project"),
    ("dry_run", "1", True),
    ("dry_run", "TRUE", True),
    ("dry_run", "Yes", True),
    ("dry_run", "0", False),
    ("dry_run", "false", False),
    ("dry_run", "NO", False),
    ("max_period", "1", 1),
    ("max_period", "10", 10),
    ("repeats", "2", 2),
    ("max_interventions", "0", 0),
    ("match", "input+output", "input+output"),
    ("on_loop", "hold", "hold"),
    ("log_level", "DEBUG", "debug"),
    ("ignore_tool", " todowrite , question,,", frozenset({"todowrite", "question"})),
    (
        "ignore_arg",
        "bash.description,bash.timeout,read.offset",
        {"bash": frozenset({"description", "timeout"}), "read": frozenset({"offset"})},
    ),
    ("metrics_addr", "127.0.0.1:9464", ListenAddress("127.0.0.1", 9464)),
    ("metrics_addr", "0.0.0.0:0", ListenAddress("0.0.0.0", 0)),
    ("metrics_addr", "[::1]:65535", ListenAddress("::1", 65535)),
    ("record", "/var/lib/monitor/frames.jsonl", Path("/var/lib/monitor/frames.jsonl")),
    ("text_repeats", "0", 0),
    ("text_repeats", "12", 12),
    ("text_steps", "2", 2),
]


@pytest.mark.parametrize(("name", "text", "expected"), PARSED)
def test_environment_values_parse(tmp_path: Path, name: str, text: str, expected: Any) -> None:
    settings = load(tmp_path, env={SETTINGS_BY_NAME[name].env_var: text})
    assert getattr(settings, name) == expected


def test_toml_values_use_toml_types(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        toml='max_period = 5\nrepeats = 2\ndry_run = true\nignore_arg = ["bash.description"]\n',
    )
    assert (settings.max_period, settings.repeats, settings.dry_run) == (5, 2, True)
    assert settings.ignore_arg == {"bash": frozenset({"description"})}


@pytest.mark.parametrize(
    ("explicit", "isatty", "expected"),
    [
        (None, True, "console"),
        (None, False, "json"),
        ("json", True, "json"),
        ("console", False, "console"),
    ],
)
def test_log_format_auto_follows_the_terminal(
    tmp_path: Path, explicit: str | None, isatty: bool, expected: str
) -> None:
    flags = {} if explicit is None else {"log_format": explicit}
    assert load(tmp_path, flags=flags, isatty=isatty).log_format == expected


# --- errors ------------------------------------------------------------------------------
# Every value rejected from every source is in tests/test_cli.py, through main().


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "max_period = true",
            "max_period in {path}: expected an integer from 1 to 10, got true",
        ),
        (
            "max_period = 4.0",
            "max_period in {path}: expected an integer from 1 to 10, got 4.0",
        ),
        (
            'ignore_tool = "todowrite"',
            'ignore_tool in {path}: expected a list such as ["a", "b"], got "todowrite"',
        ),
        (
            "ignore_tool = [1]",
            "ignore_tool in {path}: expected a tool name such as todowrite, got 1",
        ),
        (
            "max_perod = 4",
            "max_perod in {path}: unknown key (did you mean max_period?)",
        ),
        (
            "text_repeats = 1",
            "text_repeats in {path}: expected 0 (off) or an integer >= 2, got 1",
        ),
        ("config = 'other.toml'", "config in {path}: unknown key"),
        (
            "[monitor]\nmax_period = 4",
            "monitor in {path}: unknown key (a [monitor] table: the file has no tables, its "
            "keys go at the top level)",
        ),
    ],
)
def test_file_errors_name_key_and_file(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "monitor.toml"
    assert load_error(tmp_path, toml=line) == expected.format(path=path)


def test_bad_toml_syntax_names_the_file(tmp_path: Path) -> None:
    message = load_error(tmp_path, toml="max_period = \n")
    assert message.startswith(
        f"config in --config: {tmp_path / 'monitor.toml'} is not valid TOML: "
    )


def test_unreadable_file_names_the_file_and_where_it_was_given(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    message = load_error(tmp_path, env={"OPENCODE_LOOP_MONITOR_CONFIG": str(missing)})
    assert (
        message == f"config in OPENCODE_LOOP_MONITOR_CONFIG: cannot read {missing}: "
        "No such file or directory"
    )


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'directory = "/srv/caf\xe9"\n')
    message = load_error(tmp_path, flags={"config": str(path)})
    assert message == f"config in --config: {path} is not UTF-8 text"


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (
            {"flags": {"history": "8", "max_period": "4"}},
            "history in --history: must be at least 12 = max_period 4 (--max-period) * "
            "repeats 3 (default) so the longest loop fits, not 8; set --history 12 or more, "
            "or leave history unset to derive it",
        ),
        (
            {"flags": {"history": "12", "max_period": "4"}},
            "history in --history: must be at least 20 = wait_calls 20 (default) so a "
            "waiting loop can be counted, not 12; set --history 20 or more, or leave history "
            "unset to derive it",
        ),
        (
            {"flags": {"wait_calls": "40"}, "env": {"OPENCODE_LOOP_MONITOR_HISTORY": "32"}},
            "history in OPENCODE_LOOP_MONITOR_HISTORY: must be at least 40 = wait_calls 40 "
            "(--wait-calls) so a waiting loop can be counted, not 32; set "
            "OPENCODE_LOOP_MONITOR_HISTORY=40 or more, or leave history unset to derive it",
        ),
        (
            {"toml": "history = 16\nrepeats = 4\n"},
            "history in {path}: must be at least 40 = max_period 10 (default) * repeats 4 "
            "({path}) so the longest loop fits, not 16; set history = 40 in {path} or more, "
            "or leave history unset to derive it",
        ),
        (
            {"flags": {"rules": "seed", "history": "4"}},
            "history in --history: must be at least 12 = max_period 4 (rules = seed in "
            "--rules) * repeats 3 (rules = seed in --rules) so the longest loop fits, not 4; "
            "set --history 12 or more, or leave history unset to derive it",
        ),
    ],
)
def test_history_that_cannot_hold_the_rules_names_its_source_and_the_fix(
    tmp_path: Path, sources: dict[str, Any], expected: str
) -> None:
    expected = expected.replace("{path}", str(tmp_path / "monitor.toml"))
    assert load_error(tmp_path, **sources) == expected


@pytest.mark.parametrize(
    ("sources", "history"),
    [
        ({}, 32),  # the measured default: a derived history is never shorter
        ({"flags": {"repeats": "4"}}, 40),  # as the README and `demo --help` suggest
        ({"env": {"OPENCODE_LOOP_MONITOR_REPEATS": "4"}}, 40),
        ({"toml": "repeats = 5\nmax_period = 8\n"}, 40),
        ({"flags": {"wait_calls": "50"}}, 50),
        ({"flags": {"max_period": "4", "wait_calls": "0"}}, 32),
        ({"flags": {"rules": "seed"}}, 32),
    ],
)
def test_history_left_unset_is_derived_from_what_the_rules_need(
    tmp_path: Path, sources: dict[str, Any], history: int
) -> None:
    settings = load(tmp_path, **sources)
    assert settings.history == history
    assert detection_of(settings).history == guard_of(settings).history == history


def test_history_exactly_max_period_times_repeats_is_enough(tmp_path: Path) -> None:
    flags = {"history": "12", "max_period": "4", "wait_calls": "12"}
    assert load(tmp_path, flags=flags).history == 12


# --- credentials -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "env", "expected"),
    [
        (None, {}, ("opencode", None)),
        (
            None,
            {SERVER_PASSWORD_VAR: SECRET, SERVER_USERNAME_VAR: "alice"},
            ("alice", SECRET),
        ),
        (None, {SERVER_PASSWORD_VAR: ""}, ("opencode", None)),
        (f"{SECRET}\nsecond line\n", {}, ("opencode", SECRET)),
        (f"{SECRET}\r\n", {}, ("opencode", SECRET)),
        (
            f" {SECRET} ",
            {},
            ("opencode", f" {SECRET} "),
        ),  # only the line ending is removed
        (
            SECRET,
            {SERVER_PASSWORD_VAR: "from-env"},
            ("opencode", SECRET),
        ),  # the file wins
    ],
)
def test_credentials(
    tmp_path: Path,
    content: str | None,
    env: dict[str, str],
    expected: tuple[str, str | None],
) -> None:
    flags = {}
    if content is not None:
        path = tmp_path / "password"
        path.write_bytes(content.encode())
        flags["password_file"] = str(path)
    settings = load(tmp_path, flags=flags, env=env)
    assert (settings.username, settings.password) == expected


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            None,
            "password_file in --password-file: cannot read {path}: No such file or directory",
        ),
        (
            b"\n" + SECRET.encode(),
            "password_file in --password-file: the first line of {path} is empty",
        ),
        (
            b"\xff" + SECRET.encode(),
            "password_file in --password-file: {path} is not UTF-8 text",
        ),
    ],
)
def test_password_file_errors_name_the_path_not_the_content(
    tmp_path: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "password"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, flags={"password_file": str(path)})
    assert str(caught.value) == expected.format(path=path)
    # A chained decode error would carry the file's bytes into any printed traceback.
    printed = "".join(traceback.format_exception(caught.value))
    assert "UnicodeDecodeError" not in printed and "During handling" not in printed


def test_password_is_not_in_repr(tmp_path: Path) -> None:
    settings = load(tmp_path, env={SERVER_PASSWORD_VAR: SECRET})
    assert settings.password == SECRET
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)


def test_password_in_url_is_rejected_without_echoing_it(tmp_path: Path) -> None:
    message = load_error(tmp_path, flags={"url": f"http://opencode:{SECRET}@127.0.0.1:4096"})
    assert message.startswith("url in --url: credentials in the URL are not supported")
    assert SECRET not in message


# --- one table ---------------------------------------------------------------------------


def test_settings_fields_are_the_table() -> None:
    fields = {field.name for field in dataclasses.fields(Settings)}
    not_settings = {"username", "password", "warnings", "service"}
    assert fields == {setting.name for setting in SETTINGS} | not_settings


def doc_table() -> dict[str, dict[str, str]]:
    """The rows of the table under '## Settings', by setting name, backticks removed."""
    section = DOC.read_text(encoding="utf-8").split("\n## Settings\n", 1)[1]
    lines = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    header, _separator, *rows = [
        [cell.strip().replace("`", "") for cell in line.strip("|").split("|")] for line in lines
    ]
    table = [dict(zip(header, row, strict=True)) for row in rows]
    return {row["Setting"]: row for row in table}


def test_doc_lists_exactly_the_settings_in_code() -> None:
    documented = doc_table()
    assert sorted(set(SETTINGS_BY_NAME) - set(documented)) == [], "settings missing from the doc"
    assert sorted(set(documented) - set(SETTINGS_BY_NAME)) == [], "doc rows with no setting"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: setting.name)
def test_doc_row_agrees_with_code(setting: Any) -> None:
    row = doc_table()[setting.name]
    assert row["Flag"] == setting.flag
    assert row["Variable"] == setting.env_var
    assert row["TOML key"] == (setting.toml_key or "—")
    assert row["Default"] == setting.default_text
    assert row["Meaning"]


def test_doc_names_the_server_variables() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert SERVER_USERNAME_VAR in text and SERVER_PASSWORD_VAR in text


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('repeats = "3"', 'repeats in {path}: expected a TOML integer, without quotes, got "3"'),
        ('repeats = "x"', 'repeats in {path}: expected an integer >= 2, got "x"'),
        (
            'dry_run = "yes"',
            'dry_run in {path}: expected true or false (a TOML boolean), got "yes"',
        ),
        ("dry_run = 1", "dry_run in {path}: expected true or false (a TOML boolean), got 1"),
    ],
)
def test_toml_values_must_have_the_documented_type(
    tmp_path: Path, line: str, expected: str
) -> None:
    path = tmp_path / "monitor.toml"
    assert load_error(tmp_path, toml=line) == expected.format(path=path)


def test_variables_stay_text(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        env={"OPENCODE_LOOP_MONITOR_REPEATS": "2", "OPENCODE_LOOP_MONITOR_DRY_RUN": "yes"},
    )
    assert (settings.repeats, settings.dry_run) == (2, True)


def test_unknown_variables_are_named_with_a_guess() -> None:
    from monitor.config import unknown_variables

    environ = {
        "OPENCODE_LOOP_MONITOR_DRYRUN": "1",
        "OPENCODE_LOOP_MONITOR_URL": "http://127.0.0.1:1",
        "OPENCODE_LOOP_MONITOR_ZZZ": "",
        "OPENCODE_SERVER_PASSWORD": "x",
    }
    assert unknown_variables(environ) == [
        "OPENCODE_LOOP_MONITOR_DRYRUN is not a setting and is ignored "
        "(did you mean OPENCODE_LOOP_MONITOR_DRY_RUN?)",
        "OPENCODE_LOOP_MONITOR_ZZZ is not a setting and is ignored",
    ]


def test_notify_url_is_checked_and_never_echoed(tmp_path: Path) -> None:
    url = "https://ntfy.example/alerts?tpl=yes&m={{.text}}"
    assert load(tmp_path, flags={"notify_url": url}).notify_url == url
    secret = "hooks.example/services/T0/B0/sEcReT"
    message = load_error(tmp_path, flags={"notify_url": f"ftp://{secret}"})
    assert message == (
        "notify_url in --notify-url: expected an http:// or https:// URL without user or password"
    )
    assert "sEcReT" not in repr(load(tmp_path, flags={"notify_url": f"https://{secret}"}))


@pytest.mark.parametrize("directory", [".", "project", "/home/dev/project/"])
def test_directory_must_be_absolute_without_a_trailing_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, directory: str
) -> None:
    monkeypatch.chdir(tmp_path)
    message = load_error(tmp_path, flags={"directory": directory})
    fixed = str(tmp_path) if directory == "." else str((tmp_path / directory).resolve())
    if directory.startswith("/"):
        fixed = directory.rstrip("/")
    assert message == (
        "directory in --directory: must be the project's absolute path, without a trailing "
        f'slash, as OpenCode shows it (did you mean {fixed}?), got "{directory}"'
    )


def test_an_absolute_directory_is_kept_as_given(tmp_path: Path) -> None:
    assert load(tmp_path, flags={"directory": "/home/dev/project"}).directory == (
        "/home/dev/project"
    )


def test_a_dry_run_answers_no_request_and_keeps_no_loop_armed(tmp_path: Path) -> None:
    # Its loops are never stopped, so each is reported once, as replay reports them.
    guard = guard_of(load(tmp_path, flags={"dry_run": True, "permissions": "approve"}))
    assert (guard.permissions, guard.armed_runs) == ("off", 0)
    live = guard_of(load(tmp_path, flags={"permissions": "approve"}))
    assert (live.permissions, live.armed_runs) == ("approve", 2)


# --- OpenCode 2's background service ----------------------------------------------------


def register(state: Path, **fields: object) -> Path:
    """A registration as 2.2.5 writes it (`$XDG_STATE_HOME/opencode/service.json`)."""
    path = state / "opencode" / "service.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    registration = {"id": "2622e434", "version": "2.2.5", "url": "http://127.0.0.1:49374"}
    path.write_text(json.dumps({**registration, "pid": 16823, "password": "NTUK", **fields}))
    return path


def test_given_no_url_the_registered_service_is_watched_with_its_password(
    tmp_path: Path,
) -> None:
    path = register(tmp_path / "state")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "OPENCODE_SERVER_PASSWORD": "mine"}
    settings = load(tmp_path, env=env)
    assert (settings.url, settings.password, settings.service) == (
        "http://127.0.0.1:49374",
        "NTUK",  # its own, a new one at every start: the variable is another server's
        Registry(path),
    )
    assert "NTUK" not in repr(settings) and "mine" not in repr(settings)


def test_a_url_given_is_watched_whatever_is_registered(tmp_path: Path) -> None:
    register(tmp_path / "state")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "OPENCODE_SERVER_PASSWORD": "mine"}
    settings = load(tmp_path, flags={"url": "http://127.0.0.1:4596"}, env=env)
    assert (settings.url, settings.password, settings.service) == (
        "http://127.0.0.1:4596",
        "mine",
        None,
    )


@pytest.mark.parametrize(
    "content",
    [None, "not json", "[]", '{"url": 7}', '{"url": "ftp://127.0.0.1:1"}', '{"url": "http://"}'],
)
def test_with_no_usable_registration_the_default_url_is_watched_and_the_file_followed(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "state" / "opencode" / "service.json"
    if content is not None:
        path.parent.mkdir(parents=True)
        path.write_text(content)
    settings = load(
        tmp_path, env={"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    )
    # A service started later is found at the next connect (`Locator`).
    assert (settings.url, settings.password, settings.service) == (
        "http://127.0.0.1:4096",
        None,
        Registry(path),
    )


def test_the_registration_is_looked_for_in_the_homes_state_folder(tmp_path: Path) -> None:
    path = register(tmp_path / "home" / ".local" / "state", url="http://127.0.0.1:5000/")
    settings = load(tmp_path, env={"HOME": str(tmp_path / "home")})
    assert settings.url == "http://127.0.0.1:5000"
    assert settings.service is not None and settings.service.path == path


def refused(tmp_path: Path, settings: Settings) -> None:
    """The registration at `tmp_path`/state was refused: the default with the user's own
    password, and a warning naming the file, never the service's password."""
    assert (settings.url, settings.password) == ("http://127.0.0.1:4096", "mine")
    assert settings.service is not None and settings.service.refused is not None
    assert settings.warnings == (settings.service.refused,)
    assert str(tmp_path / "state" / "opencode" / "service.json") in settings.warnings[0]
    assert "NTUK" not in repr(settings) + settings.warnings[0]


OWN = {"OPENCODE_SERVER_PASSWORD": "mine"}


@pytest.mark.parametrize(
    "url", ["http://192.0.2.7:49374", "http://opencode.example:49374", "http://[2001:db8::1]:1"]
)
def test_a_registration_off_loopback_is_refused_unless_asked_for(tmp_path: Path, url: str) -> None:
    register(tmp_path / "state", url=url)
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), **OWN}
    settings = load(tmp_path, env=env)
    refused(tmp_path, settings)
    assert "not on this machine's loopback" in settings.warnings[0]
    asked = load(tmp_path, env={**env, "OPENCODE_LOOP_MONITOR_REMOTE_SERVICE": "true"})
    assert (asked.url, asked.password, asked.warnings) == (url, "NTUK", ())


@pytest.mark.parametrize("url", ["http://localhost:1", "http://127.0.0.9:1", "http://[::1]:1"])
def test_a_registration_on_loopback_is_followed(tmp_path: Path, url: str) -> None:
    register(tmp_path / "state", url=url)
    settings = load(tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state"), **OWN})
    assert (settings.url, settings.password, settings.warnings) == (url, "NTUK", ())


def test_a_registration_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = register(tmp_path / "elsewhere")
    link = tmp_path / "state" / "opencode" / "service.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    settings = load(tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state"), **OWN})
    refused(tmp_path, settings)
    assert "symbolic link" in settings.warnings[0]


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_registration_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    register(tmp_path / "state").chmod(mode)
    settings = load(tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state"), **OWN})
    refused(tmp_path, settings)
    assert "writable by other users" in settings.warnings[0]


def test_a_registration_of_another_user_is_refused(tmp_path: Path) -> None:
    path = register(tmp_path / "state")
    assert isinstance(read_service(path), Service)
    assert read_service(path, uid=os.geteuid() + 1) == Refusal(
        f"{path} belongs to another user (uid {os.geteuid()}): not followed"
    )
    if os.geteuid() == 0:  # really another's: the settings refuse it as well
        os.chown(path, 4242, -1)
        settings = load(tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state"), **OWN})
        refused(tmp_path, settings)
