"""Issue 32's "with your own server", as a person follows it: `opencode-loop-monitor model`
running, its printed provider block as the server's only provider, the plugin installed by
`plugin install`, `watch` beside the server, and `opencode run ... loop`: the loop's call is
refused in band by the plugin, before it runs. Issue 45: each of the scripted model's two
stories shows what docs/usage.md says the person sees (`loop` heeds the refusal and answers
in the same run, `escalate` ignores each one until the session is held)."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest

from monitor.core.feedback import MARK
from monitor.kit.model import MODEL_ID, PROVIDER
from monitor.kit.sandbox import OpencodeServer, free_loopback_port, tool_parts
from monitor.kit.scripted_model import DEFAULT_ANSWER
from monitor.shell.endpoint import PluginEndpoint, socket_name
from monitor.shell.plugin_install import FILE_NAME
from tests.harness import REPO, status
from tests.model_command import ESCALATE_SHOWS, LOOP_SHOWS, Served, block_of, model_command
from tests.monitor_process import MonitorProcess, Record

pytestmark = pytest.mark.real_server


class Told(NamedTuple):
    """What a story showed: `opencode run`'s output, the monitor's outcomes, the session's
    messages, what `status` printed after it, and the server's URL."""

    output: str
    outcomes: list[Record]
    messages: list[dict[str, Any]]
    status: str
    url: str


RUN_S = 120  # the loop's 6 calls, 0.5 s a step, and what follows it on a busy machine


@pytest.fixture
async def model() -> AsyncIterator[Served]:
    async with model_command() as running:
        yield running


async def run(binary: Path, server: OpencodeServer, *argv: str) -> tuple[int, str]:
    """`binary ARGV` with the environment of a client of `server`; ended if it outlives
    RUN_S."""
    process = await asyncio.create_subprocess_exec(
        str(binary), *argv, cwd=server.project, env=server.client_environment(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), RUN_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode or 0, output.decode(errors="replace")


async def plugin_install(config_home: Path) -> str:
    """`opencode-loop-monitor plugin install` in the person's shell, whose config folder is the
    server's and whose $XDG_RUNTIME_DIR (this test's) is the monitor's."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "monitor", "plugin", "install", cwd=REPO,
        env={**environment, "XDG_CONFIG_HOME": str(config_home)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output
    return output.decode()


async def run_the_story(
    opencode_bin: Path,
    model: Served,
    start_monitor: Callable[..., MonitorProcess],
    http: aiohttp.ClientSession,
    runtime_dir: Path,
    prompt: str,
) -> Told:
    """docs/usage.md followed: the printed block as the server's only provider, `plugin
    install`, `watch` beside the server (serving its status, as the README's), `opencode run
    ... PROMPT`, then `status`."""
    block = block_of(await model.until("Ctrl-C here stops the model."))
    url = block["provider"][PROVIDER]["options"]["baseURL"]
    # The printed block is the server's only provider: the sandbox's own is replaced.
    config = {**block, "model": MODEL_ID, "small_model": MODEL_ID, "enabled_providers": [PROVIDER]}
    # The plugin file the sandbox writes before the server starts (and the plugin SDK seeded,
    # which a start would otherwise fetch); `plugin install` must write the same.
    folder = runtime_dir / "opencode-loop-monitor"
    endpoint = PluginEndpoint(folder / socket_name("http://127.0.0.1:4096"), socket_dir=folder)
    async with OpencodeServer(opencode_bin, url, plugin=endpoint, config=config) as server:
        plugin_file = server.root / "config" / "opencode" / "plugins" / FILE_NAME
        loaded = plugin_file.read_text()
        assert str(plugin_file) in await plugin_install(server.root / "config")
        assert plugin_file.read_text().splitlines() == loaded.splitlines()

        # The README's `--metrics-addr 127.0.0.1:9464`, on a port free on a test machine.
        address = f"127.0.0.1:{free_loopback_port()}"
        monitor = start_monitor(
            "watch", "--url", server.url, "--metrics-addr", address, "--log-format", "json"
        )
        await monitor.wait_event("plugin.listening")
        await monitor.wait_event("stream.connected")
        code, output = await run(
            opencode_bin, server, "run", "--attach", server.url, "--dir", server.directory,
            "--model", MODEL_ID, prompt,
        )  # fmt: skip
        assert code == 0, output
        outcomes = monitor.events("intervention.outcome")
        messages = await server.client(http).messages(outcomes[0]["session_id"])
        code, shown = await status(address)
        assert code == 0, shown
        return Told(output, outcomes, messages, shown, server.url)


Story = Callable[[str], Awaitable[Told]]


@pytest.fixture
def story(
    opencode_bin: Path,
    model: Served,
    start_monitor: Callable[..., MonitorProcess],
    http: aiohttp.ClientSession,
    runtime_dir: Path,
) -> Story:
    """`run_the_story` of one prompt, with this test's server, model and monitor."""
    return functools.partial(run_the_story, opencode_bin, model, start_monitor, http, runtime_dir)


async def test_loop_is_refused_in_band_and_the_model_answers_in_the_same_run(
    story: Story, model: Served
) -> None:
    """usage.md's `loop` with the plugin: the 6th call is refused before it runs, and the
    model answers in the same run (issue 45: it made its 12 calls, three were refused and
    the session was held)."""
    output, outcomes, messages, shown, url = await story("loop")
    [first] = outcomes  # one intervention: the model heeded it
    assert (first["outcome"], first["via"], first["call_index"]) == ("blocked", "plugin", 6)
    parts = tool_parts(messages)
    assert [p["tool"] for p in parts] == ["read", "bash"] * 3
    assert [p["state"]["status"] for p in parts] == ["completed"] * 5 + ["error"]
    assert parts[5]["state"]["error"].startswith(MARK)  # refused before it ran
    # The model printed each step it answered, the refused call among them, then its answer.
    assert (await model.reach("call_0 ")).endswith(" call_0 read README.md")
    assert (await model.reach("call_5 ")).endswith(" call_5 bash ls")
    assert (await model.reach("answers ")).endswith(f" answers {DEFAULT_ANSWER!r}")
    assert all(line in output for line in LOOP_SHOWS), output
    assert DEFAULT_ANSWER in output and "Aborted" not in output
    # Issue 45: the set-up followed to the letter ends with `status` showing the monitor, its
    # role and the plugin asking (it answered "no monitor answers on ...", rc 69).
    lines = shown.splitlines()
    assert lines[0] == f"monitor 0.1.0 watching {url}" and "role: acting" in lines
    [asking] = [n for n, line in enumerate(lines) if line.startswith("plugins asking at unix:")]
    # The plugin asked about each of the six calls; the 6th it was told to refuse.
    assert lines[asking + 1].startswith(f"  {first['directory']}: ")
    assert ": 6 calls, 1 blocked, 0 fell open, last request " in lines[asking + 1]


async def test_escalate_ignores_each_refusal_until_the_session_is_held(
    story: Story, model: Served
) -> None:
    """usage.md's `escalate` with the plugin: each refused call is made again regardless, each
    refused at once, until the third loop holds the session: its last error says so, and
    `opencode run` ends with `Error: Aborted` (and exits 0)."""
    output, outcomes, messages, _, _ = await story("escalate")
    assert [(o["outcome"], o["call_index"]) for o in outcomes] == [
        ("blocked", 6),
        ("blocked", 7),
        ("held", 8),
    ]
    parts = tool_parts(messages)
    assert [p["state"]["status"] for p in parts] == ["completed"] * 5 + ["error"] * 3
    assert all(p["state"]["error"].startswith(MARK) for p in parts[5:])
    assert "it is on hold until a person replies" in parts[7]["state"]["error"]
    assert output.count("this call was refused and did not run") == 3
    assert all(line in output for line in ESCALATE_SHOWS), output
    assert output.rstrip().endswith("Aborted") and DEFAULT_ANSWER not in output
