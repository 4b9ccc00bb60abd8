"""`opencode-loop-monitor model`: the scripted model alone, for a server of your own.

The demo and the playground bring their own isolated server; a person who wants to see the
monitor beside their own `opencode serve` needs a model that loops, and no API key. This
serves the scripted model of the demo and the tests on loopback, prints the `opencode.json`
provider block that makes it one of the server's models, and prints each step it answers.
A prompt that says `loop` makes it loop and heed the monitor, `escalate` loop and ignore it
(`monitor.kit.scripted_model.on_demand_script`).

OpenCode 1 and OpenCode 2 name a provider in different keys (1.x `provider`, `npm`,
`options`; 2.x `providers`, `package`, `settings`: V2-REAL-NOTES.md section 2) and are
reached differently (2.x always has a password, and starts a background service for a
client given no server): `--opencode 2` prints 2.x's block and commands. The model itself
is the same; it speaks the tools of whichever server asks (`OfferedTools`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any, TextIO

from monitor.exits import EX_FAILED, EX_OK
from monitor.kit.scripted_model import (
    UNSCRIPTED_ANSWER,
    ModelRequest,
    ScriptedModel,
    Text,
    ToolCall,
)

__all__ = [
    "DEFAULT_PORT",
    "MODEL_ID",
    "PROVIDER",
    "instructions",
    "provider_block",
    "provider_block_v2",
    "run_model",
    "step_line",
]

PROG = "opencode-loop-monitor model"
PROVIDER = "loop-monitor"
MODEL = "looper"
MODEL_ID = f"{PROVIDER}/{MODEL}"
# Beside `opencode serve`'s usual 4096, and fixed, so the pasted block stays right.
DEFAULT_PORT = 4097
NAME = "opencode-loop-monitor's scripted model"
MODEL_NAME = "Looper (scripted)"


def provider_block(url: str) -> dict[str, Any]:
    """What `opencode.json` needs to offer the model at `url` (its base URL, ending /v1)."""
    return {
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": NAME,
                # The scripted model takes any key; the SDK wants one.
                "options": {"baseURL": url, "apiKey": "none"},
                "models": {MODEL: {"name": MODEL_NAME, "tool_call": True}},
            }
        }
    }


def provider_block_v2(url: str) -> dict[str, Any]:
    """The same for OpenCode 2's `opencode.json` (its keys: `providers`, `package`,
    `settings`, a model's `capabilities`). 2.2.5 has the package built in: nothing is
    downloaded."""
    return {
        "providers": {
            PROVIDER: {
                "package": "@ai-sdk/openai-compatible",
                "name": NAME,
                "settings": {"baseURL": url, "apiKey": "none"},
                "models": {MODEL: {"name": MODEL_NAME, "capabilities": {"tools": True}}},
            }
        }
    }


def instructions(url: str, opencode: str = "1") -> str:
    """What the command prints first: the block to paste and how to try it, for OpenCode
    `opencode` ("1" or "2")."""
    if opencode == "2":
        return _instructions_v2(url)
    block = json.dumps(provider_block(url), indent=2)
    return f"""\
{PROG}: the scripted model answers on {url} (loopback, no API key)
Merge this into opencode.json (~/.config/opencode/opencode.json, or your project's), then
(re)start opencode serve:

{block}

In a session of that server, pick the model {MODEL_ID} and write `loop`: it reads README.md
and runs ls, again and again, until the monitor stops it, then heeds it and answers (in the
same run when the plugin refused the call). `escalate`: it ignores every refusal and
feedback and loops on, until the monitor holds the session. For example:
  opencode run --attach http://127.0.0.1:4096 --model {MODEL_ID} loop
Ctrl-C here stops the model."""


def _instructions_v2(url: str) -> str:
    block = json.dumps(provider_block_v2(url), indent=2)
    return f"""\
{PROG}: the scripted model answers on {url} (loopback, no API key)
Merge this into OpenCode 2's opencode.json (~/.config/opencode/opencode.json), then
(re)start opencode serve, or its background service (opencode service restart):

{block}

In a session of that server, pick the model {MODEL_ID} and write `loop`: it reads README.md
and runs its shell's ls, again and again, until the monitor stops it, then heeds it and
answers (in the same run when the plugin refused the call). `escalate`: it ignores every
refusal and feedback and loops on, until the monitor holds the session. With a server you
start, its password goes to the monitor in OPENCODE_SERVER_PASSWORD and to the client in
OPENCODE_PASSWORD:
  OPENCODE_SERVER_PASSWORD=PASSWORD opencode serve --hostname 127.0.0.1 --port 4096
  OPENCODE_SERVER_PASSWORD=PASSWORD opencode-loop-monitor watch --url http://127.0.0.1:4096
  OPENCODE_PASSWORD=PASSWORD opencode run --server http://127.0.0.1:4096 --model {MODEL_ID} loop
Or with OpenCode's background service, which a client given no --server starts (restart it
after pasting), and which the monitor given no --url finds by itself:
  opencode-loop-monitor watch
  opencode run --model {MODEL_ID} loop
Ctrl-C here stops the model."""


def step_line(request: ModelRequest, label: str | None = None) -> str | None:
    """One line per answer of a session's conversation (titles and such are left out),
    named by `label` or the prompt's start; "after feedback" once a later user message (the
    monitor's feedback) came."""
    reply = request.reply
    name = label or repr(request.conversation.strip()[:40])
    after = " (after feedback)" if request.last_user != request.conversation else ""
    if isinstance(reply, ToolCall):
        args = " ".join(str(value) for value in reply.args.values())
        return f"model: {name}{after}: {reply.call_id} {reply.tool} {args}"
    if isinstance(reply, Text) and reply.text != UNSCRIPTED_ANSWER:
        return f"model: {name}{after}: answers {reply.text!r}"
    return None


async def _serve(port: int, out: TextIO, opencode: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def said(request: ModelRequest) -> None:
        if (line := step_line(request)) is not None:
            print(line, file=out, flush=True)

    async with ScriptedModel(port=port, on_demand=True, on_reply=said) as model:
        print(instructions(model.url, opencode), file=out, flush=True)
        await stop.wait()
        print(f"{PROG}: stopped", file=out, flush=True)


def run_model(port: int, out: TextIO = sys.stdout, opencode: str = "1") -> int:
    """The `model` command, printing the block and commands of OpenCode `opencode`."""
    try:
        asyncio.run(_serve(port, out, opencode))
    except OSError as error:
        print(
            f"{PROG}: cannot listen on 127.0.0.1:{port} ({error.strerror or error}): "
            "give --port another port",
            file=sys.stderr,
        )
        return EX_FAILED
    return EX_OK
