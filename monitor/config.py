"""Settings: one table, read from flags, the environment, a TOML file and defaults.

The table is the `Settings` dataclass: each setting is one field, with its row of the table
beside it. Every way to set something (argparse flag, OPENCODE_LOOP_MONITOR_* variable, TOML
key, the table in docs/configuration.md) and the core's `Detection` derive from that row
(`SETTINGS`), so a setting is described once. How detection settings must fit each other is
the core's to say (`Detection` raises DetectionError); this layer only says where each
value came from and how to fix it.
`load_settings` reads no global state: the caller passes the flags, the environment and
whether stdout is a terminal, so tests are plain synchronous calls. It only reads the two
files it is pointed at (the TOML file and the password file).

Each setting's parse function takes one raw value, either text (a flag, a variable) or a
TOML value, and returns the typed value or raises ValueError saying what it expected;
`load_settings` turns that into a ConfigError naming the key and where the value came from.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args
from urllib.parse import urlsplit, urlunsplit

from monitor.core.budget import Budget
from monitor.core.detection import SEED, Detection, MatchMode
from monitor.core.ladder import FirstAction, OnLoop
from monitor.core.limits import HISTORY_FLOOR, MAX_PERIOD, DetectionError
from monitor.core.permissions import PermissionMode
from monitor.core.profile import Profile
from monitor.core.rules.circles import WINDOW as CIRCLES_WINDOW
from monitor.core.rules.revisit import WINDOW as REVISIT_WINDOW
from monitor.core.rules.runaway import LINES as RUNAWAY_LINES
from monitor.errors import ConfigError
from monitor.service import Refusal, Registry, Service, is_loopback, read_service, service_file

__all__ = [
    "ApiChoice",
    "Group",
    "ListenAddress",
    "SERVER_PASSWORD_VAR",
    "SERVER_USERNAME_VAR",
    "SETTINGS",
    "SETTINGS_BY_NAME",
    "STATUS_ADDRESS",
    "Setting",
    "Settings",
    "detection_of",
    "guard_of",
    "is_loopback",
    "load_settings",
    "public_url",
    "settings_for",
    "unknown_variables",
]

# Which OpenCode API the monitor speaks (`--api`): see monitor/shell/api_v2.py.
ApiChoice = Literal["auto", "1", "2"]

ENV_PREFIX = "OPENCODE_LOOP_MONITOR_"
# The server's own variables: the operator sets them once for `opencode serve` and for us,
# so they keep their names instead of taking our prefix.
SERVER_USERNAME_VAR = "OPENCODE_SERVER_USERNAME"
SERVER_PASSWORD_VAR = "OPENCODE_SERVER_PASSWORD"
DEFAULT_USERNAME = "opencode"

LogFormat = Literal["json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

Parse = Callable[[Any], Any]

_TRUE_WORDS = frozenset({"1", "true", "yes"})
_FALSE_WORDS = frozenset({"0", "false", "no"})


class Group(enum.Enum):
    """The part of the monitor a setting configures; a subcommand lists the groups it uses."""

    GENERAL = "general"  # used by every subcommand
    CONNECTION = "connection"
    DETECTION = "detection"
    ACTION = "action"
    LOGGING = "logging"
    WATCH = "watch"
    PLUGIN = "plugin"  # the endpoint the OpenCode plugin asks (watch serves it, plugin installs)


class ListenAddress(NamedTuple):
    """Where the metrics server listens; `host` is bare, without IPv6 brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


# Where `status` asks when not told otherwise, and what the services `unit` prints serve
# (--metrics-addr): so that `status` answers after the README's set-up with no flag.
STATUS_ADDRESS = ListenAddress("127.0.0.1", 9464)


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the settings table."""

    name: str
    parse: Parse
    # Written as a TOML file would write it and parsed like any other value, so a default
    # can never be invalid. None means "not set".
    default: Any
    help: str
    group: Group
    metavar: str = ""
    # A repeatable flag; a list in TOML; comma-separated in the environment. `parse` then
    # receives the whole list, so it can build a set or a mapping.
    repeatable: bool = False
    in_file: bool = True
    # The `Detection` field this setting fills ("" for none), and whether `rules = seed`
    # fixes it to `SEED`'s value.
    core: str = ""
    seed_fixed: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def toml_key(self) -> str | None:
        return self.name if self.in_file else None

    @property
    def is_switch(self) -> bool:
        """A boolean: `--flag` / `--no-flag` instead of a flag taking a value."""
        return self.parse is _boolean

    @property
    def default_text(self) -> str:
        """The default as shown in --help and docs/configuration.md."""
        if self.default is None:
            return "derived" if self.core else "none"
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if self.repeatable and not self.default:
            return "empty"
        return str(self.default)


def _show(raw: object) -> str:
    """Quote a rejected value the way TOML writes it, so the user recognises it."""
    return json.dumps(raw, ensure_ascii=False, default=str)


def _boolean(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"expected true or false (or 1/0, yes/no), got {_show(raw)}")


def _as_int(raw: object) -> int | None:
    # bool is a subclass of int: `max_period = true` must not pass as 1.
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().isascii():
        try:
            return int(raw.strip())
        except ValueError:
            return None
    return None


def _integer(low: int, high: int | None = None) -> Parse:
    wanted = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(raw: object) -> int:
        value = _as_int(raw)
        if value is None or value < low or (high is not None and value > high):
            raise ValueError(f"expected {wanted}, got {_show(raw)}")
        return value

    return parse


def _count_or_off(low: int) -> Parse:
    """An integer of at least `low`, or 0 for a check that is off."""

    def parse(raw: object) -> int:
        value = _as_int(raw)
        if value is None or (value != 0 and value < low):
            raise ValueError(f"expected 0 (off) or an integer >= {low}, got {_show(raw)}")
        return value

    return parse


def _of_window(window: int) -> Callable[[object], int]:
    """How many calls of a rule's window of `window` calls make a loop, or 0 (off)."""

    def parse(raw: object) -> int:
        value = _as_int(raw)
        if value is None or not 0 <= value <= window:
            raise ValueError(f"expected 0 (off) or an integer from 1 to {window}, got {_show(raw)}")
        return value

    return parse


def _call_seconds(raw: object) -> int:
    """Seconds of at least 0, or `off` (-1, the core's "no time bound")."""
    if isinstance(raw, str) and raw.strip().lower() == "off":
        return -1
    value = _as_int(raw)
    if value is None or value < 0:
        raise ValueError(f"expected off or an integer >= 0, got {_show(raw)}")
    return value


def _budget(raw: object) -> Budget:
    """`steps=N,tokens=N,cost=USD` (any of them, comma separated; `off`: no limit), or a TOML
    table with those keys."""
    if isinstance(raw, Budget):
        return raw
    wanted = f"expected off or steps=N,tokens=N,cost=USD (any of them), got {_show(raw)}"
    if isinstance(raw, str):
        text = raw.strip()
        if text.lower() in ("", "off"):
            return Budget()
        items: list[tuple[object, object]] = []
        for item in text.split(","):
            key, equals, value = item.partition("=")
            if not equals:
                raise ValueError(wanted)
            items.append((key.strip().lower(), value.strip()))
    elif isinstance(raw, dict):
        items = list(raw.items())
    else:
        raise ValueError(wanted)
    limits: dict[str, Any] = {}
    for name, given in items:
        if name in ("steps", "tokens"):
            number = _as_int(given)
            if number is None or number < 1:
                raise ValueError(wanted)
            limits[str(name)] = number
        elif name == "cost":
            cost = -1.0
            if isinstance(given, str | int | float) and not isinstance(given, bool):
                try:
                    cost = float(given)
                except ValueError:
                    pass
            if not 0 < cost < float("inf"):
                raise ValueError(wanted)
            limits[str(name)] = cost
        else:
            raise ValueError(wanted)
    return Budget(**limits)


def _choice(options: tuple[str, ...]) -> Parse:
    def parse(raw: object) -> str:
        if isinstance(raw, str) and raw.strip().lower() in options:
            return raw.strip().lower()
        raise ValueError(f"expected one of {', '.join(options)}, got {_show(raw)}")

    return parse


def _text(raw: object) -> str:
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    raise ValueError(f"expected a non-empty string, got {_show(raw)}")


def _directory(raw: object) -> str:
    """The project folder as OpenCode names it: an absolute path, compared as a string, so
    `.` or a trailing slash would match no project and the monitor would watch nothing."""
    text = _text(raw)
    if not text.startswith("/") or (text.endswith("/") and text != "/"):
        fixed = os.path.normpath(os.path.abspath(os.path.expanduser(text)))
        raise ValueError(
            f"must be the project's absolute path, without a trailing slash, as OpenCode "
            f"shows it (did you mean {fixed}?), got {_show(raw)}"
        )
    return text


def _path(raw: object) -> Path:
    if isinstance(raw, str) and raw.strip():
        return Path(raw.strip()).expanduser()
    raise ValueError(f"expected a file path, got {_show(raw)}")


def public_url(url: str) -> str:
    """`url` as logs and errors show it: no user, password, query or fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _url(raw: object) -> str:
    wanted = "expected an http:// or https:// URL such as http://127.0.0.1:4096"
    if not isinstance(raw, str):
        raise ValueError(f"{wanted}, got {_show(raw)}")
    text = raw.strip()
    parts = urlsplit(text)
    if "@" in parts.netloc:
        # Never echo this value: the part before "@" may be the password.
        raise ValueError(
            f"credentials in the URL are not supported; use {SERVER_PASSWORD_VAR} or password_file"
        )
    try:
        port_ok = parts.port is None or parts.port >= 0  # .port raises on a bad port
    except ValueError:
        port_ok = False
    # Shown without its query and fragment: either may carry a token.
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(f"{wanted}, got {_show(public_url(text))}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"expected a base URL without ?query or #fragment, got {_show(public_url(text))}"
        )
    # Without the trailing slash, callers can append "/global/event" without doubling it.
    return text.rstrip("/")


def _webhook_url(raw: object) -> str:
    # The value is never echoed: a chat webhook's URL is its secret. A query is allowed
    # (ntfy's templates live there).
    text = raw.strip() if isinstance(raw, str) else ""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        raise ValueError("expected an http:// or https:// URL without user or password")
    return text


def _listen_address(raw: object) -> ListenAddress:
    wanted = (
        f"expected HOST:PORT with a port from 0 to 65535, such as 127.0.0.1:9464, got {_show(raw)}"
    )
    if not isinstance(raw, str):
        raise ValueError(wanted)
    host, colon, port = raw.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal
    elif ":" in host:
        raise ValueError(wanted)  # an unbracketed IPv6 host makes the port ambiguous
    if not colon or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(wanted)
    return ListenAddress(host, int(port))


def _is_word(text: str) -> bool:
    return len(text.split()) == 1


def _tool_names(items: list[Any]) -> frozenset[str]:
    names = set()
    for raw in items:
        if not (isinstance(raw, str) and _is_word(raw)):
            raise ValueError(f"expected a tool name such as todowrite, got {_show(raw)}")
        names.add(raw.strip())
    return frozenset(names)


def _tool_arguments(items: list[Any]) -> dict[str, frozenset[str]]:
    keys: dict[str, set[str]] = {}
    for raw in items:
        tool, dot, key = raw.partition(".") if isinstance(raw, str) else ("", "", "")
        if not (dot and _is_word(tool) and _is_word(key)):
            raise ValueError(f"expected TOOL.KEY such as bash.description, got {_show(raw)}")
        keys.setdefault(tool.strip(), set()).add(key.strip())
    return {tool: frozenset(names) for tool, names in keys.items()}


def _log_formats() -> tuple[str, ...]:
    return ("auto", *get_args(LogFormat))


class _Row(NamedTuple):
    """A row of the settings table as written beside its `Settings` field (see `_row`)."""

    parse: Parse
    default: Any
    help: str
    group: Group
    metavar: str
    repeatable: bool
    in_file: bool
    core: bool | str
    seed_fixed: bool


_ROW = "setting"  # the metadata key of a `Settings` field's row
_CORE_DEFAULT: Any = object()  # "the default of the `Detection` field it fills"


def _row(
    parse: Parse,
    help: str,
    group: Group,
    *,
    default: Any = _CORE_DEFAULT,
    metavar: str = "",
    repeatable: bool = False,
    in_file: bool = True,
    core: bool | str = False,
    seed_fixed: bool = False,
) -> dict[str, _Row]:
    """The metadata of a `Settings` field that is a setting: its row of the table.

    `core` says the setting fills the `Detection` field of its name (or of the name given);
    such a setting's default is that field's unless `default` says otherwise. `seed_fixed`
    settings take `SEED`'s value under `rules = seed`.
    """
    row = _Row(parse, default, help, group, metavar, repeatable, in_file, core, seed_fixed)
    return {_ROW: row}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the monitor was told, validated; also the table of settings.

    Each field with a row (`_row`) is a setting, declared here only: its flag, variable, TOML
    key, --help text, docs/configuration.md row and `Detection` field derive from it.
    """

    config: Path | None = field(
        metadata=_row(
            _path,
            "TOML file of settings; its keys are the flag names with underscores",
            Group.GENERAL,
            default=None,
            metavar="PATH",
            in_file=False,  # a file cannot point at itself
        )
    )
    url: str = field(
        metadata=_row(
            _url,
            "OpenCode server base URL; when not given, OpenCode 2's background service where "
            "it registers itself (with its password, followed when it restarts), else the "
            "default",
            Group.CONNECTION,
            default="http://127.0.0.1:4096",
            metavar="URL",
        )
    )
    directory: str | None = field(
        metadata=_row(
            _directory,
            "follow one project via /event?directory=DIR instead of all projects via /global/event",
            Group.CONNECTION,
            default=None,
            metavar="DIR",
        )
    )
    api: ApiChoice = field(
        metadata=_row(
            _choice(get_args(ApiChoice)),
            "which OpenCode API to speak: auto asks the server at every connect (2.x answers "
            "/api/info and is read on /api/event; a 1.x server on /global/event, a 1.18 "
            "server's new-engine sessions by /api either way), 1 only the 1.x routes, 2 only "
            "/api",
            Group.CONNECTION,
            default="auto",
            metavar="|".join(get_args(ApiChoice)),
        )
    )
    remote_service: bool = field(
        metadata=_row(
            _boolean,
            "follow OpenCode 2's registered background service (no url given) even when it "
            "names a host off loopback, sending its password there; refused otherwise",
            Group.CONNECTION,
            default=False,
        )
    )
    password_file: Path | None = field(
        metadata=_row(
            _path,
            f"file whose first line is the server password (e.g. a systemd credential); "
            f"without it the password comes from {SERVER_PASSWORD_VAR}, the user name always "
            f"from {SERVER_USERNAME_VAR} (default {DEFAULT_USERNAME})",
            Group.CONNECTION,
            default=None,
            metavar="FILE",
        )
    )
    max_period: int = field(
        metadata=_row(
            _integer(1, MAX_PERIOD),
            f"longest cycle, in tool calls, that is detected (1 to {MAX_PERIOD})",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    repeats: int = field(
        metadata=_row(
            _integer(2),
            "full repetitions needed to call a multi-call cycle a loop (at least 2)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    # Unset, it is derived from what the rules need (monitor/core/limits.py); loaded, it is
    # the history in use.
    history: int = field(
        metadata=_row(
            _integer(4),
            f"tool calls the rules see per session (at least 4, max_period * repeats and "
            f"wait_calls); unset, the larger of {HISTORY_FLOOR} and what those need",
            Group.DETECTION,
            default=None,
            metavar="N",
            core=True,
        )
    )
    rules: str = field(
        metadata=_row(
            _choice(("opencode", "seed")),
            "opencode: every rule with the tool profile; seed: exactly the original rules "
            "(exact arguments, periods 1-4 repeated 3 times, one call on its 4th, nothing else)",
            Group.DETECTION,
            default="opencode",
            metavar="opencode|seed",
        )
    )
    profile: Profile = field(
        metadata=_row(
            _choice(get_args(Profile)),
            "opencode leaves label arguments (bash.description, ...) out of comparisons and "
            "makes bookkeeping tools (todowrite) transparent; none compares everything",
            Group.DETECTION,
            metavar="|".join(get_args(Profile)),
            core=True,
            seed_fixed=True,
        )
    )
    failure_repeats: int = field(
        metadata=_row(
            _integer(0),
            "the same failure this many times in a row is a loop, whatever the arguments (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    wait_calls: int = field(
        metadata=_row(
            _integer(0),
            "calls a loop that waits (sleeps, watches, is answered in progress) may run (0: none)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    match: MatchMode = field(
        metadata=_row(
            _choice(get_args(MatchMode)),
            "what makes two calls the same: input (tool and arguments) "
            "or input+output (the result too)",
            Group.DETECTION,
            metavar="|".join(get_args(MatchMode)),
            core=True,
        )
    )
    ignore_tool: frozenset[str] = field(
        metadata=_row(
            _tool_names,
            "tool name never recorded, e.g. todowrite (repeatable)",
            Group.DETECTION,
            default=(),
            metavar="TOOL",
            repeatable=True,
            core="ignore_tools",
        )
    )
    # tool -> argument keys dropped before comparing
    ignore_arg: Mapping[str, frozenset[str]] = field(
        metadata=_row(
            _tool_arguments,
            "argument key dropped before comparing calls, as TOOL.KEY (repeatable)",
            Group.DETECTION,
            default=(),
            metavar="TOOL.KEY",
            repeatable=True,
            core="ignore_args",
        )
    )
    text_repeats: int = field(
        metadata=_row(
            _count_or_off(2),
            "back-to-back repetitions of a sentence or passage in one streamed answer or "
            "reasoning block that make a text loop (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    text_steps: int = field(
        metadata=_row(
            _count_or_off(2),
            "successive steps of one run with the same whole answer (or reasoning) that make "
            "a text loop (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    no_progress_runs: int = field(
        metadata=_row(
            _count_or_off(2),
            "runs of one check (a call that changes nothing) with the same result, each after "
            "calls that changed files, that make a loop (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    revisits: int = field(
        metadata=_row(
            _of_window(REVISIT_WINDOW),
            f"calls of the last {REVISIT_WINDOW} that bring back what the run already read, "
            "with no file changed since, that make a loop (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    circles: int = field(
        metadata=_row(
            _of_window(CIRCLES_WINDOW),
            f"calls of the last {CIRCLES_WINDOW} that are searches finding nothing new (empty, "
            "failing or already seen), with no file changed, that make a loop (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    runaway_updates: int = field(
        metadata=_row(
            _count_or_off(2),
            "re-sent updates in a row of one running call whose streamed output ends in the "
            f"same line {RUNAWAY_LINES} times over, that make a runaway call (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    call_seconds: int = field(
        metadata=_row(
            _call_seconds,
            "seconds a call may run before it is a runaway (0: what the server allows a bash "
            "call, its timeout or 2 minutes, plus 30 s, other tools unbounded; off: none)",
            Group.DETECTION,
            default=0,  # a TOML integer; the core's is the float 0.0
            metavar="SECONDS",
            core=True,
            seed_fixed=True,
        )
    )
    run_budget: Budget = field(
        metadata=_row(
            _budget,
            "what one run may spend: steps=N,tokens=N,cost=USD, any of them (off: no limit)",
            Group.DETECTION,
            metavar="LIMITS",
            core=True,
        )
    )
    tree_budget: Budget = field(
        metadata=_row(
            _budget,
            "what a session with its subagents may spend, over all its runs: "
            "steps=N,tokens=N,cost=USD, any of them (off: no limit)",
            Group.DETECTION,
            metavar="LIMITS",
            core=True,
        )
    )
    tree_depth: int = field(
        metadata=_row(
            _count_or_off(1),
            "levels of subagents below a session that its tree may grow to: a new subagent "
            "session deeper than this stops the tree at its root (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    tree_fanout: int = field(
        metadata=_row(
            _count_or_off(1),
            "subagent sessions one session may start in one run: one more stops the tree at "
            "its root (0: off)",
            Group.DETECTION,
            metavar="N",
            core=True,
            seed_fixed=True,
        )
    )
    max_sessions: int = field(
        metadata=_row(
            _integer(1),
            "sessions tracked at most; the least recently active one is dropped first",
            Group.DETECTION,
            metavar="N",
            core=True,
        )
    )
    dry_run: bool = field(
        metadata=_row(
            _boolean,
            "detect and log loops, but never abort a session",
            Group.ACTION,
            default=False,
        )
    )
    on_loop: OnLoop = field(
        metadata=_row(
            _choice(get_args(OnLoop)),
            "after the abort: resume lets the model answer the feedback, "
            "hold stores it and waits for a person",
            Group.ACTION,
            metavar="|".join(get_args(OnLoop)),
            core=True,
        )
    )
    max_interventions: int = field(
        metadata=_row(
            _integer(0),
            "interventions in one session after which the next one holds instead of resuming",
            Group.ACTION,
            metavar="N",
            core=True,
        )
    )
    first_action: FirstAction = field(
        metadata=_row(
            _choice(get_args(FirstAction)),
            "the first intervention in a session: nudge posts the feedback while the run goes "
            "on (the call runs), block stops the call before it runs (the plugin refuses it, or "
            "its permission request is refused) and the run goes on, or where it cannot be "
            "blocked stops the run, stop aborts the run then gives the feedback; later ones "
            "block (stop after stop), and hold after max_interventions",
            Group.ACTION,
            metavar="|".join(get_args(FirstAction)),
            core=True,
        )
    )
    permissions: PermissionMode = field(
        metadata=_row(
            _choice(get_args(PermissionMode)),
            "answer the server's permission requests: gate refuses the request of a call that "
            "completes a loop (it never runs) and leaves the others to whoever answers them; "
            "approve also approves EVERY other call, so every call that is not a loop runs "
            "unattended; off answers none",
            Group.ACTION,
            # The core's default is "off": only the daemon, which acts, answers by default.
            default="gate",
            metavar="|".join(get_args(PermissionMode)),
            core=True,
        )
    )
    permission_grace: int = field(
        metadata=_row(
            _integer(0),
            "seconds a doom_loop request of the server is left to a person before gate refuses it",
            Group.ACTION,
            default=30,  # a TOML integer; the core's is the float 30.0
            metavar="SECONDS",
            core=True,
        )
    )
    log_format: LogFormat = field(  # "auto" is already resolved
        metadata=_row(
            _choice(_log_formats()),
            "log format; auto is console when stdout is a terminal and json otherwise",
            Group.LOGGING,
            default="auto",
            metavar="|".join(_log_formats()),
        )
    )
    log_level: LogLevel = field(
        metadata=_row(
            _choice(get_args(LogLevel)),
            "lowest level logged",
            Group.LOGGING,
            default="info",
            metavar="|".join(get_args(LogLevel)),
        )
    )
    record: Path | None = field(
        metadata=_row(
            _path,
            "append every raw frame read from the server to FILE",
            Group.WATCH,
            default=None,
            metavar="FILE",
        )
    )
    metrics_addr: ListenAddress | None = field(
        metadata=_row(
            _listen_address,
            "serve Prometheus /metrics, /healthz, /readyz and /status (what `status` shows) on "
            "HOST:PORT; the services `unit` prints serve 127.0.0.1:9464",
            Group.WATCH,
            default=None,
            metavar="HOST:PORT",
        )
    )
    plugin_socket: str = field(
        metadata=_row(
            _text,
            "Unix socket (mode 0600 in a 0700 folder) where the OpenCode plugin asks whether a "
            "call may run; auto: plugin-PORT.sock, PORT that of --url (the plugin finds it "
            "from its own server's URL, or under OpenCode 2 its port or its pid), in "
            "$RUNTIME_DIRECTORY (systemd's RuntimeDirectory=), "
            "else $XDG_RUNTIME_DIR/opencode-loop-monitor, else $STATE_DIRECTORY, else the state "
            "folder; off: no endpoint",
            Group.PLUGIN,
            default="auto",
            metavar="PATH|auto|off",
        )
    )
    plugin_addr: ListenAddress | None = field(
        metadata=_row(
            _listen_address,
            "serve the plugin endpoint on loopback TCP HOST:PORT instead of the socket; every "
            "request then needs the token in --plugin-token-file",
            Group.PLUGIN,
            default=None,
            metavar="HOST:PORT",
        )
    )
    plugin_token_file: Path | None = field(
        metadata=_row(
            _path,
            "file holding the bearer token of --plugin-addr (created with a new token if absent)",
            Group.PLUGIN,
            default=None,
            metavar="FILE",
        )
    )
    notify_url: str | None = field(
        repr=False,  # a chat webhook's URL is its secret
        metadata=_row(
            _webhook_url,
            "POST a JSON notification (with a text field, as Slack and ntfy take) to URL on "
            "every intervention and hold",
            Group.ACTION,
            default=None,
            metavar="URL",
        ),
    )
    # Not settings of ours: taken from the server's variables or password_file.
    username: str = field(repr=False)
    password: str | None = field(repr=False)
    # What is allowed but probably a mistake; `watch` logs each as `config.warning`.
    warnings: tuple[str, ...] = ()
    # Given no `--url`, where OpenCode 2 registers its background service (monitor/service.py):
    # its URL and password are taken from there, again at every connect.
    service: Registry | None = None


_CORE_DEFAULTS = {item.name: item.default for item in fields(Detection)}


def _setting_of(item: Field[Any]) -> Setting:
    row: _Row = item.metadata[_ROW]
    core = item.name if row.core is True else row.core or ""
    default = _CORE_DEFAULTS[core] if row.default is _CORE_DEFAULT else row.default
    return Setting(
        item.name,
        row.parse,
        default,
        row.help,
        row.group,
        row.metavar,
        row.repeatable,
        row.in_file,
        core,
        row.seed_fixed,
    )


SETTINGS: tuple[Setting, ...] = tuple(
    _setting_of(item) for item in fields(Settings) if _ROW in item.metadata
)
SETTINGS_BY_NAME: Mapping[str, Setting] = {setting.name: setting for setting in SETTINGS}
CONFIG = SETTINGS_BY_NAME["config"]
_FILE_KEYS = tuple(setting.name for setting in SETTINGS if setting.in_file)
# Setting by the `Detection` field it fills, to name the setting a DetectionError is about.
_BY_CORE = {setting.core: setting for setting in SETTINGS if setting.core}


def settings_for(uses: Iterable[Group | str]) -> tuple[Setting, ...]:
    """The settings a subcommand using `uses` (whole groups, or settings by name) accepts, in
    table order."""
    wanted = {Group.GENERAL, *uses}
    return tuple(s for s in SETTINGS if s.group in wanted or s.name in wanted)


class _File(NamedTuple):
    label: str  # the path, as error messages name it
    values: Mapping[str, Any]


class _Raw(NamedTuple):
    value: Any
    # Where the value came from: a flag, a variable, a file path or "default".
    label: str
    # A TOML value has a type of its own, which must be the setting's (text is parsed).
    from_file: bool = False


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    isatty: bool,
    uses: Iterable[Group | str] = tuple(Group),
) -> Settings:
    """Resolve every setting: flags, then environment, then the TOML file, then defaults.

    `flags` maps setting names to what argparse collected (only flags actually given);
    other keys are ignored. Settings outside the `uses` groups keep their defaults, so a
    shared file or environment may hold values for another subcommand. Raises ConfigError.
    """
    config_raw = _find(CONFIG, flags, environ, None)
    config = _parse(CONFIG, config_raw)
    file = None if config is None else _read_file(config, config_raw.label)
    used = settings_for(uses)
    raws = {
        setting.name: _find(setting, flags, environ, file)
        if setting in used
        else _Raw(setting.default, "default")
        for setting in SETTINGS
    }
    values = {name: _parse(SETTINGS_BY_NAME[name], raw) for name, raw in raws.items()}
    _check_rules(raws)
    try:
        detection = _detection(values)
    except DetectionError as error:
        raise ConfigError(_misfit(error, raws, values)) from error
    values["history"] = detection.history  # as derived, when it was not set
    if values["log_format"] == "auto":
        values["log_format"] = "console" if isatty else "json"
    username, password = _credentials(values["password_file"], raws["password_file"].label, environ)
    service = None if raws["url"].label != "default" else service_file(environ)
    registry = None
    if service is not None:
        registered = read_service(service, remote=values["remote_service"])
        refused = registered.reason if isinstance(registered, Refusal) else None
        registry = Registry(service, values["remote_service"], refused)
        if isinstance(registered, Service):
            # The service's password goes with its URL (a new one at every start of it).
            values["url"], password = registered.url, registered.password
    return Settings(
        **values,
        username=username,
        password=password,
        warnings=_warnings(values, registry),
        service=registry,
    )


def _find(
    setting: Setting,
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    file: _File | None,
) -> _Raw:
    if setting.name in flags:
        return _Raw(flags[setting.name], setting.flag)
    text = environ.get(setting.env_var, "")
    # An empty variable counts as unset: unit files and compose files write FOO= to clear one.
    if text.strip():
        value = [item for item in text.split(",") if item.strip()] if setting.repeatable else text
        return _Raw(value, setting.env_var)
    if file is not None and setting.name in file.values:
        return _Raw(file.values[setting.name], file.label, from_file=True)
    return _Raw(setting.default, "default")


def _parse(setting: Setting, raw: _Raw) -> Any:
    try:
        if raw.from_file:
            _check_toml_type(setting, raw.value)
        if setting.repeatable:
            if not isinstance(raw.value, (list, tuple)):
                raise ValueError(f'expected a list such as ["a", "b"], got {_show(raw.value)}')
            return setting.parse(list(raw.value))
        return None if raw.value is None else setting.parse(raw.value)
    except ValueError as error:
        raise ConfigError(f"{setting.name} in {raw.label}: {error}") from error


def _check_toml_type(setting: Setting, value: object) -> None:
    """TOML has numbers and booleans: `repeats = "3"` or `dry_run = "yes"` is a mistake.

    Text is parsed only where text is all there is (flags, variables). A setting whose
    parse gives an integer is a number setting.
    """
    if setting.is_switch and not isinstance(value, bool):
        raise ValueError(f"expected true or false (a TOML boolean), got {_show(value)}")
    if isinstance(value, str) and not setting.repeatable:
        parsed = setting.parse(value)  # its own message for text that is no number at all
        if isinstance(parsed, int):  # a number setting (a boolean one was refused above)
            raise ValueError(f"expected a TOML integer, without quotes, got {_show(value)}")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per OPENCODE_LOOP_MONITOR_* variable that is no setting (a typo)."""
    known = [setting.env_var for setting in SETTINGS]
    warnings = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            # Compared without the shared prefix, which would make every name look close.
            close = difflib.get_close_matches(
                name.removeprefix(ENV_PREFIX), [setting.name.upper() for setting in SETTINGS], n=1
            )
            hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
            warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings


def _read_file(path: Path, label: str) -> _File:
    try:
        with path.open("rb") as stream:
            values = tomllib.load(stream)
    except OSError as error:
        raise ConfigError(
            f"config in {label}: cannot read {path}: {error.strerror or error}"
        ) from error
    except UnicodeDecodeError as error:
        raise ConfigError(f"config in {label}: {path} is not UTF-8 text") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config in {label}: {path} is not valid TOML: {error}") from error
    for key in values:
        if key not in _FILE_KEYS:
            raise ConfigError(_unknown_key(key, path, table=isinstance(values[key], dict)))
    return _File(str(path), values)


def _unknown_key(key: str, path: Path, table: bool = False) -> str:
    close = difflib.get_close_matches(key, _FILE_KEYS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    if table:
        hint = f" (a [{key}] table: the file has no tables, its keys go at the top level)"
    return f"{key} in {path}: unknown key{hint}"


def _misfit(error: DetectionError, raws: Mapping[str, _Raw], values: Mapping[str, Any]) -> str:
    """The core's complaint about settings that do not fit, with where each value came from
    and how to fix it where it was set."""
    setting = _BY_CORE[error.field]
    raw = raws[setting.name]
    seeded = values["rules"] == "seed"

    def label(name: str, value: int) -> str:
        used = _BY_CORE[name]
        if seeded and used.seed_fixed:
            return f"{used.name} {value} (rules = seed in {raws['rules'].label})"
        return f"{used.name} {value} ({raws[used.name].label})"

    fix = f"set {_assignment(setting, raw, error.minimum)} or more"
    if setting.default is None:
        fix += f", or leave {setting.name} unset to derive it"
    return (
        f"{setting.name} in {raw.label}: must be at least {error.minimum}"
        f"{error.formula(label)} {error.why}, not {error.value}; {fix}"
    )


def _assignment(setting: Setting, raw: _Raw, value: object) -> str:
    """How to give `setting` the value `value` where it is set now (a flag by default)."""
    if raw.label == setting.env_var:
        return f"{setting.env_var}={value}"
    if raw.from_file:
        return f"{setting.name} = {value} in {raw.label}"
    return f"{setting.flag} {value}"


def _check_rules(raws: Mapping[str, _Raw]) -> None:
    if _parse(SETTINGS_BY_NAME["rules"], raws["rules"]) != "seed":
        return
    # Setting any of what `rules = seed` fixes as well would not give the seed's behaviour.
    for setting in SETTINGS:
        if setting.seed_fixed and raws[setting.name].label != "default":
            raise ConfigError(
                f"{setting.name} in {raws[setting.name].label}: cannot be combined with "
                f"rules = seed ({raws['rules'].label}), which fixes it"
            )


def _credentials(
    password_file: Path | None, label: str, environ: Mapping[str, str]
) -> tuple[str, str | None]:
    username = environ.get(SERVER_USERNAME_VAR) or DEFAULT_USERNAME
    if password_file is None:
        return username, environ.get(SERVER_PASSWORD_VAR) or None
    return username, _read_password(password_file, label)


def _read_password(path: Path, label: str) -> str:
    # Messages name the path only, and `from None` drops the cause: a UnicodeDecodeError
    # carries the file's bytes, which may be the secret.
    try:
        with path.open(encoding="utf-8") as stream:
            first_line = stream.readline()
    except OSError as error:
        raise ConfigError(
            f"password_file in {label}: cannot read {path}: {error.strerror}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"password_file in {label}: {path} is not UTF-8 text") from None
    password = first_line.rstrip("\r\n")
    if not password:
        raise ConfigError(f"password_file in {label}: the first line of {path} is empty")
    return password


def _warnings(values: Mapping[str, Any], registry: Registry | None) -> tuple[str, ...]:
    warnings = []
    password_file: Path | None = values["password_file"]
    # Already read by `_credentials`, so it exists.
    if password_file is not None and password_file.stat().st_mode & stat.S_IROTH:
        warnings.append(f"password_file {password_file} is readable by every user (chmod o-r)")
    address: ListenAddress | None = values["metrics_addr"]
    if address is not None and not is_loopback(address.host):
        warnings.append(
            f"metrics_addr {address.host}:{address.port} is not a loopback address: "
            "/metrics is served without authentication to whoever can reach it"
        )
    if registry is not None and registry.refused is not None:
        warnings.append(registry.refused)
    return tuple(warnings)


def _detection(values: Mapping[str, Any]) -> Detection:
    """The `Detection` that setting values describe; raises DetectionError if they misfit."""
    seeded = values["rules"] == "seed"
    core = {}
    for setting in SETTINGS:
        if not setting.core:
            continue
        # `_check_rules` made sure none of what the seed fixes was set as well.
        fixed = seeded and setting.seed_fixed
        value = getattr(SEED, setting.core) if fixed else values[setting.name]
        if value is not None:  # unset: the core derives it
            core[setting.core] = value
    return Detection(**core)


def _values(settings: Settings) -> dict[str, Any]:
    return {setting.name: getattr(settings, setting.name) for setting in SETTINGS}


def guard_of(settings: Settings) -> Detection:
    """What `watch` and `attach` act by: the detection settings, and how permission requests
    are answered. A dry run changes nothing on the server: it answers no request, and as the
    loops it reports were never stopped, none stays armed (each is reported once, as replay
    does)."""
    detection = _detection(_values(settings))
    if settings.dry_run:
        return replace(detection, permissions="off", armed_runs=0)
    return detection


def detection_of(settings: Settings) -> Detection:
    """The core's detection settings, as `replay` and `evaluate` judge: they answer no
    permission request."""
    return replace(guard_of(settings), permissions="off")
