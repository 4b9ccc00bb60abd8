"""The decision endpoint (monitor/shell/decide.py) with a stand-in judge: every request that is
not a well-formed, authorised v1 call is refused with a clear JSON error, and nothing of it
reaches the judge or the counts."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
from pathlib import Path

import aiohttp
import pytest

from monitor.core.plugin_protocol import ALLOW, MAX_BODY, FellOpen, PluginCall, block
from monitor.errors import ConfigError
from monitor.shell.decide import DecideServer, PluginEndpoint
from tests.harness import wait_for

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


async def test_a_request_the_plugin_gave_up_on_is_not_judged(folder):
    # A daemon that was stalled (SIGSTOP) reads requests whose plugin stopped waiting: the
    # call ran. Judging it now would act on calls that already ran.
    path = folder / "plugin.sock"
    recorder = Recorder()
    late: list[PluginCall] = []
    server = DecideServer(
        PluginEndpoint(path),
        recorder.judge,
        lambda c, v: recorder.asked.append(v),
        recorder.refused.append,
        late.append,
    )
    await server.start()
    try:
        body = json.dumps({**CALL, "fell_open": 3}).encode()
        head = (
            f"POST /v1/decide HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        # Sent and dropped while the loop is not running, as by a plugin whose wait ended
        # while the daemon was stopped.
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.connect(str(path))
        gone.sendall(head + body)
        gone.close()
        await wait_for(lambda: late)
        # A live request after it is judged as ever: the endpoint still answers.
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as http:
            async with http.post("http://localhost/v1/decide", json=CALL) as r:
                assert r.status == 200
    finally:
        await server.close()
    assert late == [PluginCall(**{**CALL, "fell_open": 3})]
    assert recorder.judged == [PluginCall(**CALL)]


def test_fell_open_counts_each_call_once_across_resends():
    # Stalled: 48 requests, each answered too late, each reporting the running total (the
    # calls let through before it); then one answered in time reports all 48.
    counted = FellOpen()
    total = sum(counted.count("/p", n, answered=False) for n in range(48))
    total += counted.count("/p", 48, answered=True)
    assert total == 48
    # Answered in time, the plugin starts from nothing: 2 new ones are 2.
    assert counted.count("/p", 2, answered=True) == 2
