"""The command line: subcommands, their flags, and exit codes.

Flags are not written here: each subcommand names the setting groups it uses and gets one
flag per setting in `monitor.config.SETTINGS`. Adding a subcommand is one `Command` entry
in `COMMANDS` plus its run function.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor import __version__
from monitor.config import (
    STATUS_ADDRESS,
    Group,
    Setting,
    Settings,
    load_settings,
    settings_for,
    unknown_variables,
)
from monitor.errors import ConfigError, LocalError, MonitorError, ServerError
from monitor.exits import (
    EX_CONFIG,
    EX_FAILED,
    EX_INTERRUPTED,
    EX_OK,
    EX_UNAVAILABLE,
    EX_USAGE,
)

__all__ = ["COMMANDS", "EPILOG", "WATCH_EPILOG", "main"]

PROG = "opencode-loop-monitor"
# 128 + SIGINT, what a shell reports for a program stopped with Ctrl-C.

DESCRIPTION = """\
Follows the event stream of `opencode serve`, spots AI coding agents that repeat the
same tool calls and stops the loop. With its OpenCode plugin installed (`plugin install`,
the recommended set-up), the plugin asks the monitor before every tool call and the call
that completes a loop is refused before it runs: the model reads why and goes on in the
same run. Without the plugin, the monitor refuses that call's permission request where the
server asks one, or else aborts the run, and tells the model why.

Every flag can also be set with an OPENCODE_LOOP_MONITOR_* environment variable or a
key in a TOML file (--config). Flags win over variables, variables over the file.
See docs/configuration.md."""

EPILOG = """\
exit status: 0 stopped cleanly (watch: also by SIGTERM or SIGINT at any time; attach: once
it follows the session), 78 configuration error, 130 interrupted by Ctrl-C (demo, replay,
attach while it looks up the session); each command lists its own under --help.
Run `opencode-loop-monitor COMMAND --help` for a command's settings."""


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: what it does, which settings it takes, and its extra arguments."""

    name: str
    summary: str
    run: Callable[[Settings, argparse.Namespace], int]
    # Whole groups of settings, or single settings by name: its --help lists only these.
    uses: frozenset[Group | str]
    # What `COMMAND --help` says above and below the flags.
    description: str
    epilog: str
    # Arguments of its own (e.g. a session id); settings are added separately.
    add_arguments: Callable[[argparse.ArgumentParser], object] = lambda parser: None
    # Commands under this one (`plugin install`), each with its own flags; then this one
    # takes none and `run` is never called.
    subcommands: tuple[Command, ...] = ()
    # A setting that means something else here than in `watch` (status's --metrics-addr is
    # where to ask, not where to serve): its help and default as this command takes them.
    flag_help: Mapping[str, tuple[str, str]] = field(default_factory=dict)


WATCH_DESCRIPTION = """\
Runs beside `opencode serve` and follows every tool call and streamed answer of every
session on its event stream (one project with --directory). A session loops when it repeats
a block of 1 to --max-period calls --repeats times (rule cycle; a single call on its 4th),
fails the same way --failure-repeats times in a row (failure), keeps waiting past
--wait-calls calls (wait), or writes the same passage or answer again and again
(text_repeat, text_steps); --rules seed keeps only the original cycle rule.

The monitor then stops the loop at its call. Where its OpenCode plugin is installed (`plugin
install`, the recommended set-up), the plugin asks this monitor before every tool call (on
--plugin-socket) and the call that completes the loop is refused before it runs, its error
telling the model what it repeated: the model goes on in the same run. Without the plugin,
it refuses that call's permission request where the server asks one (--permissions gate,
the default), or else aborts the run and posts feedback telling the model what it repeated.
After --max-interventions in one session, the next loop holds it for a person. With
--metrics-addr it serves /metrics and /status there (what `status` shows).

It runs until SIGTERM or SIGINT, waits for the server while it is away (reconnecting with
backoff), and logs one JSON object per line when stdout is not a terminal (docs/logs.md);
a reader of stdout that stalls costs log lines (counted), never a stop. SIGHUP and SIGUSR2
are logged and ignored, SIGUSR1 logs a status line (monitor.status). Under systemd it speaks
the notify protocol (READY, STATUS, WATCHDOG, STOPPING)."""

WATCH_EPILOG = """\
exit status: 0 stopped by SIGTERM or SIGINT, also before the server answers, 78
configuration error (a bad setting, a password refused at start: not worth restarting), 130
interrupted while still reading its settings."""


def _run_watch(settings: Settings, args: argparse.Namespace) -> int:
    # Imported here so --help and --version neither pay for nor depend on the asyncio stack.
    from monitor.shell.watch import run_watch

    return run_watch(settings)


REPLAY_DESCRIPTION = """\
Runs the loop detection of `watch` offline over recordings and prints one JSON line per
loop it would have stopped (file, session, part id, position of the call in the session,
cycle length, repetitions, tools; never arguments or outputs), then a summary line.
Try thresholds on real traces with the detection flags below.

A FILE is told apart by its first line: an event stream (`data:` lines from /event or
/global/event, as `watch --record` writes them), JSON Lines of events, or a session export
(the JSON of GET /session/{id}/message, which is read whole). `-` reads standard input.
Each file is replayed on its own, as an independent recording."""

REPLAY_EPILOG = """\
exit status: 0 replayed (loops found or not, without --fail-on-detect), 1 a loop was found
with --fail-on-detect, 2 a FILE could not be read or is not a recording (it is named on
stderr and the other files are still replayed), 78 configuration error, 130 interrupted."""


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="recording to replay")
    # A plain argument, not a setting: it only means something for this one run.
    parser.add_argument(
        "--fail-on-detect", action="store_true", help="exit with status 1 when a loop is found"
    )


def _run_replay(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell.replay import run_replay

    return run_replay(settings, args.files, fail_on_detect=args.fail_on_detect)


EVALUATE_DESCRIPTION = """\
Replays labelled traces with the detection flags below and prints, for each trace, its label
and the first loop the rules found (rule and call position), then a table per rule: loops
caught at the labelled call, caught early or late, false alarms, and where. A trace is an
event-stream recording whose first line is `: expect loop at N` (stop at the session's N-th
call) or `: expect legit`; a DIR stands for its *.sse files. See docs/detection.md."""

EVALUATE_EPILOG = """\
exit status: 0 every loop caught at its labelled call and no false alarm, 1 otherwise, 2 a
trace could not be read or has no label, 78 configuration error, 130 interrupted."""


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="DIR", help="labelled trace, or a folder")
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="keep each real run's replay here (for a corpus with sets.json): later runs "
        "with the same settings read it back instead of replaying",
    )


def _run_evaluate(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell.evaluate import run_evaluate

    return run_evaluate(settings, args.paths, args.cache)


DEMO_DESCRIPTION = """\
Shows the monitor stopping a loop on a real server, with no internet and no API key: finds
opencode (or installs it from npm into --cache-dir), starts it isolated on loopback with a
scripted model that loops, runs the monitor on it and prints, as it happens, the calls, the
detection, the abort, the feedback and the model's answer. Then it stops everything it
started. The monitor's own log goes to CACHE_DIR/demo-monitor.log. Try the detection and
action flags below on it, e.g. --repeats 4 or --dry-run, and --opencode 2 for the same story
on OpenCode 2."""

DEMO_EPILOG = """\
exit status: 0 the loop was caught, 1 the demo failed (opencode could not be installed or
started, or no loop was stopped), 78 configuration error, 130 interrupted."""


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where opencode is installed and the log is written "
        "[default: $XDG_CACHE_HOME/opencode-loop-monitor]",
    )
    parser.add_argument(
        "--plugin",
        action="store_true",
        help="install the monitor's OpenCode plugin in the sandbox: the loop's call is refused "
        "before it runs and the model goes on in the same run",
    )
    # The releases are the kit's (monitor.kit.demo.EDITIONS, by these keys), named here
    # without importing it: --help does not load aiohttp.
    _opencode_argument(
        parser,
        "the OpenCode to show it on: 1 is opencode 1.18.33 (npm opencode-ai@1.18.33, "
        "installed once into CACHE_DIR, about 354 MB; $OPENCODE_BIN skips the install), 2 "
        "is opencode 2.2.5 (npm @opencode/cli@2.2.5, installed once into CACHE_DIR/opencode-2, "
        "about 480 MB; $OPENCODE2_BIN skips it), which the demo runs with a generated "
        "password",
    )


def _opencode_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """`--opencode 1|2`: which OpenCode a command of the kit speaks to."""
    parser.add_argument(
        "--opencode",
        choices=("1", "2"),
        default="1",
        metavar="{1,2}",
        help=f"{help} [default: 1]",
    )


def _run_demo(settings: Settings, args: argparse.Namespace) -> int:
    from pathlib import Path

    from monitor.kit.demo import run_demo
    from monitor.kit.sandbox import default_cache_dir

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    return run_demo(settings, cache_dir, plugin=args.plugin, opencode=args.opencode)


MODEL_DESCRIPTION = """\
Serves the scripted model of `demo` alone, OpenAI-compatible, on 127.0.0.1:--port, so that
your own `opencode serve` has a model that loops, with no API key and no network. Prints the
opencode.json provider block to paste (then restart the server; --opencode 2 for OpenCode
2's block and commands), then one line per answer.
A prompt that says `loop` makes it read README.md and run ls again and again until the
monitor stops it, then heed it and answer (in the same run when the plugin refused the
call); `escalate` ignores every refusal and feedback and loops on, until the monitor holds
the session; any other prompt gets a line saying so. Runs until Ctrl-C or SIGTERM."""

MODEL_EPILOG = """\
exit status: 0 stopped by Ctrl-C or SIGTERM, 1 the port could not be listened on, 78
configuration error, 130 interrupted."""


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    # The default is the model's own (monitor.kit.model.DEFAULT_PORT), named here without
    # importing it: --help does not load aiohttp.
    parser.add_argument(
        "--port", type=int, help="loopback port to serve on; 0 for a free one [default: 4097]"
    )
    _opencode_argument(
        parser,
        "the OpenCode whose opencode.json block and commands to print: 1 (`provider`, "
        "`npm`, `options`; opencode run --attach) or 2 (`providers`, `package`, `settings`; "
        "opencode run --server URL with OPENCODE_PASSWORD, or its background service)",
    )


def _run_model(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.kit.model import DEFAULT_PORT, run_model

    return run_model(DEFAULT_PORT if args.port is None else args.port, opencode=args.opencode)


UNIT_DESCRIPTION = """\
Prints the service that runs `watch` beside your `opencode serve`, naming this install's
console script, so that it runs as printed: the systemd user unit (the recommended set-up on
Linux; `systemd-analyze --user verify` passes on it), or with --launchd the LaunchAgent plist
for macOS. Either serves /status on --metrics-addr (127.0.0.1:9464: where `status` asks)
and the plugin endpoint where the plugin `plugin install` wrote asks. With --password-file
FILE it names that file; the password itself is never printed. Install them with:
  mkdir -p ~/.config/systemd/user
  opencode-loop-monitor unit > ~/.config/systemd/user/opencode-loop-monitor.service
  systemctl --user daemon-reload && systemctl --user enable --now opencode-loop-monitor
or, on macOS:
  opencode-loop-monitor unit --launchd > ~/Library/LaunchAgents/dev.opencode-loop-monitor.plist
  launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/dev.opencode-loop-monitor.plist
What the service could get wrong that the file cannot say (a password only this shell has;
for launchd: no plugin installed yet, a command that does not run as launchd runs it, such as
one of a Python older than 3.11) is said on stderr as a warning."""

UNIT_EPILOG = """\
exit status: 0 printed (warnings or not), 78 configuration error (a bad --url, a password
file that cannot be read), 130 interrupted."""

UNIT_METRICS_HELP = "serve /metrics and /status on HOST:PORT, where `status` asks"


def _unit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--launchd",
        action="store_true",
        help="print the macOS LaunchAgent plist instead of the systemd user unit",
    )


def _run_unit(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell import launchd, unit

    metrics = settings.metrics_addr or STATUS_ADDRESS
    if args.launchd:
        text, notes = launchd.agent(unit.this_install(), settings, os.environ)
    else:
        # Given no --url, the unit's monitor finds its server itself, wherever it is then.
        url = None if settings.service is not None else settings.url
        text = unit.render(unit.this_install(), url, settings.password_file, metrics)
        notes = unit.notes(settings, os.environ)
    for note in notes:
        print(f"{PROG} unit: warning: {note}", file=sys.stderr)
    print(text, end="")
    return EX_OK


ATTACH_DESCRIPTION = """\
Watches one session that is already running. Reads its messages (GET
/session/{id}/message), takes the tool calls of its current run (those after its last
user message) as if they had been seen live, and stops the session at once if they already
complete a cycle. Then follows that session alone on its project's event stream, with the
detection and action rules of `watch`, until the session is deleted."""

ATTACH_EPILOG = """\
exit status: 0 the session was deleted (or stopped with SIGTERM/SIGINT), 66 no such
session on the server, 69 the server could not be asked, 78 configuration error
(including credentials the server refused), 130 interrupted while looking up the session."""


def _session_id(text: str) -> str:
    if not text or any(char.isspace() or not char.isprintable() for char in text):
        raise argparse.ArgumentTypeError("expected a session id such as ses_...")
    return text


def _attach_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session_id", type=_session_id, metavar="SESSION_ID", help="ses_...")


def _run_attach(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell.attach import run_attach

    return run_attach(settings, args.session_id)


STATUS_DESCRIPTION = """\
Shows what a running `watch` sees, asked where it serves /status (`watch --metrics-addr`):
its role (acting, or standby for another monitor), the stream's state, whether plugins ask
it, the sessions it follows (busy, idle or held for a person), the tool calls of each one's
current run and its interventions. The monitor `unit` and `unit --launchd` print serves it
on 127.0.0.1:9464, where this command asks unless given --metrics-addr (or its variable, or
a file): then give the address the monitor serves. A held session stays held, also across
restarts of the monitor, until a person writes to it. --json prints the answer for
scripts."""

STATUS_EPILOG = """\
exit status: 0 shown, 69 no monitor answers on that address, 78 configuration error (port
0), 130 interrupted."""


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the JSON the monitor answers")


STATUS_ADDRESS_HELP = "where the monitor serves /status: the HOST:PORT of its --metrics-addr"


def _run_status(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell.status import run_status

    return run_status(settings, as_json=args.json)


PLUGIN_DESCRIPTION = """\
Installs the OpenCode plugin that asks this monitor before every tool call, so the call that
completes a loop is blocked before it runs and the model's run goes on (see
docs/operations.md). When no monitor answers, it applies its own loop rule. Run
`opencode-loop-monitor plugin ACTION --help` for the flags of each action."""

PLUGIN_EPILOG = """\
exit status: 0 done, 3, 4, 5 or 69 (status) what it found, 78 configuration error, 130
interrupted; each action lists its own under --help."""

PLUGIN_INSTALL_DESCRIPTION = """\
Writes the plugin user-wide ($XDG_CONFIG_HOME/opencode/plugins/) or, with --project DIR, into
DIR/.opencode/plugins/; OpenCode loads it when it next starts. With the default plugin
settings it finds the monitor of the server it runs in, whatever its port (--url is no
longer needed: still accepted, with a note); with --plugin-socket PATH or --plugin-addr it
asks there. Running it again replaces the file it wrote."""

PLUGIN_INSTALL_EPILOG = """\
exit status: 0 installed, 78 configuration error (the folder cannot be written, a file there
is not ours, the endpoint is off), 130 interrupted."""

PLUGIN_UNINSTALL_DESCRIPTION = """\
Removes the plugin file that `plugin install` wrote (user-wide, or with --project DIR that
project's); a file of the same name that it did not write is left alone."""

PLUGIN_UNINSTALL_EPILOG = """\
exit status: 0 removed (or there was none), 78 the file there is not ours or cannot be read,
130 interrupted."""

PLUGIN_STATUS_DESCRIPTION = """\
Says where the plugin is installed, where it asks in the server at --url and whether a
monitor answers there (and whether it is the monitor of that server, with these plugin
settings), asking it as the plugin would: whether it takes the plugin's questions, and
whether the plugin file, this command and that monitor are of one release."""

PLUGIN_STATUS_EPILOG = """\
exit status: 0 installed, and the monitor of --url answers where it asks, 3 not installed,
4 a monitor answers where the plugin asks but it is not the one of --url, 5 the plugin file,
this command and the monitor are not of one release (run `plugin install`, or restart the
monitor) or the monitor refuses the plugin's questions, 69 installed but nothing answers (or
answers no question), 78 configuration error (the endpoint is off), 130 interrupted."""


def _project_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--project",
        metavar="DIR",
        type=Path,
        help="the plugin of one project (DIR/.opencode/plugins/) instead of the user-wide one",
    )


def _project(args: argparse.Namespace) -> Path | None:
    return None if args.project is None else Path(args.project).resolve()


# `plugin install --url URL` was the documented command until the plugin found its own
# server's monitor: scripts keep it, so it is taken, with a note that it is needless. It
# still means what it meant: the monitor of that server, now asked only by a plugin that
# cannot learn its own server's URL (loop-guard.ts: `socket`, beside `socketDir`).
URL_NOT_NEEDED = (
    "no longer needed: the plugin finds the monitor of the server it runs in, whatever its "
    "port; accepted for scripts written for earlier releases, it names the server whose "
    "monitor is asked only where the plugin cannot learn its own server's URL"
)


def _run_plugin_install(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell import plugin_install

    if "url" in vars(args):  # given as a flag (a variable is shared with `watch`)
        print(f"{PROG} plugin install: note: --url is {URL_NOT_NEEDED}", file=sys.stderr)
    print(plugin_install.install(settings, _project(args), os.environ))
    return EX_OK


def _run_plugin_uninstall(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell import plugin_install

    print(plugin_install.uninstall(_project(args), os.environ))
    return EX_OK


def _run_plugin_status(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.shell import plugin_install

    text, code = plugin_install.status(settings, _project(args), os.environ)
    print(text)
    return code


def _no_run(settings: Settings, args: argparse.Namespace) -> int:
    raise AssertionError("a command with subcommands is never run itself")


PLUGIN_ACTIONS: tuple[Command, ...] = (
    Command(
        "install",
        "write the plugin where OpenCode loads it",
        _run_plugin_install,
        # Where it asks; the server's URL it learns at load (--url only for old scripts).
        frozenset({Group.PLUGIN, "url"}),
        PLUGIN_INSTALL_DESCRIPTION,
        PLUGIN_INSTALL_EPILOG,
        _project_argument,
        flag_help={"url": (URL_NOT_NEEDED, "none")},
    ),
    Command(
        "uninstall",
        "remove the plugin file it wrote",
        _run_plugin_uninstall,
        frozenset(),
        PLUGIN_UNINSTALL_DESCRIPTION,
        PLUGIN_UNINSTALL_EPILOG,
        _project_argument,
    ),
    Command(
        "status",
        "say where it is, where it asks and whether a monitor answers",
        _run_plugin_status,
        frozenset({"url", Group.PLUGIN}),
        PLUGIN_STATUS_DESCRIPTION,
        PLUGIN_STATUS_EPILOG,
        _project_argument,
    ),
)


COMMANDS: tuple[Command, ...] = (
    Command(
        "watch",
        "follow the server's events and stop sessions that loop",
        _run_watch,
        frozenset(Group),  # the daemon itself takes every setting
        WATCH_DESCRIPTION,
        WATCH_EPILOG,
    ),
    Command(
        "attach",
        "watch one running session, seeded with its current run",
        _run_attach,
        frozenset({Group.CONNECTION, Group.DETECTION, Group.ACTION, Group.LOGGING}),
        ATTACH_DESCRIPTION,
        ATTACH_EPILOG,
        _attach_arguments,
    ),
    Command(
        "replay",
        "find loops offline in recorded streams and session exports",
        _run_replay,
        frozenset({Group.DETECTION}),
        REPLAY_DESCRIPTION,
        REPLAY_EPILOG,
        _replay_arguments,
    ),
    Command(
        "evaluate",
        "score the rules on labelled traces",
        _run_evaluate,
        frozenset({Group.DETECTION}),
        EVALUATE_DESCRIPTION,
        EVALUATE_EPILOG,
        _evaluate_arguments,
    ),
    Command(
        "demo",
        "show the monitor stop a looping agent on a real, isolated server",
        _run_demo,
        frozenset({Group.DETECTION, Group.ACTION, Group.LOGGING}),
        DEMO_DESCRIPTION,
        DEMO_EPILOG,
        _demo_arguments,
    ),
    Command(
        "model",
        "serve a model that loops when asked, for your own server",
        _run_model,
        frozenset(),
        MODEL_DESCRIPTION,
        MODEL_EPILOG,
        _model_arguments,
    ),
    Command(
        "status",
        "show what a running monitor sees (asks its --metrics-addr)",
        _run_status,
        frozenset({"metrics_addr"}),  # where to ask; not the rest of watch's own settings
        STATUS_DESCRIPTION,
        STATUS_EPILOG,
        _status_arguments,
        flag_help={"metrics_addr": (STATUS_ADDRESS_HELP, str(STATUS_ADDRESS))},
    ),
    Command(
        "unit",
        "print the systemd unit or launchd agent for this install",
        _run_unit,
        # The server it watches, its password file, where it serves /status; other settings
        # go in monitor.env, or the plist.
        frozenset({"url", "password_file", "metrics_addr"}),
        UNIT_DESCRIPTION,
        UNIT_EPILOG,
        _unit_arguments,
        flag_help={"metrics_addr": (UNIT_METRICS_HELP, str(STATUS_ADDRESS))},
    ),
    Command(
        "plugin",
        "install, uninstall or check the OpenCode plugin (blocks loops)",
        _no_run,
        frozenset(),
        PLUGIN_DESCRIPTION,
        PLUGIN_EPILOG,
        subcommands=PLUGIN_ACTIONS,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: `--rep 4` must not quietly mean `--repeats 4`.
    parser = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", required=True
    )
    _add_commands(commands, COMMANDS)
    return parser


def _add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], found: Sequence[Command]
) -> None:
    for command in found:
        subparser = commands.add_parser(
            command.name,
            help=command.summary,
            allow_abbrev=False,
            description=command.description,
            epilog=command.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if command.subcommands:
            below = subparser.add_subparsers(
                dest=_dest(command), metavar="ACTION", title="actions", required=True
            )
            _add_commands(below, command.subcommands)
            continue
        command.add_arguments(subparser)
        _add_setting_flags(subparser, command)


def _dest(command: Command) -> str:
    return f"{command.name}_action"


def chosen(args: argparse.Namespace) -> tuple[Command, ...]:
    """The command the parsed `args` name, from the top: (plugin, install), or (watch,)."""
    path = [next(command for command in COMMANDS if command.name == args.command)]
    while path[-1].subcommands:
        name = getattr(args, _dest(path[-1]))
        path.append(next(c for c in path[-1].subcommands if c.name == name))
    return tuple(path)


def _add_setting_flags(parser: argparse.ArgumentParser, command: Command) -> None:
    used = settings_for(command.uses)
    for group in Group:
        members = [setting for setting in used if setting.group is group]
        if members:
            section = parser.add_argument_group(f"{group.value} settings")
            for setting in members:
                _add_flag(section, setting, command.flag_help.get(setting.name))


def _add_flag(
    section: argparse._ArgumentGroup, setting: Setting, own: tuple[str, str] | None = None
) -> None:
    # SUPPRESS leaves flags that were not given out of the namespace, which is how
    # load_settings tells "not given" from "given", so env and file values can show through.
    options: dict[str, Any] = {
        "dest": setting.name,
        "default": argparse.SUPPRESS,
        "help": _flag_help(setting, *(own or (setting.help, setting.default_text))),
    }
    if setting.is_switch:
        # --no-dry-run lets a flag switch off what the environment or the file switched on.
        section.add_argument(setting.flag, action=argparse.BooleanOptionalAction, **options)
    elif setting.repeatable:
        section.add_argument(setting.flag, action="append", metavar=setting.metavar, **options)
    else:
        section.add_argument(setting.flag, metavar=setting.metavar, **options)


def _flag_help(setting: Setting, help: str, default: str) -> str:
    text = f"{help} [env {setting.env_var}; default: {default}]"
    return text.replace("%", "%%")  # argparse expands %-formats in help text


def _reject_unknown(
    parser: argparse.ArgumentParser, path: Sequence[Command], extras: list[str]
) -> None:
    """Answer an unknown flag with the subcommand's usage (not the top level's) and a guess."""
    subparser = parser
    for command in path:
        [subparsers] = [
            action
            for action in subparser._actions
            if isinstance(action, argparse._SubParsersAction)
        ]
        subparser = subparsers.choices[command.name]
    known = [option for action in subparser._actions for option in action.option_strings]
    flag = extras[0].split("=", 1)[0]
    # A prefix of real flags is what the old abbreviations accepted: name those first.
    close = [option for option in known if option.startswith(flag) and flag.startswith("--")]
    close = close or difflib.get_close_matches(flag, known, n=1)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    subparser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def _check_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Answer a misspelled command with a guess, as `_reject_unknown` does for a flag."""
    # The top level takes no option with a value: the first word that is no option is it.
    word = next((arg for arg in argv if not arg.startswith("-")), None)
    names = [command.name for command in COMMANDS]
    if word is None or word in names:
        return
    close = difflib.get_close_matches(word, names, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    parser.error(f"unknown command {word!r}{hint}; the commands: {', '.join(names)}")


# Each kind of `MonitorError` (monitor/errors.py), how it is named and the exit status it
# ends the command with; the first that fits.
_KINDS: tuple[tuple[type[MonitorError], str, int], ...] = (
    (ConfigError, "config error", EX_CONFIG),  # no restart: the setting must change
    (LocalError, "input error", EX_USAGE),  # a file given to the command
    (ServerError, "server error", EX_UNAVAILABLE),  # the server failed or is away
    (MonitorError, "error", EX_FAILED),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        _check_command(parser, sys.argv[1:] if argv is None else argv)
        args, extras = parser.parse_known_args(argv)
        path = chosen(args)
        if extras:
            _reject_unknown(parser, path, extras)
    except SystemExit as exit_:  # --help, --version and usage errors end parsing
        return int(exit_.code or 0)
    command = path[-1]
    for warning in unknown_variables(os.environ):
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    try:
        settings = load_settings(
            vars(args), os.environ, isatty=sys.stdout.isatty(), uses=command.uses
        )
        return command.run(settings, args)
    except MonitorError as error:
        # A command that knows better has said it already; what reaches here is said in one
        # line, with the exit status of its kind, never as a traceback.
        label, status = next(k[1:] for k in _KINDS if isinstance(error, k[0]))
        print(f"{PROG}: {label}: {error}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        return EX_INTERRUPTED
