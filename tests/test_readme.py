"""Every code block of README.md (and of docs/usage.md, where its long material went), checked
by its language and content, so that a block added or edited later is held to what the code
does: a command whose program or flag does not exist, a sample line the code never prints, a
config that does not parse, each fails here. And the README stays short, its command first."""

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
import xml.etree.ElementTree as ElementTree
from functools import cache
from importlib.util import find_spec
from pathlib import Path

import pytest

from monitor.config import STATUS_ADDRESS, ListenAddress
from monitor.shell.unit import render

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "opencode-loop-monitor"
# Programs a reader installs or has beside the monitor (the README says where from).
EXTERNAL = {"opencode", "curl", "npm", "launchctl", "systemctl", "plutil", "cd", "export"}
BLOCK = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)


# The README and the page that holds what it once said at length.
DOCUMENTS = ("README.md", "docs/usage.md")
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
    ".venv/bin/python -m pytest -n 4 --dist loadgroup"
)


def blocks(text: str | None = None) -> list[tuple[str, str]]:
    """(language, dedented body) of every fenced block, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8") if text is None else text
    return [(m["lang"], textwrap.dedent(m["body"])) for m in BLOCK.finditer(text)]


def readme_commands() -> list[str]:
    return [body.strip() for lang, body in blocks() if lang == "sh"]


@cache
def help_text(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "monitor", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{SCRIPT} {' '.join(command)} --help: {done.stderr}"
    return done.stdout


@cache
def source_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "monitor").rglob("*.py"))


def commands(body: str) -> list[list[str]]:
    """Each simple command of a shell block, as argv (comments, `&&`, `|`, `;` split off)."""
    found: list[list[str]] = []
    for line in body.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        argv: list[str] = []
        for token in lexer:
            if token in ("&&", "||", "|", ";", "&"):
                found.append(argv)
                argv = []
            else:
                argv.append(token)
        found.append(argv)
    return [argv for argv in found if argv]


def check_command(argv: list[str]) -> list[str]:
    """What is wrong with one command: its program, its module, its flags."""
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):  # VAR=value before the program
        argv = argv[1:]
    program, name = argv[0], Path(argv[0]).name
    if name == SCRIPT:
        # The command, and its action (`plugin install`): each word its parent's help lists.
        subcommand: list[str] = []
        for word in (a for a in argv[1:] if not a.startswith("-")):
            if not re.search(rf"^    {re.escape(word)}\b", help_text(*subcommand), re.M):
                break
            subcommand.append(word)
        usage = help_text(*subcommand)
        flags = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")}
        return [
            f"{' '.join(argv[:2])}: no flag {flag}" for flag in sorted(flags) if flag not in usage
        ]
    if re.fullmatch(r"python3?(\.\d+)?", name):
        if "-m" in argv:
            module = argv[argv.index("-m") + 1]
            if find_spec(module) is None:
                return [f"python -m {module}: no such module"]
            if module.startswith("monitor.") and any(a.startswith("--") for a in argv):
                return [f"python -m {module}: flags are not checked for this module"]
        return []
    if program.startswith(".venv/bin/"):
        # The venv the set-up command makes; here, the one running the tests.
        return (
            [] if (Path(sys.executable).parent / name).exists() else [f"{program}: not in the venv"]
        )
    if name in EXTERNAL or shutil.which(program):
        return []
    return [f"{program}: not a console script, module or known program"]


LOG_LINE = re.compile(r"^(?P<event>[a-z_]+(?:\.[a-z_]+)+)\s+(?P<fields>\w+=.*)$")


def check_text(body: str) -> list[str]:
    """Sample output: log lines name events and fields the code logs; other lines are what
    the code prints (one of their runs of plain words is in its source)."""
    wrong = []
    logs_doc = (ROOT / "docs" / "logs.md").read_text(encoding="utf-8")
    for line in filter(None, (raw.strip() for raw in body.splitlines())):
        if entry := LOG_LINE.match(line):
            if f'"{entry["event"]}"' not in source_text():
                wrong.append(f"log event {entry['event']} is never logged")
            for key in re.findall(r"(?:^|\s)(\w+)=", entry["fields"]):
                if f"{key}=" not in source_text() and f"`{key}`" not in logs_doc:
                    wrong.append(f"log field {key} of {entry['event']} is never logged")
            continue
        # Ids, numbers, names and URLs are filled in: some fixed run of words must be the
        # code's.
        words = re.sub(r"\w+://\S+", " ", line)
        runs = [
            r for r in re.findall(r"[A-Za-z][A-Za-z,;']*(?: [A-Za-z,;']+)*", words) if len(r) >= 8
        ]
        if runs and not any(run in source_text() for run in runs):
            wrong.append(f"sample line not printed by the code: {line!r}")
    return wrong


def check_block(lang: str, body: str) -> list[str]:
    if lang in ("sh", "bash", "shell", "console"):
        return [problem for argv in commands(body) for problem in check_command(argv)]
    if lang == "text":
        return check_text(body)
    try:
        if lang == "json":
            json.loads(body)
        elif lang == "toml":
            tomllib.loads(body)
        elif lang == "xml":
            ElementTree.fromstring(body)
        elif lang == "ini":
            configparser.ConfigParser(interpolation=None).read_string(body)
        else:
            return [f"a ```{lang or '(no language)'} block: give it a language this test checks"]
    except (ValueError, ElementTree.ParseError, configparser.Error) as exc:
        return [f"a {lang} block does not parse: {exc}"]
    return []


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_matches_the_code(document: str):
    found = blocks((ROOT / document).read_text(encoding="utf-8"))
    assert len(found) >= 5
    problems = [p for lang, body in found for p in check_block(lang, body)]
    assert problems == []


def test_the_checks_catch_what_is_wrong():
    assert check_block("sh", f"{SCRIPT} watch --url X --no-such-flag") == [
        f"{SCRIPT} watch: no flag --no-such-flag"
    ]
    assert check_block("sh", f".venv/bin/{SCRIPT} status --metrics-addr A && {SCRIPT} demo") == []
    assert check_block("sh", f"{SCRIPT} plugin install --api 2") == [
        f"{SCRIPT} plugin: no flag --api"
    ]
    assert check_block("sh", f"{SCRIPT} plugin status --url U --project D") == []
    assert check_block("sh", "python -m monitor.nowhere") == [
        "python -m monitor.nowhere: no such module"
    ]
    assert check_block("sh", "frobnicate --x  # a comment") == [
        "frobnicate: not a console script, module or known program"
    ]
    assert check_block("text", "loop.detected  session_id=s no_such_field=1") == [
        "log field no_such_field of loop.detected is never logged"
    ]
    assert check_block("text", "monitor: the model was politely asked") != []
    assert check_block("json", '{"a": 1,}')[0].startswith("a json block does not parse")
    assert check_block("toml", "repeats = ")[0].startswith("a toml block does not parse")
    assert check_block("", "x") == ["a ```(no language) block: give it a language this test checks"]
    indented = "1. Run:\n\n   ```sh\n   opencode serve --port 4096\n   ```\n"
    assert blocks(indented) == [("sh", "opencode serve --port 4096\n")]


def test_readme_opens_with_see_it_work_then_run_it_with_status_then_the_tests():
    """Issue 45: the tests sat between `watch` and the recommended set-up, so a reader who
    started `watch` learnt afterwards that the plugin goes in before the server starts; and
    `status` failed after that set-up, as neither its `watch` nor the unit served /status."""
    found = readme_commands()
    demo, plugin, *run_it, tests = found
    assert demo.startswith("python3 -m venv .venv && .venv/bin/pip install . && ")
    assert demo.endswith(".venv/bin/opencode-loop-monitor demo")
    assert plugin == ".venv/bin/opencode-loop-monitor plugin install"
    assert tests == TEST_COMMAND
    script = ".venv/bin/opencode-loop-monitor"
    unit, launchd, watch, status = run_it
    assert f"{script} unit > ~/.config/systemd/user/opencode-loop-monitor.service" in unit
    assert launchd.startswith(
        f"{script} unit --launchd > ~/Library/LaunchAgents/dev.opencode-loop-monitor.plist"
    )
    assert watch == f"{script} watch --url http://127.0.0.1:4096 --metrics-addr 127.0.0.1:9464"
    # `status` with no flag asks where each of the three serves it.
    assert status == f"{script} status"
    assert STATUS_ADDRESS == ListenAddress("127.0.0.1", 9464)
    assert f"--metrics-addr {STATUS_ADDRESS}" in render([script])


def test_readme_is_read_in_two_minutes():
    """Issue 32: the first command came at line 64, after tables, of 280 lines."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    first_fence = next(n for n, line in enumerate(lines, 1) if line.lstrip().startswith("```sh"))
    assert first_fence + 1 <= 25  # the command is the line after the fence
    assert len(lines) < 120


def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in ci_lines


def test_the_table_of_commands_names_every_command_and_no_other():
    from monitor.cli import COMMANDS

    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    table = text.split("## Commands\n", 1)[1].split("\n#", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = {word for cell in first_cells for word in re.findall(r"`(\w+)", cell)}
    assert named == {command.name for command in COMMANDS}
