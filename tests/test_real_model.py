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
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest

from monitor.core.feedback import MARK
from monitor.kit.model import MODEL_ID, PROVIDER, provider_block_v2
from monitor.kit.sandbox import (
    OpencodeServer,
    OpencodeServer2,
    free_loopback_port,
    tool_calls,
    tool_parts,
)
from monitor.kit.scripted_model import DEFAULT_ANSWER
from monitor.shell.endpoint import PluginEndpoint, socket_name
from monitor.shell.plugin_install import FILE_NAME
from tests.harness import REPO, status
from tests.model_command import ESCALATE_SHOWS, LOOP_SHOWS, Served, block_of, model_command
from tests.monitor_process import CONSOLE_SCRIPT, MonitorProcess, Record

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


# Where `model --opencode 2` says the person's server listens (their `opencode serve --port`).
PRINTED_URL = "http://127.0.0.1:4096"


def printed_command(printed: list[str], program: str, server: OpencodeServer2) -> list[str]:
    """The command line `model --opencode 2` printed for a server of the person's whose
    program is `program` (after the password's variable), for this server: its URL for the
    one printed, its password for PASSWORD."""
    [line] = [line for line in printed if line.startswith("  OPENCODE_") and program in line]
    variable, *words = shlex.split(line.replace(PRINTED_URL, server.url))
    name, value = variable.split("=", 1)
    assert name in ("OPENCODE_PASSWORD", "OPENCODE_SERVER_PASSWORD") and value == "PASSWORD"
    return [f"{name}={server.password}", *words]


async def test_on_opencode_2_the_printed_block_and_commands_show_loop_refused_in_band(
    opencode2_bin: Path, start_monitor: Callable[..., MonitorProcess], http: aiohttp.ClientSession
) -> None:
    """`model --opencode 2` followed on 2.2.5: its printed block as the server's only
    provider, `plugin install`, then the printed `watch --url` and `opencode run --server
    ... loop` with the server's password as the printed lines pass it: the 6th call (2.2.5's
    shell) is refused in band and the model answers in the same run."""
    async with model_command("--opencode", "2") as model:
        printed = await model.until("Ctrl-C here stops the model.")
        block = block_of(printed)
        url = block["providers"][PROVIDER]["settings"]["baseURL"]
        assert block == provider_block_v2(url) and url.startswith("http://127.0.0.1:")
        # The printed block replaces the sandbox's providers: the only one the server has.
        config = {**block, "model": MODEL_ID}
        async with OpencodeServer2(opencode2_bin, url, config=config) as server:
            env = server.client_environment()
            shell = {k: v for k, v in env.items() if k == "HOME" or k.startswith("XDG_")}
            installed = subprocess.run(
                [str(CONSOLE_SCRIPT), "plugin", "install"],
                env={**os.environ, **shell}, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert installed.returncode == 0, installed.stderr

            [variable, *watch] = printed_command(printed, "opencode-loop-monitor watch", server)
            assert watch[:3] == ["opencode-loop-monitor", "watch", "--url"]
            name, password = variable.split("=", 1)
            monitor = start_monitor(
                *watch[1:], "--log-format", "json", env={**shell, name: password}
            )
            await monitor.wait_event("stream.resynced")

            [variable, program, *argv] = printed_command(printed, "opencode run", server)
            assert (program, argv[-3:]) == ("opencode", ["--model", MODEL_ID, "loop"])
            name, password = variable.split("=", 1)
            # Only the printed variable: none of the server's own. In the project, as a person
            # types it there: 2.2.5's `opencode run` takes its session's folder from $PWD (the
            # test's own checkout otherwise, whose README holds the monitor's mark).
            client = {k: v for k, v in env.items() if not k.startswith("OPENCODE_SERVER_")}
            client["PWD"] = str(server.project)
            process = await asyncio.create_subprocess_exec(
                str(opencode2_bin), *argv, cwd=server.project, env={**client, name: password},
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            try:
                raw, _ = await asyncio.wait_for(process.communicate(), RUN_S)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            output = raw.decode(errors="replace")
            assert process.returncode == 0, output

            [outcome] = monitor.events("intervention.outcome")
            assert (outcome["outcome"], outcome["via"], outcome["call_index"]) == (
                "blocked",
                "plugin",
                6,
            )
            record = await server.client(http).messages(outcome["session_id"])
            assert server.password not in monitor.output()
        calls = tool_calls(record)
        assert [call["name"] for call in calls] == ["read", "shell"] * 3
        assert [c["state"]["status"] for c in calls] == ["completed"] * 5 + ["error"]
        assert calls[5]["state"]["error"]["message"].startswith(MARK)
        # The model printed each step it answered in 2.2.5's words, then its answer.
        assert (await model.reach("call_0 ")).endswith(" call_0 read README.md")
        assert (await model.reach("call_5 ")).endswith(" call_5 shell ls")
        assert (await model.reach("answers ")).endswith(f" answers {DEFAULT_ANSWER!r}")
    assert "Automatic notice: this call was refused and did not run: " in output, output
    assert DEFAULT_ANSWER in output, output
    assert monitor.events("feedback.sent") == []
