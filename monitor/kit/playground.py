"""`python -m monitor.kit.playground`: the demo's server and model, left running for you.

Starts `opencode serve` isolated on loopback (as `demo` and the tests do) with the scripted
model, prints how to point the monitor at it and how to start a looping session with the
real `opencode run` client, then waits until Ctrl-C and stops everything it started. For
trying flags, logs, `status` and `attach` by hand without an API key or your own server.

The commands are small scripts in the sandbox (a one-line `opencode run` with its script
wraps in a narrow terminal and then does nothing). With `OPENCODE_SERVER_PASSWORD` set, the
server runs with it and the scripts pass it on, so authentication can be tried too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from monitor.exits import EX_FAILED, EX_OK
from monitor.kit.model import step_line
from monitor.kit.sandbox import (
    MODEL_ID,
    OpencodeServer,
    SandboxError,
    default_cache_dir,
    find_or_install_opencode,
)
from monitor.kit.scripted_model import ModelRequest, ScriptedModel, find_script, script

__all__: list[str] = []

PROG = "python -m monitor.kit.playground"
# What `opencode run` sends: read a file, list the folder, again and again (12 calls), until
# the monitor stops it, then heed it (the `model` command's `loop`).
PATTERN = [("read", {"filePath": "README.md"}), ("bash", {"command": "ls"})]
LOOP = script(PATTERN, 12, delay=0.5, heed=True)
# The same, but after each feedback the model loops again: the monitor escalates and, at
# the stop after --max-interventions, holds the session for a person.
ESCALATE = script(PATTERN, 12, delay=0.5, after_feedback="loop")
METRICS_ADDR = "127.0.0.1:9464"
# What the monitor and the client read, and what the server was started with, when set.
CREDENTIALS = ("OPENCODE_SERVER_PASSWORD", "OPENCODE_SERVER_USERNAME")


def monitor_command() -> str:
    """The console script beside this Python (the README's `.venv/bin/...`), else its name."""
    beside = Path(sys.executable).parent / "opencode-loop-monitor"
    return str(beside) if beside.exists() else ".venv/bin/opencode-loop-monitor"


def credentials(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in CREDENTIALS if environ.get(name)}


def _script(exports: Mapping[str, str], body: str) -> str:
    lines = ["#!/bin/sh", "# Written by the playground; it runs as long as the playground does."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in exports.items()]
    return "\n".join([*lines, body, ""])


def write_scripts(server: OpencodeServer, binary: Path, secrets: Mapping[str, str]) -> Path:
    """watch.sh, status.sh and loop.sh in the sandbox: commands short enough for any
    terminal, carrying the password without showing it. Readable by their owner only."""
    url = server.url
    client = server.client_environment()
    # The sandbox's own HOME and XDG folders, so the client uses its config, not yours.
    sandbox_env = {k: v for k, v in client.items() if os.environ.get(k) != v} | dict(secrets)
    monitor = shlex.quote(monitor_command())
    scripts = {
        "watch.sh": _script(
            secrets, f'exec {monitor} watch --url {url} --metrics-addr {METRICS_ADDR} "$@"'
        ),
        "status.sh": _script(secrets, f'exec {monitor} status --metrics-addr {METRICS_ADDR} "$@"'),
        "loop.sh": _script(
            sandbox_env,
            "\n".join(
                [
                    'case "${1:-}" in',
                    f"  escalate) prompt={shlex.quote(ESCALATE)} ;;",
                    f"  *) prompt={shlex.quote(LOOP)} ;;",
                    "esac",
                    f"exec {shlex.quote(str(binary))} run --attach {url} --model {MODEL_ID}"
                    ' "$prompt"',
                ]
            ),
        ),
    }
    folder = server.root
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        path.chmod(0o700)
    return folder


def instructions(server: OpencodeServer, folder: Path, secrets: Mapping[str, str]) -> str:
    url = server.url
    auth = f" with {' and '.join(secrets)} from this shell" if secrets else ""
    return f"""\
opencode serve is up on {url}{auth}
(isolated in {server.root}; its log: {server.log_path})
the only model is the scripted {MODEL_ID}: a prompt that is a script makes it loop

In another terminal, watch it
({monitor_command()} watch --url {url} --metrics-addr {METRICS_ADDR}):
  sh {folder / "watch.sh"}
start a looping session with the real client (`Error: Aborted` when it is stopped):
  sh {folder / "loop.sh"}
or one whose model loops again after each feedback, until the monitor holds it (the client
exits at the first stop; the model's steps after each feedback show here):
  sh {folder / "loop.sh"} escalate
and see what the monitor sees:
  sh {folder / "status.sh"}

Ctrl-C here stops the server and the model."""


async def _serve(binary: Path, port: int | None, out: TextIO) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    secrets = credentials(os.environ)
    # The client may send the prompt JSON-quoted: the scripts are told apart by what they say.
    labels = [(find_script(LOOP), "loop.sh"), (find_script(ESCALATE), "loop.sh escalate")]

    def said(request: ModelRequest) -> None:
        found = find_script(request.conversation)
        label = next((name for known, name in labels if found is not None and found == known), None)
        if label is not None and (line := step_line(request, label)) is not None:
            print(line, file=out, flush=True)

    async with (
        ScriptedModel(on_reply=said) as model,
        OpencodeServer(binary, model.url, port=port, env_extra=secrets) as server,
    ):
        folder = write_scripts(server, binary, secrets)
        print(instructions(server, folder, secrets), file=out, flush=True)
        await stop.wait()
        print("stopping the server and the model", file=out, flush=True)


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=__doc__)
    parser.add_argument("--port", type=int, help="port for opencode serve [default: a free one]")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
        help="where opencode is found or installed, as for `demo` [default: %(default)s]",
    )
    args = parser.parse_args(argv)
    try:
        binary = find_or_install_opencode(args.cache_dir)
        asyncio.run(_serve(binary, args.port, out))
    except SandboxError as error:
        print(f"{PROG}: failed: {error}", file=sys.stderr)
        return EX_FAILED
    return EX_OK


if __name__ == "__main__":
    sys.exit(main())
