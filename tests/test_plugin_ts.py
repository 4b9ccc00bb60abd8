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

from monitor.core.feedback import MARK, OWN_REFUSAL
from monitor.core.limits import HISTORY_FLOOR
from monitor.core.plugin_protocol import ALLOW, PluginCall, PluginVerdict, block
from monitor.core.rules.cycle import detect_cycle
from monitor.kit.sandbox import default_cache_dir, find_or_install_bun
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import PluginEndpoint, socket_name
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
    assert evaluate(bun, "[plugin.MARK, plugin.HISTORY, plugin.OWN_REFUSAL]") == [
        MARK,
        HISTORY_FLOOR,
        OWN_REFUSAL,
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
    finally:
        await server.close()
    assert process.returncode == 0, err.decode()
    assert json.loads(out) == [{"block": "stop it"}, {"block": None}]
    assert [call.tool for call in judged] == ["bash", "read"]
