"""The command line: subcommands, their flags, and exit codes.

Flags are not written here: each subcommand names the setting groups it uses and gets one
flag per setting in `monitor.config.SETTINGS`. Adding a subcommand is one `Command` entry
in `COMMANDS` plus its run function.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from monitor import __version__
from monitor.config import Group, Setting, Settings, load_settings, settings_for
from monitor.errors import EX_CONFIG, ConfigError

PROG = "opencode-loop-monitor"
# 128 + SIGINT, what a shell reports for a program stopped with Ctrl-C.
EX_INTERRUPTED = 130

DESCRIPTION = """\
Follows the event stream of `opencode serve`, spots AI coding agents that repeat the
same tool calls, aborts the looping session and tells the model why.

Every flag can also be set with an OPENCODE_LOOP_MONITOR_* environment variable or a
key in a TOML file (--config). Flags win over variables, variables over the file.
See docs/configuration.md."""

EPILOG = """\
exit status: 0 stopped cleanly, 78 configuration error, 130 interrupted.
Run `opencode-loop-monitor COMMAND --help` for a command's settings."""


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: what it does, which settings it takes, and its extra arguments."""

    name: str
    summary: str
    run: Callable[[Settings, argparse.Namespace], int]
    uses: frozenset[Group]
    # Positional arguments of its own (e.g. a session id); settings are added separately.
    add_arguments: Callable[[argparse.ArgumentParser], object] = lambda parser: None


def _run_watch(settings: Settings, args: argparse.Namespace) -> int:
    # Imported here so --help and --version neither pay for nor depend on the asyncio stack.
    from monitor.watch import run_watch

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
stderr and the other files are still replayed), 78 configuration error."""


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = REPLAY_DESCRIPTION
    parser.epilog = REPLAY_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("files", nargs="+", metavar="FILE", help="recording to replay")
    # A plain argument, not a setting: it only means something for this one run.
    parser.add_argument(
        "--fail-on-detect", action="store_true", help="exit with status 1 when a loop is found"
    )


def _run_replay(settings: Settings, args: argparse.Namespace) -> int:
    from monitor.replay import run_replay

    return run_replay(settings, args.files, fail_on_detect=args.fail_on_detect)


COMMANDS: tuple[Command, ...] = (
    Command(
        "watch",
        "follow the server's events and stop sessions that loop",
        _run_watch,
        frozenset(Group),  # the daemon itself takes every setting
    ),
    Command(
        "replay",
        "find loops offline in recorded streams and session exports",
        _run_replay,
        frozenset({Group.DETECTION}),
        _replay_arguments,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", required=True
    )
    for command in COMMANDS:
        subparser = commands.add_parser(
            command.name, help=command.summary, description=command.summary
        )
        command.add_arguments(subparser)
        _add_setting_flags(subparser, command.uses)
    return parser


def _add_setting_flags(parser: argparse.ArgumentParser, uses: frozenset[Group]) -> None:
    used = settings_for(uses)
    for group in Group:
        members = [setting for setting in used if setting.group is group]
        if members:
            section = parser.add_argument_group(f"{group.value} settings")
            for setting in members:
                _add_flag(section, setting)


def _add_flag(section: argparse._ArgumentGroup, setting: Setting) -> None:
    # SUPPRESS leaves flags that were not given out of the namespace, which is how
    # load_settings tells "not given" from "given", so env and file values can show through.
    options = {
        "dest": setting.name,
        "default": argparse.SUPPRESS,
        "help": _flag_help(setting),
    }
    if setting.is_switch:
        # --no-dry-run lets a flag switch off what the environment or the file switched on.
        section.add_argument(setting.flag, action=argparse.BooleanOptionalAction, **options)
    elif setting.repeatable:
        section.add_argument(setting.flag, action="append", metavar=setting.metavar, **options)
    else:
        section.add_argument(setting.flag, metavar=setting.metavar, **options)


def _flag_help(setting: Setting) -> str:
    text = f"{setting.help} [env {setting.env_var}; default: {setting.default_text}]"
    return text.replace("%", "%%")  # argparse expands %-formats in help text


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors end parsing
        return int(exit_.code or 0)
    command = next(command for command in COMMANDS if command.name == args.command)
    try:
        settings = load_settings(
            vars(args), os.environ, isatty=sys.stdout.isatty(), uses=command.uses
        )
        return command.run(settings, args)
    except ConfigError as error:
        print(f"{PROG}: config error: {error}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return EX_INTERRUPTED
