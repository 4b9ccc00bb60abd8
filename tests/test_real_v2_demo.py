"""`opencode-loop-monitor demo --opencode 2` run as a user runs it, against the real OpenCode
2.2.5 (`@opencode/cli`): the same story as tests/test_real_demo.py tells of 1.18.33, line by
line, in 2.2.5's words (its `shell` tool, its interrupt). The test lends the demo the binary
(OPENCODE2_BIN) so nothing is installed, reads what it printed, and checks that nothing it
started outlives it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.kit.scripted_model import DEFAULT_ANSWER
from tests.test_real_demo import (
    kill_group,
    live_processes_mentioning,
    process_state,
    run_demo,
    started,
)

pytestmark = pytest.mark.real_server

# The monitor names a shell call by the tool the rules know it as (its profile's bash).
SHAPE = "2 calls (read, bash) repeated 3 times"
CALLS = [f"  call {n}   {'read   README.md' if n % 2 else 'shell  ls'}" for n in range(1, 7)]
REFUSED = (
    "demo finished: the model asked for 6 calls, 5 ran: call 6 completed the loop and was "
    "refused before it ran; the model went on. Everything stopped."
)


async def demo2(opencode2_bin: Path, tmp_path: Path, *flags: str) -> list[str]:
    """`demo --opencode 2 FLAGS` to its end; the lines it printed, once it is known to have
    succeeded and to have left nothing running: its process group, the server, whatever
    the server's tools started, its sandbox."""
    demo, code, left_in_group = await run_demo(
        opencode2_bin, tmp_path, "--opencode", "2", *flags, variable="OPENCODE2_BIN"
    )
    output = demo.stdout_path.read_text(encoding="utf-8")
    assert code == 0, demo.output()
    assert left_in_group == []
    server_pid, sandbox = started(output)
    left_running = live_processes_mentioning(sandbox)
    for pid in left_running:
        kill_group(pid)
    assert left_running == []
    assert process_state(server_pid) in (None, "Z", "X")
    assert not Path(sandbox).exists()
    assert '"event"' not in output  # the monitor's log went to its file
    return output.splitlines()


def story(lines: list[str]) -> list[str]:
    """From the first call to the end."""
    return lines[lines.index(CALLS[0]) :]


async def test_demo_on_2_2_5_stops_the_loop_and_everything_it_started(
    opencode2_bin: Path, tmp_path: Path
) -> None:
    lines = await demo2(opencode2_bin, tmp_path)
    assert lines[0] == (
        "opencode-loop-monitor demo: finding opencode 2.2.5 (if needed, npm installs "
        f"@opencode/cli@2.2.5 into {tmp_path}/cache/opencode-2: about 480 MB, once)"
    )
    assert lines[1] == f"opencode-loop-monitor demo: using {opencode2_bin}"
    assert lines[3].startswith("  opencode 2.2.5 is up: pid ")
    assert lines[4].endswith("on a loop: abort and tell the model); its log: "
                             f"{tmp_path}/cache/demo-monitor.log")  # fmt: skip
    assert lines[5].startswith("session ses_") and lines[5].endswith("again and again")
    [detected] = [line for line in lines if line.startswith("monitor: loop detected")]
    assert detected.startswith(f"monitor: loop detected on call 6: {SHAPE}; session aborted (")
    assert story(lines) == [
        *CALLS,
        detected,
        "server: run aborted (session.execution.interrupted)",
        'monitor: feedback sent to the model: "Automatic notice: your run was stopped at this '
        f'call, because it kept making the same calls: {SHAPE} with the same arguments."',
        f'model: "{DEFAULT_ANSWER}"',
        "stopping the server, the model and the monitor",
        "demo finished: 6 calls ran, the loop was stopped on call 6, "
        "no call started after it. Everything stopped.",
    ]
    records = [json.loads(line) for line in (tmp_path / "cache" / "demo-monitor.log").open()]
    [server] = [r for r in records if r["event"] == "server.detected"]
    assert server["version"] == "2.2.5"
    [loop] = [r for r in records if r["event"] == "intervention.outcome"]
    assert (loop["outcome"], loop["call_index"]) == ("aborted", 6)
    # Each request in the server's own form: none refused.
    assert not any("(400)" in str(r.get("error", "")) for r in records)


async def test_demo_on_2_2_5_shows_the_plugin_refusing_the_loop_in_band(
    opencode2_bin: Path, tmp_path: Path
) -> None:
    """2.2.5 loads the plugin from the sandbox's config; it asks the demo's monitor before
    every call, and the 6th is refused before it runs: no interrupt, the model goes on."""
    lines = await demo2(opencode2_bin, tmp_path, "--plugin")
    assert any("the plugin asks before every call" in line for line in lines)
    assert story(lines) == [
        *CALLS,
        f"monitor: loop detected on call 6: {SHAPE}; refused in band by the plugin: it never ran",
        f'model: "{DEFAULT_ANSWER}"',
        "stopping the server, the model and the monitor",
        REFUSED,
    ]


async def test_demo_on_2_2_5_shows_the_permission_gate(opencode2_bin: Path, tmp_path: Path) -> None:
    lines = await demo2(opencode2_bin, tmp_path, "--permissions", "approve")
    assert any("approve every call but the loop's" in line for line in lines)
    [detected] = [line for line in lines if line.startswith("monitor: loop detected")]
    assert detected.startswith(f"monitor: loop detected on call 6: {SHAPE}; its permission ")
    assert story(lines) == [
        *CALLS,
        detected,
        f'model: "{DEFAULT_ANSWER}"',
        "stopping the server, the model and the monitor",
        REFUSED,
    ]
    assert detected.endswith("it never ran")


async def test_demo_on_2_2_5_holds_the_session_for_a_person(
    opencode2_bin: Path, tmp_path: Path
) -> None:
    """--on-loop hold: the run interrupted, the feedback stored (2.2.5's inbox, no run takes
    it), and no answer from the model."""
    lines = await demo2(opencode2_bin, tmp_path, "--on-loop", "hold")
    assert story(lines) == [
        *CALLS,
        f"monitor: loop detected on call 6: {SHAPE}; session aborted and put on hold for a person",
        "server: run aborted (session.execution.interrupted)",
        'monitor: feedback stored in the session for a person: "Automatic notice: your run was '
        f"stopped at this call, because it kept making the same calls: {SHAPE} with the same "
        'arguments."',
        "stopping the server, the model and the monitor",
        "demo finished: 6 calls ran, the loop was stopped on call 6, "
        "no call started after it. Everything stopped.",
    ]
