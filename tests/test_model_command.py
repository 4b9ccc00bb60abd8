"""`opencode-loop-monitor model`: the scripted model alone, for a server of one's own. It prints
the provider block to paste, loops when a prompt says `loop`, says so to any other prompt,
prints each step, and stops on SIGTERM. Run as a person runs it: the console command."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from monitor.cli import main
from monitor.core.feedback import MARK
from monitor.exits import EX_FAILED
from monitor.kit.model import (
    DEFAULT_PORT,
    MODEL_ID,
    instructions,
    provider_block,
    provider_block_v2,
    run_model,
)
from monitor.kit.scripted_model import (
    DEFAULT_ANSWER,
    ON_DEMAND_ANSWER,
    Text,
    ToolCall,
    decide,
    on_demand_script,
)
from tests.harness import REPO
from tests.model_command import (
    ESCALATE_SHOWS,
    LINE_S,
    LOOP_SHOWS,
    Served,
    block_of,
    model_command,
)

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with model_command() as running:
        yield running


async def completion(url: str, prompt: str, tool_results: int = 0) -> list[dict[str, Any]]:
    """The deltas of one streamed answer to a conversation of `prompt` and its tool results."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    messages += [{"role": "tool", "content": "ok"}] * tool_results
    body = {"model": "looper", "stream": True, "messages": messages, "tools": TOOLS}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/chat/completions", json=body) as response:
            text = await response.text()
    frames = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(frame)["choices"][0]["delta"] for frame in frames[:-1]]


async def test_it_prints_the_block_to_paste_loops_on_demand_and_stops(served: Served) -> None:
    printed = await served.until("Ctrl-C here stops the model.")
    block = block_of(printed)
    url = block["provider"]["loop-monitor"]["options"]["baseURL"]
    assert printed[0] == f"opencode-loop-monitor model: the scripted model answers on {url} " + (
        "(loopback, no API key)"
    )
    assert block == provider_block(url) and url.startswith("http://127.0.0.1:")
    assert f"opencode run --attach http://127.0.0.1:4096 --model {MODEL_ID} loop" in "\n".join(
        printed
    )

    # A prompt that says loop: the demo's cycle, one call a step, until the monitor stops it.
    [first, *_] = await completion(url, "Please loop.")
    assert first["tool_calls"][0]["function"] == {
        "name": "read",
        "arguments": json.dumps({"filePath": "README.md"}),
    }
    assert await served.line() == "model: 'Please loop.': call_0 read README.md"
    [second, *_] = await completion(url, "Please loop.", tool_results=1)
    assert second["tool_calls"][0]["function"]["name"] == "bash"
    assert await served.line() == "model: 'Please loop.': call_1 bash ls"

    # Any other prompt is told how to make it loop, and nothing runs.
    deltas = await completion(url, "hello")
    assert "".join(d.get("content", "") for d in deltas) == ON_DEMAND_ANSWER
    assert not any("tool_calls" in d for d in deltas)
    assert await served.line() == f"model: 'hello': answers {ON_DEMAND_ANSWER!r}"

    served.process.send_signal(signal.SIGTERM)
    assert await served.line() == "opencode-loop-monitor model: stopped"
    assert await asyncio.wait_for(served.process.wait(), LINE_S) == 0


@pytest.mark.parametrize(
    ("prompt", "loops", "again"),
    [
        ("loop", True, False),
        ('"Loop, please"', True, False),  # `opencode run` may send the prompt JSON-quoted
        ("escalate", True, True),
        ("loophole", False, False),
        ("what does this repository do?", False, False),
    ],
)
def test_which_prompts_loop(prompt: str, loops: bool, again: bool) -> None:
    found = on_demand_script(prompt)
    assert (found is not None) is loops
    if found is not None:
        assert (found.after_feedback == "loop") is again
        assert found.heed is not again  # `loop` heeds the monitor, `escalate` ignores it
        assert [tool for tool, _ in found.pattern] == ["read", "bash"]


def conversation(prompt: str, results: list[str], feedback: str | None = None) -> list[dict]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    messages += [{"role": "tool", "content": result} for result in results]
    if feedback is not None:
        messages.append({"role": "user", "content": feedback})
    return messages


REFUSAL = f"Error: {MARK}a repeated tool-call cycle was detected; this call did not run."


@pytest.mark.parametrize("where", ["plugin", "permission"])
def test_loop_heeds_a_refusal_in_the_same_run_and_escalate_ignores_it(where: str) -> None:
    """Issue 45: with the plugin, `loop` made its 12 calls whatever was refused, so the
    person saw three refusals and a hold where usage.md promised the model's answer."""
    # The plugin's refusal is the call's error; a refused permission request quotes it.
    result = REFUSAL if where == "plugin" else f"The user rejected this call: {REFUSAL}"
    loop, escalate = on_demand_script("loop"), on_demand_script("escalate")
    assert loop is not None and escalate is not None
    refused = conversation("loop", ["ok"] * 5 + [result])
    assert decide(loop, refused) == Text(DEFAULT_ANSWER)
    assert isinstance(decide(escalate, refused), ToolCall)  # call_6, on and on
    # A failure of its own is no refusal: `loop` goes on until the monitor stops it.
    assert isinstance(decide(loop, conversation("loop", ["ok"] * 5 + ["Error: no"])), ToolCall)


def test_after_an_abort_loop_answers_the_feedback_and_escalate_loops_again() -> None:
    loop, escalate = on_demand_script("loop"), on_demand_script("escalate")
    assert loop is not None and escalate is not None
    stopped = conversation("loop", ["ok"] * 6, feedback=f"{MARK}stop repeating")
    assert decide(loop, stopped) == Text(DEFAULT_ANSWER)
    again = decide(escalate, stopped)
    assert isinstance(again, ToolCall) and again.call_id == "call_0"


def test_a_port_in_use_is_said_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run_model(port) == EX_FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"opencode-loop-monitor model: cannot listen on 127.0.0.1:{port} (")
    assert err.endswith("give --port another port\n")


def test_the_help_names_the_models_default_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "--help"]) == 0
    assert f"[default: {DEFAULT_PORT}]" in " ".join(capsys.readouterr().out.split())


def test_the_block_docs_usage_shows_is_the_one_printed_for_the_default_port() -> None:
    text = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    shown = text.split("## A model that loops when asked", 1)[1].split("```json\n", 1)[1]
    url = f"http://127.0.0.1:{DEFAULT_PORT}/v1"
    assert json.loads(shown.split("```", 1)[0]) == provider_block(url)


def test_usage_tells_each_story_as_the_real_server_shows_it() -> None:
    """Issue 45: usage.md promised the model's answer where `loop` made 12 calls and was held.
    Each story's lines, which tests/test_real_model.py finds in `opencode run`'s output."""
    text = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    section = " ".join(
        text.split("## A model that loops when asked", 1)[1].split("\n## ")[0].split()
    )
    loop, escalate = section.split("- `loop`, ", 1)[1].split("- `escalate`, ", 1)
    assert all(shown in loop for shown in LOOP_SHOWS)
    assert "Error: Aborted" in escalate and all(shown in escalate for shown in ESCALATE_SHOWS)
    assert "outcome=blocked" in loop and "outcome=held" in escalate


def test_opencode_2_gets_its_own_block_and_the_commands_it_takes() -> None:
    """2.x names a provider in `providers` / `package` / `settings` (V2-REAL-NOTES.md
    section 2), has a password, and a background service: the lines a 2.x user types."""
    url = f"http://127.0.0.1:{DEFAULT_PORT}/v1"
    printed = instructions(url, "2").splitlines()
    assert (
        block_of(printed)
        == provider_block_v2(url)
        == {
            "providers": {
                "loop-monitor": {
                    "package": "@ai-sdk/openai-compatible",
                    "name": "opencode-loop-monitor's scripted model",
                    "settings": {"baseURL": url, "apiKey": "none"},
                    "models": {
                        "looper": {"name": "Looper (scripted)", "capabilities": {"tools": True}}
                    },
                }
            }
        }
    )
    commands = [line.strip() for line in printed if line.startswith("  ")]
    assert [c for c in commands if "opencode" in c and not c.startswith('"')] == [
        "OPENCODE_SERVER_PASSWORD=PASSWORD opencode serve --hostname 127.0.0.1 --port 4096",
        "OPENCODE_SERVER_PASSWORD=PASSWORD opencode-loop-monitor watch --url http://127.0.0.1:4096",
        "OPENCODE_PASSWORD=PASSWORD opencode run --server http://127.0.0.1:4096 "
        f"--model {MODEL_ID} loop",
        "opencode-loop-monitor watch",
        f"opencode run --model {MODEL_ID} loop",
    ]
    assert printed[-1] == "Ctrl-C here stops the model."
    # 1.x's output is unchanged by the flag's default.
    assert instructions(url) == instructions(url, "1") and '"provider": {' in instructions(url)


async def test_model_opencode_2_serves_the_same_model_and_prints_2_x_s_block() -> None:
    async with model_command("--opencode", "2") as served:
        printed = await served.until("Ctrl-C here stops the model.")
        url = block_of(printed)["providers"]["loop-monitor"]["settings"]["baseURL"]
        assert block_of(printed) == provider_block_v2(url)
        [first, *_] = await completion(url, "loop")
        assert first["tool_calls"][0]["function"]["name"] == "read"


def test_the_help_offers_opencode_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--opencode {1,2}" in shown and "`providers`, `package`, `settings`" in shown
