"""The plugin's own tests (tests/plugin/*.test.ts) run by `bun test`, with the Bun of the
`bun` npm package installed into the test kit's cache (monitor.kit.sandbox.find_or_install_bun),
so the single test command of README covers the TypeScript too."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from monitor.core import feedback
from monitor.core.feedback import MARK, OWN_REFUSAL
from monitor.core.limits import HISTORY_FLOOR
from monitor.core.plugin_protocol import ALLOW, PluginCall, PluginVerdict, block
from monitor.core.rules.cycle import detect_cycle
from monitor.kit.sandbox import default_cache_dir, find_or_install_bun
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import PluginEndpoint, pid_link_name, socket_name
from tests import earlier_plugins
from tests.harness import REPO

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def bun() -> Path:
    return find_or_install_bun(default_cache_dir())


def test_the_plugins_bun_tests_pass(bun: Path) -> None:
    done = subprocess.run(
        [bun, "test", "./tests/plugin/"], cwd=REPO, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    # A suite that silently found no test must not pass.
    assert " 0 fail" in report and " pass" in report and "Ran 0 tests" not in report


URLS = [
    "http://127.0.0.1:4096",
    "http://localhost:43123",
    "http://[::1]:5000",
    "http://localhost",
    "https://127.0.0.1",
]


def evaluate(bun: Path, expression: str) -> object:
    """What `expression` gives in Bun, the plugin's exports in scope as `plugin`."""
    script = (
        'import * as plugin from "./monitor/plugin/loop-guard.ts";'
        f"console.log(JSON.stringify({expression}))"
    )
    done = subprocess.run(
        [bun, "-e", script], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_plugin_and_the_daemon_name_the_same_socket_for_a_server(bun: Path) -> None:
    found = evaluate(bun, f"{json.dumps(URLS)}.map((u) => plugin.socketFor('/d', u))")
    assert found == [f"/d/{socket_name(url)}" for url in URLS]


def test_the_plugin_and_the_daemon_name_the_same_link_for_a_servers_pid(bun: Path) -> None:
    pids = [1, 4405, 4194304]
    found = evaluate(bun, f"{json.dumps(pids)}.map((p) => plugin.pidLink('/d', p))")
    assert found == [f"/d/{pid_link_name(pid)}" for pid in pids]


def test_the_installed_file_says_it_finds_its_own_server(bun: Path) -> None:
    # plugin status tells a file from before the 2.x lookup by this text (finds_own_server).
    from monitor.shell.plugin_file import template
    from monitor.shell.plugin_install import finds_own_server

    assert finds_own_server(template())


def test_the_plugins_rule_finds_what_the_daemons_cycle_rule_finds(bun: Path) -> None:
    """The same sequences through both: the daemon's detect_cycle with the plugin's settings
    (max_period 4, repeats 3, min_calls 4, its history) and the plugin's detectCycle."""
    rng = random.Random(27)
    sequences = []
    for _ in range(2000):
        # Some calls, then a block repeated up to 4 times, maybe cut short: hits and near misses.
        block = [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
        repeated = block * rng.randrange(1, 5)
        cut = rng.randrange(len(block))
        prefix = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        sequences.append(prefix + repeated[: len(repeated) - cut])
    found = evaluate(bun, f"{json.dumps(sequences)}.map((s) => plugin.detectCycle(s))")
    expected = []
    for sequence in sequences:
        cycle = detect_cycle(sequence, 4, 3, 4, window=HISTORY_FLOOR)
        expected.append(cycle and {"length": cycle.length, "repetitions": cycle.repetitions})
    assert found == expected
    assert 500 < sum(1 for cycle in expected if cycle) < 1500  # both answers occur often


def test_the_plugin_speaks_with_the_guards_mark_and_history(bun: Path) -> None:
    assert evaluate(bun, "[plugin.MARK, plugin.HISTORY, plugin.OWN_REFUSAL, plugin.STEP]") == [
        MARK,
        HISTORY_FLOOR,
        OWN_REFUSAL,
        feedback._CALL_STEP,
    ]


async def test_the_plugin_and_the_daemon_prove_each_other_over_tcp(bun: Path, tmp_path: Path):
    # Issue 33: the real plugin's signed questions are taken by the real daemon, and its
    # proven answers by the plugin; the token is in neither's messages.
    token_file = tmp_path / "token"
    judged: list[PluginCall] = []

    def judge(call: PluginCall) -> PluginVerdict:
        judged.append(call)
        return block("stop it") if call.tool == "bash" else ALLOW

    server = DecideServer(
        PluginEndpoint(None, "127.0.0.1", 0, token_file), judge, lambda c, v: None, print
    )
    await server.start()
    try:
        endpoint = {
            "url": f"http://127.0.0.1:{server.port}/v1/decide",
            "socket": None,
            "socketDir": None,
            "tokenFile": str(token_file),
        }
        script = (
            'import { makeAsker } from "./monitor/plugin/loop-guard.ts";'
            f"const ask = makeAsker({json.dumps(endpoint)}, null);"
            "const body = (tool) => ({ session_id: 'ses_dd4d5c831ffemmgMvdYdtbM3cW',"
            " call_id: 'c', tool, args: {}, directory: '/p', fell_open: 0 });"
            "const out = [];"
            "for (const tool of ['bash', 'read']) out.push(await ask(body(tool), tool));"
            "console.log(JSON.stringify(out))"
        )
        code, out, err = await run_bun(bun, script)
    finally:
        await server.close()
    assert code == 0, err.decode()
    assert json.loads(out) == [{"block": "stop it"}, {"block": None}]
    assert [call.tool for call in judged] == ["bash", "read"]


async def run_bun(bun: Path, script: str) -> tuple[int, bytes, bytes]:
    """`bun -e script` in the repository, in its own process group, killed if it outlives
    TIMEOUT_S or the test."""
    process = await asyncio.create_subprocess_exec(
        bun, "-e", script, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out, err


@pytest.mark.parametrize(
    ("plugin", "told"),
    [
        # The file `plugin install` of this release writes: nothing to say on either side.
        ("installed", None),
        # The package's own file, which says "dev": the daemon and the plugin each say so once.
        ("monitor/plugin/loop-guard.ts", "dev"),
        # A plugin file of a release before the signature, left behind by an upgrade: it
        # sends the token in the clear, and is told to be installed again (issue 46).
        ("db8faf3", "clear"),
    ],
)
async def test_a_plugin_and_todays_daemon_of_each_release_over_tcp(
    bun: Path, tmp_path: Path, plugin: str, told: str | None
) -> None:
    import structlog

    from monitor.core.plugin_protocol import CLEAR_TOKEN
    from monitor.shell.plugin_file import shipped_version
    from monitor.shell.plugin_install import render

    token_file = tmp_path / "token"
    judged: list[PluginCall] = []

    def judge(call: PluginCall) -> PluginVerdict:
        judged.append(call)
        return ALLOW

    server = DecideServer(
        PluginEndpoint(None, "127.0.0.1", 0, token_file), judge, lambda c, v: None, print
    )
    await server.start()
    try:
        endpoint = PluginEndpoint(None, "127.0.0.1", server.port, token_file)
        path = tmp_path / "opencode-loop-monitor.ts"
        if plugin == "installed":
            path.write_text(render(endpoint))
        elif plugin == "db8faf3":
            path.write_text(earlier_plugins.text(plugin))
        else:
            path = REPO / plugin
        script = (
            f"const plugin = await import({json.dumps(str(path))});"
            "const lines = [];"
            f"const ask = plugin.makeAsker({json.dumps(_address(endpoint))}, null,"
            "  (line) => lines.push(line));"
            "const { judge } = plugin.makeJudge(ask, '/p', (line) => lines.push(line));"
            "const out = [];"
            "for (let i = 0; i < 2; i++)"
            "  out.push(await judge('ses_dd4d5c831ffemmgMvdYdtbM3cW', `c${i}`, 'read', {}));"
            "console.log(JSON.stringify({ out, lines }))"
        )
        with structlog.testing.capture_logs() as logs:
            code, out, err = await run_bun(bun, script)
    finally:
        await server.close()
    assert code == 0, err.decode()
    result = json.loads(out)
    assert result["out"] == [None, None]  # allowed: by the daemon, or unasked by its own rule
    said = [log for log in logs if log["event"] == "plugin.version_differs"]
    if told is None:
        assert (len(judged), said, result["lines"]) == (2, [], [])
    elif told == "dev":
        assert len(judged) == 2 and [log["plugin_version"] for log in said] == ["dev"]
        where = f"http://127.0.0.1:{server.port}/v1/decide"
        assert result["lines"] == [
            f"opencode-loop-monitor: this plugin is version dev, the monitor at {where} "
            f"{shipped_version()}: run `opencode-loop-monitor plugin install` and restart OpenCode"
        ]
    else:
        assert (judged, said) == ([], [])
        [line] = result["lines"]  # once per session, as every fall-open reason is
        assert f"refused: 401 {CLEAR_TOKEN}" in line
        assert token_file.read_text().strip() not in line


def _address(endpoint: PluginEndpoint) -> dict[str, str | None]:
    return {
        "url": endpoint.url,
        "socket": None,
        "socketDir": None,
        "tokenFile": None if endpoint.token_file is None else str(endpoint.token_file),
    }
