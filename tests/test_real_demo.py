"""`opencode-loop-monitor demo` run as a user runs it, against the real `opencode serve`:
1.18.33, and with `--opencode 2` 2.2.5 (`@opencode/cli`), whose story is told line by line
as 1.x's, in 2.2.5's words (its `shell` tool, its interrupt).

The demo starts its own server and scripted model; the test only lends it the opencode
binary (OPENCODE_BIN, OPENCODE2_BIN) so nothing is installed, then reads what it printed and
checks that nothing it started outlives it.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from monitor.kit.scripted_model import DEFAULT_ANSWER
from tests.monitor_process import MonitorProcess

pytestmark = pytest.mark.real_server

DEMO_TIMEOUT = 90.0
SHAPE = "2 calls (read, bash) repeated 3 times"


def process_state(pid: int) -> str | None:
    """The state letter of a process (Z for a zombie), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after the last ")" do not.
    return stat.rsplit(")", 1)[1].split()[0]


def live(pids: list[int]) -> list[int]:
    return [pid for pid in pids if process_state(pid) not in (None, "Z", "X")]


def all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def live_group_members(pgid: int) -> list[int]:
    def in_group(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2] == str(pgid)
        except OSError:
            return False

    return live([pid for pid in all_pids() if in_group(pid)])


def live_processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment holds `text` (e.g. a sandbox path)."""

    def mentions(pid: int) -> bool:
        try:
            seen = Path(f"/proc/{pid}/cmdline").read_bytes()
            return text.encode() in seen + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False  # ended while we looked, or not ours to read

    return live([pid for pid in all_pids() if mentions(pid)])


def started(output: str) -> tuple[int, str]:
    """The server's pid and sandbox folder, from the demo's `is up` line."""
    found = re.search(r"is up: pid (\d+), sandbox (\S+)", output)
    assert found, output
    return int(found[1]), found[2]


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def run_demo(
    opencode_bin: Path, tmp_path: Path, *flags: str, variable: str = "OPENCODE_BIN"
) -> tuple[MonitorProcess, int | None, list[int]]:
    """Run `demo` to its end: the process, its exit status and what was left in its group;
    `variable` lends it the binary (OPENCODE2_BIN for `--opencode 2`).

    Whatever happens, nothing it started outlives the test.
    """
    demo = MonitorProcess(
        ["demo", "--cache-dir", str(tmp_path / "cache"), *flags],
        tmp_path,
        env={variable: str(opencode_bin)},
    ).start()
    assert demo.process is not None
    code = None
    left_in_group: list[int] = []
    try:
        code = await demo.wait_exit(DEMO_TIMEOUT)
        left_in_group = live_group_members(demo.process.pid)
    finally:
        demo.kill()
        if code != 0:
            # A demo killed before its cleanup leaves its server, a session of its own.
            for pid in re.findall(r"is up: pid (\d+)", demo.output()):
                kill_group(int(pid))
    return demo, code, left_in_group


async def test_demo_stops_the_loop_and_everything_it_started(opencode_bin, tmp_path):
    demo, code, left_in_group = await run_demo(opencode_bin, tmp_path)
    output = demo.stdout_path.read_text(encoding="utf-8")
    assert code == 0, demo.output()
    assert left_in_group == []

    # "Everything stopped": the server, whatever its tools started, and its sandbox.
    server_pid, sandbox = started(output)
    left_running = live_processes_mentioning(sandbox)
    for pid in left_running:
        kill_group(pid)
    assert left_running == []
    assert process_state(server_pid) in (None, "Z", "X")
    assert not Path(sandbox).exists()

    lines = output.splitlines()
    calls = [line.split()[2] for line in lines if line.startswith("  call ")]
    assert calls == ["read", "bash"] * 3
    detected = next(i for i, line in enumerate(lines) if line.startswith("monitor: loop detected"))
    assert lines[detected].startswith(f"monitor: loop detected on call 6: {SHAPE}; session aborted")
    assert lines[detected - 1].startswith("  call 6 ")
    assert lines[detected + 1] == "server: run aborted (MessageAbortedError)"
    assert lines[detected + 2] == (
        'monitor: feedback sent to the model: "Automatic notice: your run was stopped at this '
        f'call, because it kept making the same calls: {SHAPE} with the same arguments."'
    )
    assert lines[detected + 3] == f'model: "{DEFAULT_ANSWER}"'
    assert lines[-1] == (
        "demo finished: 6 calls ran, the loop was stopped on call 6, "
        "no call started after it. Everything stopped."
    )

    # The monitor's own log went to its file, not into the story.
    assert '"event"' not in output
    records = [json.loads(line) for line in (tmp_path / "cache" / "demo-monitor.log").open()]
    [loop] = [r for r in records if r["event"] == "intervention.outcome"]
    assert (loop["outcome"], loop["call_index"], loop["tools"]) == ("aborted", 6, ["read", "bash"])


async def test_demo_shows_the_permission_gate(opencode_bin, tmp_path):
    demo, code, _ = await run_demo(opencode_bin, tmp_path, "--permissions", "approve")
    output = demo.stdout_path.read_text(encoding="utf-8")
    assert code == 0, demo.output()
    lines = output.splitlines()
    assert any("approve every call but the loop's" in line for line in lines)
    detected = next(i for i, line in enumerate(lines) if line.startswith("monitor: loop detected"))
    assert lines[detected].startswith(f"monitor: loop detected on call 6: {SHAPE}; its permission")
    assert lines[detected].endswith("it never ran")
    assert lines[detected + 1] == f'model: "{DEFAULT_ANSWER}"'
    assert "MessageAbortedError" not in output and "feedback sent" not in output
    assert lines[-1] == (
        "demo finished: the model asked for 6 calls, 5 ran: call 6 completed the loop and was "
        "refused before it ran; the model went on. Everything stopped."
    )


async def test_demo_shows_the_plugin_refusing_the_loop_in_band(opencode_bin, tmp_path):
    """OpenCode's default config (nothing asks), the plugin installed in the sandbox: the 6th
    call is refused before it runs, no abort, and the model goes on in the same run."""
    demo, code, left_in_group = await run_demo(opencode_bin, tmp_path, "--plugin")
    output = demo.stdout_path.read_text(encoding="utf-8")
    assert code == 0, demo.output()
    assert left_in_group == []
    lines = output.splitlines()
    assert any("the plugin asks before every call" in line for line in lines)
    detected = next(i for i, line in enumerate(lines) if line.startswith("monitor: loop detected"))
    assert lines[detected] == (
        f"monitor: loop detected on call 6: {SHAPE}; refused in band by the plugin: it never ran"
    )
    # The plugin asks before the stream shows the call; its line still comes first (issue
    # 45: printed after the refusal, it read as if it ran).
    assert lines[detected - 1].startswith("  call 6 ")
    assert lines[detected + 1] == f'model: "{DEFAULT_ANSWER}"'
    assert "MessageAbortedError" not in output and "feedback sent" not in output
    assert lines[-1] == (
        "demo finished: the model asked for 6 calls, 5 ran: call 6 completed the loop and was "
        "refused before it ran; the model went on. Everything stopped."
    )


# OpenCode 2.2.5: `demo --opencode 2`.

# The calls in 2.2.5's words, and so is the finding (the rules know its shell as bash).
SHAPE_2 = "2 calls (read, shell) repeated 3 times"
CALLS_2 = [f"  call {n}   {'read   README.md' if n % 2 else 'shell  ls'}" for n in range(1, 7)]
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


def story_2(lines: list[str]) -> list[str]:
    """From the first call to the end."""
    return lines[lines.index(CALLS_2[0]) :]


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
    assert detected.startswith(f"monitor: loop detected on call 6: {SHAPE_2}; session aborted (")
    assert story_2(lines) == [
        *CALLS_2,
        detected,
        "server: run aborted (session.execution.interrupted)",
        'monitor: feedback sent to the model: "Automatic notice: your run was stopped at this '
        f'call, because it kept making the same calls: {SHAPE_2} with the same arguments."',
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
    assert story_2(lines) == [
        *CALLS_2,
        f"monitor: loop detected on call 6: {SHAPE_2}; refused in band by the plugin: it never ran",
        f'model: "{DEFAULT_ANSWER}"',
        "stopping the server, the model and the monitor",
        REFUSED,
    ]


async def test_demo_on_2_2_5_shows_the_permission_gate(opencode2_bin: Path, tmp_path: Path) -> None:
    lines = await demo2(opencode2_bin, tmp_path, "--permissions", "approve")
    assert any("approve every call but the loop's" in line for line in lines)
    [detected] = [line for line in lines if line.startswith("monitor: loop detected")]
    assert detected.startswith(f"monitor: loop detected on call 6: {SHAPE_2}; its permission ")
    assert story_2(lines) == [
        *CALLS_2,
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
    story = story_2(lines)
    aborted = "server: run aborted (session.execution.interrupted)"
    stored = (
        'monitor: feedback stored in the session for a person: "Automatic notice: your run was '
        f"stopped at this call, because it kept making the same calls: {SHAPE_2} with the same "
        'arguments."'
    )
    # The interrupt's end and the stored feedback come by two ways (the stream, the monitor's
    # log): under load either is printed first (seen once at a load of 6).
    assert sorted(story[7:9]) == sorted([aborted, stored])
    assert story[:7] + story[9:] == [
        *CALLS_2,
        f"monitor: loop detected on call 6: {SHAPE_2}; session aborted and put on hold for a "
        "person",
        "stopping the server, the model and the monitor",
        "demo finished: 6 calls ran, the loop was stopped on call 6, "
        "no call started after it. Everything stopped.",
    ]
