"""The sandbox: a scripted model and a real OpenCode server that other tests build on."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from monitor.errors import ServerError
from monitor.kit.sandbox import (
    LISTENING,
    InstallError,
    OpencodeServer,
    ServerStartError,
    default_cache_dir,
    find_or_install_bun,
    find_or_install_opencode,
    tool_parts,
)
from monitor.kit.scripted_model import (
    DEFAULT_ANSWER,
    OVERFLOW_TOKENS,
    UNSCRIPTED_ANSWER,
    ParallelCalls,
    ScriptedModel,
    Text,
    ToolCall,
    decide,
    find_script,
    script,
)
from tests.harness import alive, read_pid_file

READ = ("read", {"filePath": "README.md"})
ECHO = ("bash", {"command": "echo hi", "description": "Say hi"})
LOOP = script([READ], 2, after_feedback="loop")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def step(n: int) -> list[dict[str, Any]]:
    """An assistant tool call and its result, as OpenCode sends them back to the model."""
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": f"call_{n}", "type": "function"}],
        },
        {"role": "tool", "tool_call_id": f"call_{n}", "content": "output"},
    ]


# The scripted model's decisions, without a network.


@pytest.mark.parametrize(
    ("done", "expected"),
    [
        (0, ToolCall("call_0", *READ)),
        (1, ToolCall("call_1", *ECHO)),
        (2, ToolCall("call_2", *READ)),
        (3, Text(DEFAULT_ANSWER)),
    ],
)
def test_the_ith_call_follows_the_pattern_until_calls_are_spent(
    done: int, expected: object
) -> None:
    script_ = find_script(script([READ, ECHO], 3))
    assert script_ is not None
    messages = [{"role": "system", "content": "prompt"}, user("s")] + [
        m for n in range(done) for m in step(n)
    ]
    assert decide(script_, messages) == expected


def test_a_parallel_step_makes_several_calls_at_once() -> None:
    script_ = find_script(script([READ], 5, parallel=4))
    assert script_ is not None
    assert decide(script_, [user("s")]) == ParallelCalls(
        tuple(ToolCall(f"call_{n}", *READ) for n in range(4))
    )
    # The last step holds what is left of `calls`: a single call is sent as one.
    after_four = [user("s"), *(m for n in range(4) for m in step(n))]
    assert decide(script_, after_four) == ToolCall("call_4", *READ)


def test_feedback_gets_the_answer_by_default() -> None:
    script_ = find_script(script([READ], 5, answer="Changing approach."))
    assert script_ is not None
    assert decide(script_, [user("s"), *step(0), user("you are looping")]) == Text(
        "Changing approach."
    )


def test_feedback_restarts_the_pattern_when_told_to_loop() -> None:
    script_ = find_script(LOOP)
    assert script_ is not None
    feedback = [user(LOOP), *step(0), *step(1), user("you are looping")]
    assert decide(script_, feedback) == ToolCall("call_0", *READ)
    assert decide(script_, [*feedback, *step(0)]) == ToolCall("call_1", *READ)
    assert decide(script_, [*feedback, *step(0), *step(1)]) == Text(DEFAULT_ANSWER)


@pytest.mark.parametrize(
    "text",
    [
        LOOP,
        json.dumps(LOOP),  # how `opencode run` delivers it
        f"Please follow this script:\n{LOOP}\nThanks.",
    ],
)
def test_script_is_found_quoted_or_wrapped(text: str) -> None:
    assert find_script(text) == find_script(LOOP)


@pytest.mark.parametrize(
    "text", ["read the readme", '{"pattern": [], "calls": 3}', '{"calls": 3}', '"just text"']
)
def test_text_without_a_usable_script_is_not_one(text: str) -> None:
    assert find_script(text) is None


# The scripted model over HTTP, in-process.


async def sse_data(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    async with http.post(f"{url}/chat/completions", json=body) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        text = await response.text()
    frames = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert frames[-1] == "[DONE]"
    return [json.loads(frame) for frame in frames[:-1]]


async def test_model_streams_a_tool_call_then_its_finish(
    scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    body = {
        "model": "looper",
        "stream": True,
        "tools": [{"type": "function"}],
        "messages": [user(LOOP)],
    }
    chunks = await sse_data(http, scripted_model.url, body)
    assert [chunk["object"] for chunk in chunks] == ["chat.completion.chunk"] * 2
    call = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert (call["id"], call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "call_0",
        *READ,
    )
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None, "tool_calls"]


async def test_model_answers_a_title_request_with_text_and_keeps_the_script(
    scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    # What OpenCode 1.18.33 sends: its instruction as first user message, then the prompt; no tools.
    messages = [
        {"role": "system", "content": "You are a title generator."},
        user("Generate a title:\n"),
        user(LOOP),
    ]
    chunks = await sse_data(
        http, scripted_model.url, {"model": "looper", "stream": True, "messages": messages}
    )
    assert chunks[0]["choices"][0]["delta"]["content"] == UNSCRIPTED_ANSWER
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    [request] = scripted_model.requests
    assert (request.conversation, request.scripted) == (LOOP, False)


async def test_compact_after_overflows_once_and_the_summary_carries_the_script_on(
    scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    prompt = script([READ], 6, compact_after=2)
    tools = {"model": "looper", "stream": True, "tools": [{"type": "function"}]}

    async def usage(messages: list[dict[str, Any]]) -> object:
        chunks = await sse_data(http, scripted_model.url, tools | {"messages": messages})
        return chunks[-1].get("usage", {}).get("prompt_tokens")

    # The step that makes the 2nd call reports a usage past any limit; the others none.
    assert [
        await usage([user(prompt), *(m for n in range(k) for m in step(n))]) for k in (0, 1)
    ] == [
        None,
        OVERFLOW_TOKENS,
    ]
    # OpenCode's request for a summary (no tools) gets the script, as the prompt wrote it.
    asked = [user(f"Here is the conversation so far:\n<conversation>\n[User]: {prompt}\n")]
    chunks = await sse_data(
        http, scripted_model.url, {"model": "looper", "stream": True, "messages": asked}
    )
    assert chunks[0]["choices"][0]["delta"]["content"] == prompt
    # After it: the question, the summary, the server's "continue"; the 3rd call is next,
    # and the 6th call the last, with no second overflow.
    after = [
        user("What did we do so far?"),
        {"role": "assistant", "content": prompt},
        user("Continue if you have next steps"),
    ]
    chunks = await sse_data(http, scripted_model.url, tools | {"messages": after})
    assert chunks[0]["choices"][0]["delta"]["tool_calls"][0]["id"] == "call_2"
    assert "usage" not in chunks[-1]
    done = [*after, *(m for n in range(2, 6) for m in step(n))]
    chunks = await sse_data(http, scripted_model.url, tools | {"messages": done})
    assert chunks[0]["choices"][0]["delta"]["content"] == DEFAULT_ANSWER
    # The model's feedback after the compaction gets the answer; a new task is followed.
    feedback = [*after, *step(2), user("you are looping")]
    chunks = await sse_data(http, scripted_model.url, tools | {"messages": feedback})
    assert chunks[0]["choices"][0]["delta"]["content"] == DEFAULT_ANSWER
    task = [*after, *step(2), user(script([ECHO], 1))]
    chunks = await sse_data(http, scripted_model.url, tools | {"messages": task})
    call = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == ("call_0", "bash")
    assert [r.conversation for r in scripted_model.requests if r.scripted][-4:-1] == [prompt] * 3


# A real server.


@pytest.mark.real_server
async def test_scripted_session_runs_each_tool_in_order(
    opencode_server: OpencodeServer, scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    client = opencode_server.client(http)
    session = await client.create_session()
    assert session["directory"] == opencode_server.directory
    prompt = script([READ, ECHO], 6)
    await client.prompt_async(session["id"], prompt)

    messages = await client.wait_idle(session["id"], timeout=60)

    ran = [
        (part["tool"], part["state"]["status"], part["state"]["input"])
        for part in tool_parts(messages)
    ]
    assert ran == [("read", "completed", READ[1]), ("bash", "completed", ECHO[1])] * 3
    assert [part["state"]["output"] for part in tool_parts(messages)][1::2] == ["hi\n"] * 3
    assert messages[-1]["parts"][-2]["text"] == DEFAULT_ANSWER
    assert [request.reply for request in scripted_model.steps(prompt)][-1] == Text(DEFAULT_ANSWER)
    assert len(scripted_model.steps(prompt)) == 7


@pytest.mark.real_server
async def test_model_loops_again_after_feedback_when_scripted_to(
    opencode_server: OpencodeServer, scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    client = opencode_server.client(http)
    session = await client.create_session()
    await client.prompt_async(session["id"], LOOP)
    await client.wait_idle(session["id"], timeout=60)
    await client.prompt_async(session["id"], "You are repeating yourself.")

    messages = await client.wait_idle(session["id"], timeout=60, user_messages=2)

    assert [part["callID"] for part in tool_parts(messages)] == ["call_0", "call_1"] * 2
    assert [request.last_user for request in scripted_model.steps(LOOP)] == [LOOP] * 3 + [
        "You are repeating yourself."
    ] * 3


@pytest.mark.real_server
async def test_stop_ends_the_server_group_and_the_commands_it_runs(
    opencode_server: OpencodeServer, http: aiohttp.ClientSession
) -> None:
    client = opencode_server.client(http)
    session = await client.create_session()
    # The bash tool runs its command in a session of its own, outside the server's group.
    sleeper = ("bash", {"command": "echo $$ > sleeper.pid; exec sleep 300", "description": "Sleep"})
    await client.prompt_async(session["id"], script([sleeper], 1))
    sleeper_pid = await read_pid_file(opencode_server.project / "sleeper.pid", timeout=30)
    pgid = opencode_server.pid
    assert pgid is not None and alive(sleeper_pid)

    await opencode_server.stop()
    await opencode_server.stop()

    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not alive(sleeper_pid)
    assert opencode_server.pid is None


@pytest.mark.real_server
async def test_restart_keeps_url_and_sessions(
    opencode_server: OpencodeServer, http: aiohttp.ClientSession
) -> None:
    client = opencode_server.client(http)
    session = await client.create_session()
    url = opencode_server.url

    await opencode_server.stop()
    with pytest.raises(ServerError, match="ClientConnectorError"):
        await client.status()
    await opencode_server.start()

    assert opencode_server.url == url
    assert await client.status() == {}
    async with http.get(
        f"{url}/session/{session['id']}", params={"directory": opencode_server.directory}
    ) as found:
        assert (found.status, (await found.json())["id"]) == (200, session["id"])


@pytest.mark.real_server
async def test_password_is_required_and_the_client_sends_it(
    opencode_bin: Path, scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    env = {"OPENCODE_SERVER_PASSWORD": "sesame"}
    async with OpencodeServer(opencode_bin, scripted_model.url, env_extra=env) as server:
        async with http.get(f"{server.url}/session/status") as anonymous:
            assert anonymous.status == 401
        assert await server.client(http).status() == {}
        root = server.root
    assert not root.exists()


async def test_a_server_that_exits_at_once_fails_start_with_its_log(
    scripted_model: ScriptedModel,
) -> None:
    server = OpencodeServer(Path("/bin/false"), scripted_model.url)
    with pytest.raises(ServerStartError, match="exited with 1"):
        async with server:
            pass
    assert server.pid is None


# A stand-in for `opencode serve`: it listens at once but, like the real one starting, takes
# requests only once it has said so; a request that came before is written to `early`.
SLOW_START = """\
import http.server, os, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
said = threading.Event()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if not said.is_set():
            open("early", "a").write(self.path + "\\n")
        said.wait()
        body = b'{"directory": "/project"}' if self.path.startswith("/path") else b"[]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
time.sleep(1.0)
said.set()
print(f"opencode server listening on http://127.0.0.1:{port}", flush=True)
time.sleep(3600)
"""


async def test_start_asks_only_once_the_server_says_it_listens(
    tmp_path: Path, scripted_model: ScriptedModel
) -> None:
    binary = tmp_path / "opencode"
    binary.write_text(f"#!{sys.executable}\n{SLOW_START}")
    binary.chmod(0o755)
    async with OpencodeServer(binary, scripted_model.url) as server:
        assert server.directory == "/project"
        assert LISTENING in server.log_path.read_bytes()
        early = server.project / "early"
        assert not early.exists(), early.read_text()


def test_opencode_bin_overrides_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binary = tmp_path / "my-opencode"
    binary.touch()
    monkeypatch.setenv("OPENCODE_BIN", str(binary))
    assert find_or_install_opencode(tmp_path) == binary
    monkeypatch.setenv("OPENCODE_BIN", str(tmp_path / "missing"))
    with pytest.raises(InstallError, match="missing is not a file"):
        find_or_install_opencode(tmp_path)


def test_a_cached_install_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPENCODE_BIN", raising=False)
    cached = tmp_path / "node_modules" / ".bin" / "opencode"
    cached.parent.mkdir(parents=True)
    cached.touch()
    assert find_or_install_opencode(tmp_path) == cached


def test_without_npm_the_install_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OPENCODE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InstallError, match="npm not found"):
        find_or_install_opencode(tmp_path / "cache")


def test_bun_bin_overrides_the_cache_and_a_cached_bun_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BUN_BIN", str(tmp_path / "missing"))
    with pytest.raises(InstallError, match="missing is not a file"):
        find_or_install_bun(tmp_path)
    monkeypatch.delenv("BUN_BIN")
    cached = tmp_path / "bun" / "node_modules" / ".bin" / "bun"  # apart from opencode's install
    cached.parent.mkdir(parents=True)
    cached.touch()
    assert find_or_install_bun(tmp_path) == cached
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InstallError, match="npm not found"):
        find_or_install_bun(tmp_path / "elsewhere")


def test_plugin_dependencies_are_kept_once_per_binary_and_seeded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from monitor.kit.sandbox import _keep_plugin_dependencies, _seed_plugin_dependencies

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    binary = tmp_path / "opencode"
    binary.write_text("1")
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for folder in (first, second, third):
        folder.mkdir()
    _keep_plugin_dependencies(binary, first)  # nothing installed: nothing kept
    _seed_plugin_dependencies(binary, second)
    assert sorted(os.listdir(second)) == []
    (first / "node_modules" / "@opencode-ai").mkdir(parents=True)
    (first / "node_modules" / "@opencode-ai" / "plugin.js").write_text("x")
    (first / "package.json").write_text("{}")
    _keep_plugin_dependencies(binary, first)
    _seed_plugin_dependencies(binary, second)
    assert (second / "node_modules" / "@opencode-ai" / "plugin.js").read_text() == "x"
    assert (second / "package.json").read_text() == "{}"
    binary.write_text("another release")  # another binary: its own install
    _seed_plugin_dependencies(binary, third)
    assert sorted(os.listdir(third)) == []


def test_the_default_cache_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "opencode-loop-monitor"


async def test_model_streams_reasoning_then_text_in_chunks_with_a_pause(
    scripted_model: ScriptedModel, http: aiohttp.ClientSession
) -> None:
    prompt = script([READ], 0, answer="ab", repeat=3, reasoning="xyz", chunk=4, chunk_delay=0.05)
    body = {"model": "looper", "stream": True, "tools": [{"type": "function"}]}
    started = time.monotonic()
    chunks = await sse_data(http, scripted_model.url, body | {"messages": [user(prompt)]})
    took = time.monotonic() - started
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas == [
        {"role": "assistant", "reasoning_content": "xyz"},
        {"content": "abab"},
        {"content": "ab"},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert took >= 3 * 0.05  # a pause before every frame but the first


def test_say_and_think_come_with_every_tool_call() -> None:
    script_ = find_script(script([READ], 2, say="Next.", think="Hm."))
    assert script_ is not None
    assert decide(script_, [user("s")]) == ToolCall("call_0", *READ, "Next.", "Hm.")
