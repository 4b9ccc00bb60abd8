"""A plugin file and a daemon of different releases against the real `opencode serve` (issue
46): the plugin file an upgrade left behind (the texts of earlier releases,
tests/earlier_plugins.py) still has its loop stopped once, the daemon says the skew once in its
log, `plugin status` says it and exits non-zero, and a plugin that sends the token in the
clear is refused with what to do about it."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from monitor.core.feedback import MARK, OWN_REFUSALS
from monitor.core.plugin_protocol import CLEAR_TOKEN
from monitor.exits import EX_OTHER_RELEASE
from monitor.kit.sandbox import OpencodeServer, free_loopback_port, tool_parts
from monitor.kit.scripted_model import script
from monitor.shell.endpoint import PluginEndpoint, read_or_create_token
from monitor.shell.plugin_file import shipped_version
from tests import earlier_plugins
from tests.harness import APPEND, start_watching
from tests.monitor_process import CONSOLE_SCRIPT

pytestmark = pytest.mark.real_server


async def appends(server: OpencodeServer, http, calls: int) -> list[dict]:
    client = server.client(http)
    session = await client.create_session("appends")
    await client.prompt_async(session["id"], script([APPEND], calls, delay=0.1))
    return await client.wait_idle(session["id"], 60)


async def plugin_status(server: OpencodeServer, *flags: str) -> tuple[int, str]:
    """`plugin status` as the person of the sandbox runs it (its config folder)."""
    process = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT),
        "plugin", "status", "--url", server.url, *flags,
        env={**os.environ, **server.client_environment()},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_a_plugin_file_of_an_earlier_release_is_answered_and_the_skew_said(
    opencode_bin, scripted_model, start_monitor, http, folder
):
    socket_path = folder / "plugin.sock"
    endpoint = PluginEndpoint(socket_path)
    async with OpencodeServer(
        opencode_bin,
        scripted_model.url,
        plugin=endpoint,
        plugin_text=earlier_plugins.written("3872d79"),
    ) as server:
        flags = ("--plugin-socket", str(socket_path))
        monitor = await start_watching(start_monitor, server, *flags)
        messages = await appends(server, http, 4)
        assert (server.project / "out.txt").read_text().splitlines() == ["x", "x", "x"]
        parts = tool_parts(messages)
        assert [p["state"]["status"] for p in parts] == ["completed"] * 3 + ["error"]
        assert parts[3]["state"]["error"].startswith(MARK)
        # Answered as well as this release can: the daemon's block, once.
        [outcome] = monitor.events("intervention.outcome")
        via = (outcome["outcome"], outcome["via"], outcome["call_index"])
        assert via == ("blocked", "plugin", 4)
        [said] = monitor.events("plugin.version_differs")
        advice = (
            "the installed plugin is of an earlier release (it says no version), this monitor "
            f"{shipped_version()}: run `opencode-loop-monitor plugin install` and restart OpenCode"
        )
        assert (said["plugin_version"], said["advice"]) == (None, advice)
        code, text = await plugin_status(server, *flags)
    assert code == EX_OTHER_RELEASE, text
    assert advice in text.splitlines()
    assert f"a monitor answers there, version {shipped_version()}" in text.splitlines()


async def test_a_plugin_sending_the_token_in_the_clear_is_refused_and_told_to_reinstall(
    opencode_bin, scripted_model, start_monitor, http, folder
):
    port = free_loopback_port()
    token_file = folder / "token"
    read_or_create_token(token_file)  # the plugin reads it as it loads
    endpoint = PluginEndpoint(None, "127.0.0.1", port, token_file)
    async with OpencodeServer(
        opencode_bin,
        scripted_model.url,
        plugin=endpoint,
        plugin_text=earlier_plugins.written("db8faf3"),
    ) as server:
        flags = ("--plugin-addr", f"127.0.0.1:{port}", "--plugin-token-file", str(token_file))
        monitor = await start_watching(start_monitor, server, *flags)
        messages = await appends(server, http, 5)
        assert (server.project / "out.txt").read_text().splitlines() == ["x", "x", "x"]
        parts = tool_parts(messages)
        # Refused by the plugin's own rule, which the monitor counts as its one intervention
        # (its questions refused, the session's run is then cut short too): the 5th never came.
        assert [p["state"]["status"] for p in parts] == ["completed"] * 3 + ["error"]
        # The earlier plugin's own refusal, in its own mark: still known as the plugin's.
        assert parts[3]["state"]["error"].startswith(OWN_REFUSALS[1])
        [detected] = monitor.events("loop.detected")
        assert (detected["call_index"], detected["interventions"]) == (4, 1)
        assert len(monitor.events("intervention.outcome")) == 1
        assert [m["info"]["role"] for m in messages].count("user") == 1
        # One line per status per 10 s: one, or more on a slow machine, all alike.
        refused = monitor.events("plugin.refused")
        assert {(r["status"], r["reason"]) for r in refused} == {(401, CLEAR_TOKEN)}
        # What the person reads in the server's log: what to do.
        log = server.log_path.read_text()
        assert f"refused: 401 {CLEAR_TOKEN}" in log
        assert token_file.read_text().strip() not in log
        code, text = await plugin_status(server, *flags)
    assert code == EX_OTHER_RELEASE, text
