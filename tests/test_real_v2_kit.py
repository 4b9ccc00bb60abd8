"""The kit on the real OpenCode 2.2.5: the isolated server, its `/api` client, and the scripted
model speaking 2.x's tools from a script written in either release's words.

What each real test asserts is what V2-REAL-NOTES.md saw by hand: `/api/info` says 2.2.5,
a password guards `/api`, 2.2.5 runs every call of a loop (no loop check of its own), the
shell's result metadata carries its exit code. The fixtures (tests/conftest.py) stop the
server's whole process tree and the model at teardown, also when a test fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from monitor.kit.sandbox import (
    MODEL_ID,
    RELEASE_2,
    InstallError,
    OpencodeServer2,
    ProjectClient2,
    find_or_install_opencode,
    tool_calls,
)
from monitor.kit.scripted_model import (
    DEFAULT_ANSWER,
    OfferedTools,
    ParallelCalls,
    ScriptedModel,
    Text,
    ToolCall,
    script,
)
from tests.harness import alive, read_pid_file
from tests.real_v2 import answers

# A script in 1.x's words: the model says them in 2.x's to a 2.x server.
READ_V1 = ("read", {"filePath": "README.md"})
LS_V1 = ("bash", {"command": "ls", "description": "List the project's files"})


def function(name: str, *arguments: str) -> dict[str, Any]:
    """A tool definition as a chat completion request carries it."""
    properties = {key: {"type": "string"} for key in arguments}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"properties": properties}},
    }


# The tools each release offers (the arguments that matter here; 2.2.5's from
# captures-2.2.5/tools-2.2.5.json).
TOOLS_V1 = OfferedTools.of_request(
    [function("read", "filePath", "offset", "limit"), function("bash", "command", "description")]
)
TOOLS_V2 = OfferedTools.of_request(
    [function("read", "path", "offset", "limit"), function("shell", "command", "workdir")]
)


# The model's words, without a network.


def test_a_script_in_1x_words_goes_to_a_1x_server_unchanged() -> None:
    calls = (ToolCall("call_0", *READ_V1), ToolCall("call_1", *LS_V1))
    assert TOOLS_V1.speak(calls[0]) == calls[0]
    assert TOOLS_V1.speak(ParallelCalls(calls)) == ParallelCalls(calls)


def test_a_script_in_1x_words_is_spoken_in_2x_words_to_a_2x_server() -> None:
    assert TOOLS_V2.speak(ToolCall("call_0", *READ_V1)) == ToolCall(
        "call_0", "read", {"path": "README.md"}
    )
    # bash's description has no place in shell, which refuses arguments it does not know.
    assert TOOLS_V2.speak(ToolCall("call_1", *LS_V1, text="Listing")) == ToolCall(
        "call_1", "shell", {"command": "ls"}, text="Listing"
    )


def test_a_script_in_2x_words_is_spoken_in_1x_words_to_a_1x_server() -> None:
    assert TOOLS_V1.speak(ToolCall("call_0", "read", {"path": "a.md", "limit": 2})) == ToolCall(
        "call_0", "read", {"filePath": "a.md", "limit": 2}
    )
    assert TOOLS_V1.speak(ToolCall("call_1", "shell", {"command": "ls"})) == ToolCall(
        "call_1", "bash", {"command": "ls"}
    )


def test_what_the_server_offers_is_never_renamed_and_text_stays_text() -> None:
    # A wrong argument of an offered tool goes out as written (a test may want the error).
    odd = ToolCall("call_0", "read", {"filePath": "a.md", "bogus": 1})
    assert TOOLS_V1.speak(odd) == odd
    unknown = ToolCall("call_1", "frobnicate", {"filePath": "a.md"})
    assert TOOLS_V2.speak(unknown) == unknown
    assert TOOLS_V2.speak(Text(DEFAULT_ANSWER)) == Text(DEFAULT_ANSWER)
    assert OfferedTools.of_request(None).speak(odd) == odd  # a title request offers no tools


# Finding 2.2.5.


def test_opencode2_bin_overrides_and_a_cached_install_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENCODE2_BIN", str(tmp_path / "missing"))
    with pytest.raises(InstallError, match="OPENCODE2_BIN=.*missing is not a file"):
        find_or_install_opencode(tmp_path, RELEASE_2)
    monkeypatch.delenv("OPENCODE2_BIN")
    cached = tmp_path / "opencode-2" / "node_modules" / ".bin" / "opencode"
    cached.parent.mkdir(parents=True)
    cached.touch()
    assert find_or_install_opencode(tmp_path, RELEASE_2) == cached


def test_npm_installs_opencode_cli_2_2_5_into_its_own_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An npm of our own on PATH says what it was asked and makes the bin link npm would.
    tools = tmp_path / "bin"
    tools.mkdir()
    asked = tmp_path / "npm-args"
    npm = tools / "npm"
    npm.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"pathlib.Path({str(asked)!r}).write_text(chr(10).join(sys.argv[1:]))\n"
        "bin = pathlib.Path(sys.argv[sys.argv.index('--prefix') + 1], 'node_modules', '.bin')\n"
        "bin.mkdir(parents=True)\n"
        "(bin / 'opencode').touch()\n"
    )
    npm.chmod(0o755)
    monkeypatch.delenv("OPENCODE2_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tools))
    cache = tmp_path / "cache"
    binary = find_or_install_opencode(cache, RELEASE_2)
    assert binary == cache / "opencode-2" / "node_modules" / ".bin" / "opencode"
    assert asked.read_text().split("\n") == [
        "install",
        "--no-audit",
        "--no-fund",
        "--prefix",
        str(cache / "opencode-2"),
        "@opencode/cli@2.2.5",
    ]


# The real 2.2.5.


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


@pytest.mark.real_server
async def test_the_server_is_2_2_5_isolated_and_guarded_by_its_password(
    opencode2_server: OpencodeServer2,
    opencode2_client: ProjectClient2,
    http: aiohttp.ClientSession,
) -> None:
    server = opencode2_server
    info = await opencode2_client.info()
    assert info["version"] == server.info["version"] == "2.2.5"
    assert info["urls"] == [server.url]
    assert server.headers["Authorization"].startswith("Basic ")
    async with http.get(f"{server.url}/api/info") as anonymous:
        assert anonymous.status == 401
        assert anonymous.headers["www-authenticate"] == 'Basic realm="Secure Area"'
    # Every folder the server could write to is the sandbox's.
    assert server.pid is not None and os.getpgid(server.pid) == server.pid
    env = environment_of(server.pid)
    folders = ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")
    for variable in (*folders, "XDG_RUNTIME_DIR"):
        assert Path(env[variable]).parent == server.root, variable
    assert env["OPENCODE_SERVER_PASSWORD"] == server.password
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    config = Path(env["XDG_CONFIG_HOME"]) / "opencode" / "opencode.json"
    assert config.is_file() and MODEL_ID in config.read_text()
    assert await opencode2_client.active() == {}


@pytest.mark.real_server
async def test_a_loop_of_8_identical_reads_runs_8_reads_unguarded(
    opencode2_client: ProjectClient2, scripted_model: ScriptedModel
) -> None:
    session = await opencode2_client.create_session("loop")
    assert session["location"] == {"directory": opencode2_client.directory}
    assert session["model"]["providerID"] == "fake" and session["model"]["id"] == "looper"
    prompt = script([READ_V1], 8)
    await opencode2_client.prompt(session["id"], prompt)
    record = await opencode2_client.wait_idle(session["id"], 60)

    calls = tool_calls(record)
    assert [call["id"] for call in calls] == [f"call_{n}" for n in range(8)]
    assert [call["name"] for call in calls] == ["read"] * 8
    assert [call["state"]["input"] for call in calls] == [{"path": "README.md"}] * 8
    assert [call["state"]["status"] for call in calls] == ["completed"] * 8
    # One run, to its end: no interrupt, no question, no feedback.
    assert [item["type"] for item in record].count("user") == 1
    assert [item["outcome"] for item in record if item["type"] == "idle"] == ["succeeded"]
    assert answers(record) == [DEFAULT_ANSWER]
    assert len(scripted_model.steps(prompt)) == 9  # 8 calls, then the answer


@pytest.mark.real_server
async def test_shell_ls_runs_and_its_result_metadata_says_exit_0(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2
) -> None:
    session = await opencode2_client.create_session("shell")
    await opencode2_client.prompt(session["id"], script([LS_V1], 1))
    record = await opencode2_client.wait_idle(session["id"], 60)

    [call] = tool_calls(record)
    assert (call["name"], call["state"]["input"]) == ("shell", {"command": "ls"})
    assert call["state"]["status"] == "completed"
    assert call["state"]["metadata"]["exit"] == 0
    listing = "".join(part.get("text", "") for part in call["state"]["content"])
    assert listing.split() == sorted(
        p.name for p in opencode2_server.project.iterdir() if p.name != ".git"
    )


@pytest.mark.real_server
async def test_stop_ends_the_server_group_and_the_commands_its_shell_runs(
    opencode2_server: OpencodeServer2, opencode2_client: ProjectClient2
) -> None:
    session = await opencode2_client.create_session()
    sleeper = ("shell", {"command": "echo $$ > sleeper.pid; exec sleep 300"})
    await opencode2_client.prompt(session["id"], script([sleeper], 1))
    sleeper_pid = await read_pid_file(opencode2_server.project / "sleeper.pid", timeout=30)
    pgid = opencode2_server.pid
    assert pgid is not None and alive(sleeper_pid)
    assert session["id"] in await opencode2_client.active()

    await opencode2_server.stop()
    await opencode2_server.stop()  # twice: nothing left to do

    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not alive(sleeper_pid)
    assert opencode2_server.pid is None
