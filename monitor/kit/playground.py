"""`python -m monitor.kit.playground`: the demo's server and model, left running for you.

Starts `opencode serve` isolated on loopback (as `demo` and the tests do) with the scripted
model, prints how to point the monitor at it and how to start a looping session with the
real `opencode run` client, then waits until Ctrl-C and stops everything it started. For
trying flags, logs, `status` and `attach` by hand without an API key or your own server.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from monitor.kit.sandbox import (
    MODEL_ID,
    OpencodeServer,
    SandboxError,
    default_cache_dir,
    find_or_install_opencode,
)
from monitor.kit.scripted_model import ScriptedModel, script

PROG = "python -m monitor.kit.playground"
# What `opencode run` sends: read a file, list the folder, again and again (12 calls).
LOOP = script([("read", {"filePath": "README.md"}), ("bash", {"command": "ls"})], 12, delay=0.5)


def instructions(server: OpencodeServer, binary: Path) -> str:
    url = server.url
    run = f"{shlex.quote(str(binary))} run --attach {url} --model {MODEL_ID} {shlex.quote(LOOP)}"
    return f"""\
opencode serve is up on {url} (isolated in {server.root}; its log: {server.log_path})
the only model is the scripted {MODEL_ID}: a prompt that is a script makes it loop

In another terminal, watch it:
  opencode-loop-monitor watch --url {url} --metrics-addr 127.0.0.1:9464
start a looping session with the real client (it prints `Error: Aborted` when stopped):
  {run}
and see what the monitor sees:
  opencode-loop-monitor status --metrics-addr 127.0.0.1:9464

Ctrl-C here stops the server and the model."""


async def _serve(binary: Path, port: int | None, out: TextIO) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with ScriptedModel() as model, OpencodeServer(binary, model.url, port=port) as server:
        print(instructions(server, binary), file=out, flush=True)
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
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
