"""The decision endpoint (monitor/shell/decide.py) with a stand-in judge: every request that is
not a well-formed, authorised v1 call is refused with a clear JSON error, and nothing of it
reaches the judge or the counts."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import aiohttp
import pytest

from monitor.core.plugin_protocol import ALLOW, MAX_BODY, PluginCall, block
from monitor.errors import ConfigError
from monitor.shell.decide import DecideServer, PluginEndpoint, Unasked, state_dir

CALL = {
    "session_id": "ses_dd4d5c831ffemmgMvdYdtbM3cW",
    "call_id": "call_0",
    "tool": "bash",
    "args": {"command": "echo x >> out.txt"},
    "directory": "/home/dev/project",
}
JSON = {"Content-Type": "application/json"}


class Recorder:
    def __init__(self):
        self.judged: list[PluginCall] = []
        self.asked = []
        self.refused = []

    def judge(self, call):
        self.judged.append(call)
        return block("stop it") if call.tool == "bash" else ALLOW


@pytest.fixture
def folder():
    with tempfile.TemporaryDirectory(prefix="olm-") as name:
        yield Path(name)


async def serve(endpoint):
    recorder = Recorder()
    server = DecideServer(
        endpoint, recorder.judge, lambda c, v: recorder.asked.append(v), recorder.refused.append
    )
    await server.start()
    return server, recorder


async def test_unix_socket_is_private_and_answers_a_call(folder):
    path = folder / "run" / "plugin.sock"
    server, recorder = await serve(PluginEndpoint(path))
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as http:
            async with http.post("http://localhost/v1/decide", json={**CALL, "fell_open": 2}) as r:
                assert (r.status, await r.json()) == (
                    200,
                    {"verdict": "block", "feedback": "stop it"},
                )
        assert recorder.judged == [PluginCall(**{**CALL, "fell_open": 2})]
    finally:
        await server.close()
    assert not path.exists()


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "error"),
    [
        ("POST", "/v1/decide", JSON, b"{not json", 400, "body is not JSON"),
        ("POST", "/v1/decide", JSON, b"[]", 400, "body must be a JSON object"),
        ("POST", "/v1/decide", JSON, json.dumps({**CALL, "session_id": "../x"}).encode(), 400,
         "session_id must be"),
        ("POST", "/v1/decide", JSON, json.dumps({**CALL, "args": "x"}).encode(), 400,
         "args must be a JSON object"),
        ("POST", "/v1/decide", JSON, json.dumps({**CALL, "extra": 1}).encode(), 400,
         "unknown field(s): extra"),
        ("POST", "/v1/decide", JSON, json.dumps({**CALL, "fell_open": -1}).encode(), 400,
         "fell_open must be"),
        ("POST", "/v1/decide", {"Content-Type": "text/plain"}, json.dumps(CALL).encode(), 415,
         "expected Content-Type application/json"),
        ("POST", "/v1/decide", JSON, b"{" + b" " * MAX_BODY + b"}", 413, "request body over"),
        ("POST", "/v2/decide", JSON, json.dumps(CALL).encode(), 404,
         "unsupported protocol version in /v2/decide"),
        ("GET", "/v1/decide", {}, b"", 405, "takes POST"),
    ],
)  # fmt: skip
async def test_bad_requests_refused_and_nothing_judged(
    folder, method, path, headers, body, status, error
):
    socket_path = folder / "plugin.sock"
    server, recorder = await serve(PluginEndpoint(socket_path))
    try:
        connector = aiohttp.UnixConnector(str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.request(
                method, "http://localhost" + path, data=body, headers=headers
            ) as r:
                assert r.status == status
                assert error in (await r.json())["error"]
    finally:
        await server.close()
    assert recorder.judged == [] and recorder.asked == []
    assert [refused.status for refused in recorder.refused] == [status]


async def test_tcp_needs_the_token(folder):
    token_file = folder / "token"
    server, recorder = await serve(PluginEndpoint(None, "127.0.0.1", 0, token_file))
    try:
        token = token_file.read_text().strip()
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600 and len(token) >= 32
        url = f"http://127.0.0.1:{server.port}/v1/decide"
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                async with http.post(url, json=CALL, headers=headers) as r:
                    assert (r.status, await r.json()) == (
                        401,
                        {"error": "missing or wrong bearer token"},
                    )
            assert recorder.judged == []
            async with http.post(url, json=CALL, headers={"Authorization": f"Bearer {token}"}) as r:
                assert r.status == 200 and (await r.json())["verdict"] == "block"
        assert len(recorder.judged) == 1
    finally:
        await server.close()


async def test_a_live_socket_is_not_taken_over(folder):
    path = folder / "plugin.sock"
    first, _ = await serve(PluginEndpoint(path))
    try:
        with pytest.raises(ConfigError, match="another monitor serves plugins there"):
            await serve(PluginEndpoint(path))
    finally:
        await first.close()


async def test_an_open_folder_is_refused(folder):
    open_folder = folder / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(ConfigError, match="closed to others"):
        await serve(PluginEndpoint(open_folder / "plugin.sock"))


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        # systemd's RuntimeDirectory= first: a sandboxed service has no writable home.
        (
            {
                "RUNTIME_DIRECTORY": "/run/olm:/run/other",
                "XDG_RUNTIME_DIR": "/run/user/1",
                "STATE_DIRECTORY": "/var/lib/olm",
                "HOME": "/h",
            },
            "/run/olm",
        ),
        # A person's login: the folder a user unit's RuntimeDirectory= is.
        (
            {"XDG_RUNTIME_DIR": "/run/user/1", "STATE_DIRECTORY": "/var/lib/olm", "HOME": "/h"},
            "/run/user/1/opencode-loop-monitor",
        ),
        ({"STATE_DIRECTORY": "/var/lib/olm", "HOME": "/h"}, "/var/lib/olm"),
        ({"XDG_STATE_HOME": "/s", "HOME": "/h"}, "/s/opencode-loop-monitor"),
        # launchd: HOME alone.
        ({"HOME": "/Users/u"}, "/Users/u/.local/state/opencode-loop-monitor"),
    ],
)
def test_state_dir_prefers_what_the_manager_made(environ, expected):
    assert state_dir(environ) == Path(expected)


class Calls:
    """The tracker's count of calls, as `Unasked.check` reads it: counted reads too."""

    def __init__(self) -> None:
        self.count = 0
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.count


def test_unasked_counts_only_calls_after_its_first_check():
    calls, unasked = Calls(), Unasked(after=5, every=1)
    calls.count = 7  # read back from the server's record at connect: ran before us
    assert unasked.check(calls, False, 0) is None
    assert unasked.check(calls, False, 10) is None  # nothing new: not counting
    calls.count = 9
    assert unasked.check(calls, False, 11) is None  # counting from here
    assert unasked.check(calls, False, 15) is None  # 4 s of calls
    assert unasked.check(calls, False, 16) == 2
    assert (unasked.done, unasked.said) == (True, 2)
    assert unasked.check(calls, False, 30) is None  # said once


def test_unasked_stops_at_the_first_plugin_request():
    calls, unasked = Calls(), Unasked(after=5, every=1)
    assert unasked.check(calls, False, 0) is None
    calls.count = 3
    assert unasked.check(calls, False, 1) is None  # counting
    assert unasked.check(calls, True, 2) is None
    assert unasked.done and unasked.said is None
    assert unasked.check(calls, False, 100) is None


def test_unasked_counts_calls_at_most_once_per_interval():
    # Counting walks every session: not at every frame.
    calls, unasked = Calls(), Unasked(after=5, every=1)
    for now in (0, 0.2, 0.5, 0.99, 1.0, 1.5):
        unasked.check(calls, False, now)
    assert calls.reads == 2
