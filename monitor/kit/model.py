"""`opencode-loop-monitor model`: the scripted model alone, for a server of your own.

The demo and the playground bring their own isolated server; a person who wants to see the
monitor beside their own `opencode serve` needs a model that loops, and no API key. This
serves the scripted model of the demo and the tests on loopback, prints the `opencode.json`
provider block that makes it one of the server's models, and prints each step it answers.
A prompt that says `loop` makes it loop and heed the monitor, `escalate` loop and ignore it
(`monitor.kit.scripted_model.on_demand_script`).
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

__all__ = ["DEFAULT_PORT", "MODEL_ID", "PROVIDER", "provider_block", "run_model", "step_line"]

PROG = "opencode-loop-monitor model"
PROVIDER = "loop-monitor"
MODEL = "looper"
MODEL_ID = f"{PROVIDER}/{MODEL}"
# Beside `opencode serve`'s usual 4096, and fixed, so the pasted block stays right.
DEFAULT_PORT = 4097


def provider_block(url: str) -> dict[str, Any]:
    """What `opencode.json` needs to offer the model at `url` (its base URL, ending /v1)."""
    return {
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "opencode-loop-monitor's scripted model",
                # The scripted model takes any key; the SDK wants one.
                "options": {"baseURL": url, "apiKey": "none"},
                "models": {MODEL: {"name": "Looper (scripted)", "tool_call": True}},
            }
        }
    }


def instructions(url: str) -> str:
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


async def _serve(port: int, out: TextIO) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def said(request: ModelRequest) -> None:
        if (line := step_line(request)) is not None:
            print(line, file=out, flush=True)

    async with ScriptedModel(port=port, on_demand=True, on_reply=said) as model:
        print(instructions(model.url), file=out, flush=True)
        await stop.wait()
        print(f"{PROG}: stopped", file=out, flush=True)


def run_model(port: int, out: TextIO = sys.stdout) -> int:
    try:
        asyncio.run(_serve(port, out))
    except OSError as error:
        print(
            f"{PROG}: cannot listen on 127.0.0.1:{port} ({error.strerror or error}): "
            "give --port another port",
            file=sys.stderr,
        )
        return EX_FAILED
    return EX_OK
