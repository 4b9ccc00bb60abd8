"""The plugin's own tests (tests/plugin/*.test.ts) run by `bun test`, with the Bun of the
`bun` npm package installed into the test kit's cache (monitor.kit.sandbox.find_or_install_bun),
so the single test command of README covers the TypeScript too."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from monitor.kit.sandbox import default_cache_dir, find_or_install_bun
from monitor.shell.decide import socket_name
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


def test_the_plugin_and_the_daemon_name_the_same_socket_for_a_server(bun: Path) -> None:
    script = (
        'import { socketFor } from "./monitor/plugin/loop-guard.ts";'
        f"console.log(JSON.stringify({json.dumps(URLS)}.map((u) => socketFor('/d', u))))"
    )
    done = subprocess.run(
        [bun, "-e", script], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [f"/d/{socket_name(url)}" for url in URLS]
