"""The decision endpoint (monitor/shell/decide.py) with a stand-in judge: every request that is
not a well-formed, authorised v1 call is refused with a clear JSON error, and nothing of it
reaches the judge or the counts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import secrets
import socket
import stat
import subprocess
from pathlib import Path

import aiohttp
import pytest
import structlog.testing
from aiohttp import web

from monitor.core.plugin_protocol import (
    ALLOW,
    MAX_BODY,
    PROOF_HEADER,
    FellOpen,
    PluginCall,
    answer_proof,
    block,
    question_mac,
)
from monitor.core.plugin_stats import PluginStats, Unasked
from monitor.errors import ConfigError
from monitor.shell import decide, endpoint, metrics_server
from monitor.shell.acting import Role
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import PluginEndpoint, state_dir
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


@pytest.mark.parametrize("fell_open", [-3, -1_000_000, 10**12, "2", True, None])
async def test_a_fell_open_count_out_of_range_never_costs_the_call_its_judgement(folder, fell_open):
    # Issue 33: an older plugin's count went below zero after a stall and a parallel burst;
    # every later question was refused (400), so every later call ran judged by the plugin's
    # own rule only. The count is a report: out of range, it counts as nothing.
    path = folder / "run" / "plugin.sock"
    server, recorder = await serve(PluginEndpoint(path))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as http:
            body = {**CALL, "fell_open": fell_open}
            async with http.post("http://localhost/v1/decide", json=body) as r:
                assert (r.status, await r.json()) == (
                    200,
                    {"verdict": "block", "feedback": "stop it"},
                )
        assert recorder.judged == [PluginCall(**{**CALL, "fell_open": 0}, unusable=("fell_open",))]
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "error"),
    [
        ("POST", "/v1/decide", JSON, b"{not json", 400, "body is not JSON"),
        ("POST", "/v1/decide", JSON, b"[]", 400, "body must be a JSON object"),
        ("POST", "/v1/decide", JSON, json.dumps({**CALL, "session_id": "../x"}).encode(), 400,
         "session_id must be"),
        ("POST", "/v1/decide", JSON, json.dumps({**CALL, "args": "x"}).encode(), 400,
         "args must be a JSON object"),
        ("POST", "/v1/decide", {"Content-Type": "text/plain"}, json.dumps(CALL).encode(), 415,
         "expected Content-Type application/json"),
        ("POST", "/v1/decide", JSON, b"{" + b" " * MAX_BODY + b"}", 413, "request body over"),
        ("POST", "/v2/decide", JSON, json.dumps(CALL).encode(), 404,
         "unsupported protocol version in /v2/decide"),
        ("GET", "/v1/decide", {}, b"", 405, "takes POST"),
        # Deeper than the interpreter's stack: a 500 and a traceback before issue 25; read
        # since issue 33 (monitor.core.deep_json), and not an object.
        ("POST", "/v1/decide", JSON, b"[" * 100_000 + b"]" * 100_000, 400,
         "body must be a JSON object"),
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


@pytest.mark.parametrize(
    "odd",
    [
        {"directory": "/p\ud800"},
        {"tool": "\udfff"},
        {"call_id": "call_\ud800"},
        {"args": {"command": "echo \udc80", "\ud800": ["\udfff"]}},
        {"tool": "bash\x00\x1b[31m", "directory": "/p\nq\u202e"},
    ],
)
async def test_a_call_with_lone_surrogates_or_control_characters_is_judged(folder, odd):
    # Issue 33: valid JSON a model can emit. Refused with 400 (and before issue 25 not
    # answered at all), such a call ran judged by the plugin's own rule only.
    path = folder / "plugin.sock"
    server, recorder = await serve(PluginEndpoint(path))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as http:
            body = json.dumps({**CALL, **odd})  # escaped: \ud800 in the JSON text
            async with http.post("http://localhost/v1/decide", data=body, headers=JSON) as r:
                assert r.status == 200
                assert (await r.json())["verdict"] == (
                    "block" if odd.get("tool", "bash") == "bash" else "allow"
                )
        assert recorder.judged == [PluginCall(**{**CALL, **odd})]  # as sent, nothing replaced
        assert recorder.refused == []
    finally:
        await server.close()


@pytest.mark.parametrize("size", [MAX_BODY + 1, 2 * MAX_BODY, 8 * MAX_BODY])
@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_gets_its_413_when_sent_whole_first(folder, size, chunked):
    # Issue 33: a client that sends its whole body before it reads (Bun's fetch does) was
    # reset: the 413 was sent, the unread body made the close a reset, and the client read
    # nothing. One request per connection, the plugin's way.
    path = folder / "plugin.sock"
    server, recorder = await serve(PluginEndpoint(path))
    try:
        body = json.dumps({**CALL, "args": {"content": "x" * size}}).encode()
        reader, writer = await asyncio.open_unix_connection(str(path))
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
        writer.write(
            "POST /v1/decide HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
            f"\r\n{framing}\r\n\r\n".encode()
        )
        step = 1 << 16
        for start in range(0, len(body), step):
            part = body[start : start + step]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        status, text = await answer(reader)
        assert (status, json.loads(text)) == (413, {"error": f"request body over {MAX_BODY} bytes"})
        assert await closed_within(reader, 1.0)
        writer.close()
    finally:
        await server.close()
    assert recorder.judged == [] and [r.status for r in recorder.refused] == [413]


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
                        {"error": "missing or wrong bearer token or signature"},
                    )
            # The right token in the clear: what a plugin file from before the signature
            # sends (issue 46: an upgrade left it behind). Refused, with what to do.
            async with http.post(url, json=CALL, headers={"Authorization": f"Bearer {token}"}) as r:
                assert (r.status, await r.json()) == (
                    401,
                    {
                        "error": "this plugin sends the token in the clear (a plugin file of an "
                        "earlier release, left behind by an upgrade): run `opencode-loop-monitor "
                        "plugin install` again and restart OpenCode"
                    },
                )
        assert recorder.judged == []
    finally:
        await server.close()


async def test_over_tcp_a_signed_question_gets_a_proven_answer_and_a_forged_one_none(folder):
    # Issue 33: the plugin sent the token itself, to whoever held the port. Now it signs
    # each question, and the daemon proves each answer, with the token.
    token_file = folder / "token"
    server, recorder = await serve(PluginEndpoint(None, "127.0.0.1", 0, token_file))
    try:
        token = token_file.read_text().strip()
        url = f"http://127.0.0.1:{server.port}/v1/decide"
        body = json.dumps(CALL).encode()

        def signed(nonce: str, mac: str | None = None) -> dict[str, str]:
            mac = mac or question_mac(token, nonce, body)
            return {**JSON, "Authorization": f"OLM-HMAC {nonce} {mac}"}

        async with aiohttp.ClientSession() as http:
            nonce = "a" * 32
            async with http.post(url, data=body, headers=signed(nonce)) as r:
                answer = await r.read()
                assert (r.status, json.loads(answer)["verdict"]) == (200, "block")
                assert r.headers[PROOF_HEADER] == answer_proof(token, nonce, answer)
            refusals = [
                signed("a" * 32),  # the same question again: a replay
                signed("b" * 32, question_mac(token, "b" * 32, body + b" ")),  # another body
                signed("c" * 32, question_mac("guessed", "c" * 32, body)),  # another token
                {**JSON, "Authorization": "OLM-HMAC short " + "0" * 64},  # malformed
            ]
            for headers in refusals:
                async with http.post(url, data=body, headers=headers) as r:
                    assert r.status == 401 and PROOF_HEADER not in r.headers
        assert len(recorder.judged) == 1
        assert [r.message for r in recorder.refused] == [
            "question asked before (a replay)",
            *["missing or wrong bearer token or signature"] * 3,
        ]
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


def test_a_directory_label_is_cleaned() -> None:
    stats = PluginStats()
    call = PluginCall(**{**CALL, "directory": "/p\ud800\nx" + "y" * 300})
    label, _ = stats.asked(call, ALLOW, 5.0)
    assert label == "/p x" + "y" * 251 + "…"
    assert label.encode("utf-8") and stats.view()[0]["directory"] == label


# Raw HTTP on loopback, so a test can send a head in pieces, a body slowly, or nothing.
def head(token: str, body: bytes, length: int | None = None) -> bytes:
    """A head signing `body` (of `length` bytes as sent, when only a part of it is)."""
    nonce = secrets.token_hex(16)
    length = len(body) if length is None else length
    return (
        "POST /v1/decide HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: OLM-HMAC {nonce} {question_mac(token, nonce, body)}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def ask(reader, writer, token: str) -> tuple[int, bytes]:
    """One keep-alive request on an open connection: its status and body."""
    body = json.dumps(CALL).encode()
    writer.write(head(token, body) + body)
    return await answer(reader)


async def answer(reader) -> tuple[int, bytes]:
    status_line = await asyncio.wait_for(reader.readline(), 5)
    length = 0
    while (line := await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return int(status_line.split()[1]), await reader.readexactly(length)


async def closed_within(reader, seconds: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.fixture
async def tcp(folder, monkeypatch, request):
    """A TCP endpoint with short limits: 4 connections, 0.3 s for a body and (unless the
    test gives another) for a head."""
    monkeypatch.setattr(decide, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(decide, "IDLE_S", getattr(request, "param", 0.3))
    monkeypatch.setattr(decide, "BODY_S", 0.3)
    token_file = folder / "token"
    server, recorder = await serve(PluginEndpoint(None, "127.0.0.1", 0, token_file))
    try:
        yield server, recorder, token_file.read_text().strip()
    finally:
        await server.close()


@pytest.mark.parametrize("tcp", [30.0], indirect=True)
async def test_a_flood_of_idle_connections_pushes_out_its_own_not_the_plugins(tcp) -> None:
    server, recorder, token = tcp
    plugin = await asyncio.open_connection("127.0.0.1", server.port)
    assert (await ask(*plugin, token))[0] == 200
    flood = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(10)]
    try:
        # Over the cap of 4, each new one closed the oldest untrusted one: the first seven
        # are gone, the last three and the plugin's remain.
        closed = [await closed_within(reader, 5) for reader, _ in flood[:7]]
        assert closed == [True] * 7
        # The seventh went when the tenth came: every one has been taken by now, each over
        # the cap pushing one out, and no more than seven were (nor is any other at its end).
        assert [refused.status for refused in recorder.refused] == [503] * 7
        assert [reader.at_eof() for reader, _ in flood[7:]] == [False] * 3
        assert (await ask(*plugin, token))[0] == 200
        assert len(recorder.judged) == 2
    finally:
        for _, writer in [plugin, *flood]:
            writer.close()


async def test_a_head_sent_slowly_is_cut_off(tcp) -> None:
    server, recorder, token = tcp
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"POST /v1/decide HTTP/1.1\r\n")

        async def trickle() -> None:
            for n in range(100):
                writer.write(f"X-Slow-{n}: 1\r\n".encode())
                await asyncio.sleep(0.05)

        dripping = asyncio.create_task(trickle())
        assert await closed_within(reader, 2)  # 0.3 s, not the 75 s of aiohttp's default
        dripping.cancel()
        assert recorder.judged == []
    finally:
        writer.close()


async def test_a_body_sent_slowly_gets_408_and_the_connection_closes(tcp) -> None:
    server, recorder, token = tcp
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(head(token, b"", 100) + b'{"session_id"')
        status, body = await answer(reader)
        assert (status, json.loads(body)) == (
            408,
            {"error": "request body not received within 0.3 s"},
        )
        assert await closed_within(reader, 1)
        assert [refused.status for refused in recorder.refused] == [408]
    finally:
        writer.close()


async def test_a_refused_request_closes_its_connection(tcp) -> None:
    server, recorder, _ = tcp
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        status, _ = await ask(reader, writer, "wrong")
        assert status == 401
        # Closed at once (not after the 0.3 s idle limit: a wrong token is not asked again).
        assert await closed_within(reader, 0.1)
    finally:
        writer.close()


def test_a_token_file_is_read_back_and_must_be_ours_closed_and_no_link(folder) -> None:
    path = folder / "token"
    token = endpoint.read_or_create_token(path)
    assert endpoint.read_or_create_token(path) == token
    link = folder / "link"
    link.symlink_to(path)
    with pytest.raises(ConfigError, match="link: cannot read"):
        endpoint.read_or_create_token(link)  # followed before issue 25
    path.chmod(0o620)
    with pytest.raises(ConfigError, match="open to others"):
        endpoint.read_or_create_token(path)  # writable by the group: accepted before issue 25


def test_an_empty_token_file_left_by_a_crash_is_replaced(folder) -> None:
    # Issue 33: a token file created and never written (a full disk, a crash) made every
    # later start refuse ("is empty or not a token") until a person deleted it.
    path = folder / "token"
    path.touch(mode=0o600)
    token = endpoint.read_or_create_token(path)
    assert len(token) >= 32 and path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["token"]
    assert endpoint.read_or_create_token(path) == token


def test_a_token_write_that_fails_leaves_nothing_in_the_way(folder, monkeypatch) -> None:
    # The disk fills after a few bytes: the file is never seen half written.
    path = folder / "token"
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if len(data) > 4:
            return real_write(fd, data[:4])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ConfigError, match="cannot write .*nothing was left there"):
        endpoint.read_or_create_token(path)
    assert list(folder.iterdir()) == []
    monkeypatch.undo()
    assert len(endpoint.read_or_create_token(path)) >= 32


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a tmpfs of 8 KiB, filled up; the filler file's path comes with it."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to mount a small tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k,mode=700", "tmpfs", mount], check=True)
    try:
        filler = mount / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"x" * 1024)
        os.close(fd)
        yield mount, filler
    finally:
        subprocess.run(["umount", "-l", mount], check=True)


def test_a_full_disk_leaves_nothing_that_blocks_the_next_start(full_disk) -> None:
    folder, filler = full_disk
    path = folder / "token"
    with pytest.raises(ConfigError, match="cannot write .*No space left"):
        endpoint.read_or_create_token(path)  # an OSError and an empty file before issue 33
    assert sorted(p.name for p in folder.iterdir()) == ["filler"]
    # The acting monitor's lock needs no space: only its pid (for `status`) is lost.
    role = Role(folder, "http://127.0.0.1:4096")
    assert role.try_acting() and role.holder() is None
    role.close()
    filler.unlink()
    token = endpoint.read_or_create_token(path)
    assert path.read_text() == token + "\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to plant a file of another user")
def test_a_token_file_planted_by_another_user_is_refused(folder) -> None:
    import pwd

    path = folder / "token"
    path.write_text("known-to-them\n")
    path.chmod(0o600)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(ConfigError, match="belongs to another user"):
        endpoint.read_or_create_token(path)


async def test_no_request_breaks_metrics_or_status(folder) -> None:
    # Issue 25: one request whose directory held a lone surrogate made /metrics answer 500
    # from then on. Issue 33: it is judged (it was refused), and its label is written as
    # every name is, a surrogate or a control character a space.
    from monitor.testing import FakeOpencode
    from tests.harness import start, stop, wait_for

    fake = FakeOpencode()
    fake.streams = [fake.live]
    path = folder / "plugin.sock"
    # Asked after the first connect's resync: a session it reads back is answered 503 until
    # it is done (the plugin's own rule judges meanwhile), which is not what this is about.
    with structlog.testing.capture_logs() as early:
        server, watch, task = await start(fake, metrics_addr="127.0.0.1:0", plugin_socket=str(path))
        try:
            await wait_for(lambda: any(e["event"] == "stream.resynced" for e in early))
        except BaseException:
            await stop(server, watch, task)
            raise
    try:
        await wait_for(lambda: watch.plugins.server is not None and watch.metrics_server)
        connector = aiohttp.UnixConnector(str(path))
        async with aiohttp.ClientSession(connector=connector) as http:
            verdicts = []
            asked = [("ses_dd4d5c831ffemmgMvdYdtbM3cX", "/p\x1b[31m\nq")]
            # A loop of one call, the tool's name and the folder a lone surrogate each.
            asked += [(CALL["session_id"], "/p\ud800")] * 4
            for n, (session, directory) in enumerate(asked):
                odd = {"session_id": session, "tool": "ba\udfffsh", "directory": directory}
                body = json.dumps({**CALL, **odd, "call_id": f"c{n}"})
                async with http.post("http://localhost/v1/decide", data=body, headers=JSON) as r:
                    assert r.status == 200
                    verdicts.append((await r.json())["verdict"])
        assert verdicts == ["allow"] * 4 + ["block"]
        # The next connect's resync asks every other folder and keeps this session's run.
        with structlog.testing.capture_logs() as logs:
            await watch.follow.resync.run(first=False)
        events = [entry["event"] for entry in logs]
        assert "stream.resynced" in events and "stream.resync_failed" not in events
        assert watch.monitor.tracker.running().keys() >= {CALL["session_id"]}
        port = watch.metrics_server.port
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert r.status == 200
                text = await r.text()
            async with http.get(f"http://127.0.0.1:{port}/status") as r:
                assert r.status == 200
                entries = (await r.json())["plugins"]["directories"]
        assert 'directory="/p [31m q",verdict="allow"' in text
        assert 'directory="/p",verdict="block"' in text
        assert [(e["directory"], e["requests"], e["blocked"]) for e in entries] == [
            ("/p [31m q", 1, 0),
            ("/p", 4, 1),
        ]
    finally:
        await stop(server, watch, task)


async def test_a_question_before_the_resync_read_its_run_back_waits_for_it(folder) -> None:
    # The reconnect gap: the daemon restarts during a run that made 3 identical reads, and
    # the plugin asks about the 4th before the stream is connected, or before any frame names
    # the session. Judged at once, on an empty history, the loop's call ran; now it is
    # answered 503 (the plugin's own rule judges) until the resync has read the run back, and
    # then refused.
    from monitor.core.monitor import NOT_FOLLOWED
    from monitor.core.plugin_protocol import RequestRefused
    from monitor.testing import FakeOpencode
    from tests import frames_factory as ff
    from tests.harness import start, stop

    session = "ses_dd4d5c831ffemmgMvdYdtbM3cR"
    connect, resync = asyncio.Event(), asyncio.Event()
    fake = FakeOpencode(
        busy={session: {"type": "busy"}},
        messages={session: ff.run_record(session, 3)},
        holds={"status": resync},
    )

    async def stream(request: web.Request, response: web.StreamResponse) -> None:
        await connect.wait()
        await fake.live(request, response)

    fake.streams = [stream]
    fourth = PluginCall(session, "call_4", "read", ff.READ, "/home/dev/project")
    with structlog.testing.capture_logs() as logs:
        server, watch, task = await start(fake, plugin_socket=str(folder / "plugin.sock"))
        try:
            await wait_for(lambda: fake.of("event"))  # the stream asked for, not answered
            assert watch.plugins.judge(fourth) == RequestRefused(503, NOT_FOLLOWED)
            connect.set()
            await wait_for(lambda: fake.of("status"))  # the resync asks which runs are busy
            assert watch.plugins.judge(fourth) == RequestRefused(503, NOT_FOLLOWED)
            resync.set()
            await wait_for(lambda: any(e["event"] == "stream.resynced" for e in logs))
            assert watch.plugins.judge(fourth).verdict == "block"
        finally:
            await stop(server, watch, task)
    [detected] = [e for e in logs if e["event"] == "loop.detected"]
    assert (detected["session_id"], detected["call_index"], detected["plan"]) == (
        session,
        4,
        "refuse",
    )


ODD_BUT_WELL_FORMED = {
    "NaN": {"x": float("nan")},
    "infinities": {"x": float("inf"), "y": float("-inf")},
    "overflow": {"x": 1e308 * 10},  # 1e400 in the text sent: json.dumps writes Infinity
    "nested 256 deep": {"x": json.loads("[" * 256 + "]" * 256)},  # the plugin's own bound
    "control characters": {"command": "echo \x00\x1b[31m\u202e\r\n", "\x07": "\x7f"},
    "lone surrogates": {"\ud800": ["\udfff"], "command": "echo \udc80"},
}


async def test_odd_but_well_formed_calls_are_judged_and_metrics_and_status_answer_after_each(
    folder,
) -> None:
    # Issue 33 (done when): every odd but well-formed question is judged, not refused (its
    # call would run judged by the plugin's own rule only), and neither /metrics nor /status
    # breaks on what it left behind. Four identical calls of each: the 4th is refused.
    from monitor.testing import FakeOpencode
    from tests.harness import start, stop

    fake = FakeOpencode()
    fake.streams = [fake.live]
    path = folder / "plugin.sock"
    with structlog.testing.capture_logs() as logs:
        server, watch, task = await start(fake, metrics_addr="127.0.0.1:0", plugin_socket=str(path))
        try:
            # After the first resync, which finds these sessions idle and would end their runs.
            await wait_for(lambda: any(e["event"] == "stream.resynced" for e in logs))
            await wait_for(lambda: watch.plugins.server is not None and watch.metrics_server)
            verdicts = await ask_each(path, watch.metrics_server.port)
        finally:
            await stop(server, watch, task)
    assert verdicts == {name: ["allow"] * 3 + ["block"] for name in ODD_BUT_WELL_FORMED}
    assert watch.monitor.plugin_stats.refused == 0
    [entry] = watch.monitor.plugin_stats.view()
    assert (entry["requests"], entry["blocked"]) == (4 * len(ODD_BUT_WELL_FORMED), 6)


async def ask_each(path: Path, port: int) -> dict[str, list[str]]:
    """Asks four identical calls of each ODD_BUT_WELL_FORMED case, each case its own session,
    and reads /metrics and /status after each case (both must answer 200); the verdicts."""
    verdicts: dict[str, list[str]] = {}
    plugin = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path)))
    async with plugin, aiohttp.ClientSession() as http:
        for n, (name, args) in enumerate(ODD_BUT_WELL_FORMED.items()):
            session = CALL["session_id"][:-2] + f"{n:02d}"
            for call in range(4):
                odd = {"session_id": session, "call_id": f"c{call}", "args": args}
                body = json.dumps({**CALL, **odd})
                async with plugin.post("http://localhost/v1/decide", data=body, headers=JSON) as r:
                    assert r.status == 200, (name, await r.text())
                    verdicts.setdefault(name, []).append((await r.json())["verdict"])
            # Once a case: /status answers 20 requests a second, the rest get 429.
            for page in ("metrics", "status"):
                async with http.get(f"http://127.0.0.1:{port}/{page}") as r:
                    assert r.status == 200, (name, page)
                    await r.read()
    return verdicts


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


# --- every question answered (issue 33): 24 malformed bodies, the odd but well-formed ------

SES = CALL["session_id"]
WITHOUT = {name: {k: v for k, v in CALL.items() if k != name} for name in CALL}


def body_of(value: object) -> bytes:
    return json.dumps(value).encode()


# (what is wrong, content type, body, status): each must get a 4xx and `{"error": text}`.
MALFORMED = [
    ("not JSON", "application/json", b"{not json", 400),
    ("empty body", "application/json", b"", 400),
    ("truncated", "application/json", body_of(CALL)[:-9], 400),
    ("JSON array", "application/json", b"[]", 400),
    ("JSON string", "application/json", b'"ses_x"', 400),
    ("JSON null", "application/json", b"null", 400),
    ("JSON number", "application/json", b"1e400", 400),
    ("session_id missing", "application/json", body_of(WITHOUT["session_id"]), 400),
    ("session_id a number", "application/json", body_of({**CALL, "session_id": 7}), 400),
    ("session_id not an id", "application/json", body_of({**CALL, "session_id": "../x"}), 400),
    ("session_id oversized", "application/json", body_of({**CALL, "session_id": SES * 40}), 400),
    ("tool missing", "application/json", body_of(WITHOUT["tool"]), 400),
    ("tool a list", "application/json", body_of({**CALL, "tool": ["bash"]}), 400),
    ("tool empty", "application/json", body_of({**CALL, "tool": ""}), 400),
    ("tool oversized", "application/json", body_of({**CALL, "tool": "b" * 257}), 400),
    ("args missing", "application/json", body_of(WITHOUT["args"]), 400),
    ("args a string", "application/json", body_of({**CALL, "args": "echo x"}), 400),
    ("args a list", "application/json", body_of({**CALL, "args": ["echo"]}), 400),
    ("args null", "application/json", body_of({**CALL, "args": None}), 400),
    ("wrong encoding", "application/json", body_of(CALL).replace(b"echo", b"\xe9cho"), 400),
    ("truncated past the parser's depth", "application/json",
     body_of(CALL)[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 99_999 + b"}", 400),
    ("wrong content type", "text/plain", body_of(CALL), 415),
    ("no content type", "", body_of(CALL), 415),
    ("over the size limit", "application/json", body_of({**CALL, "args": {"c": "x" * MAX_BODY}}),
     413),
]  # fmt: skip

DEEP: object = "bottom"
for _ in range(400):  # deep, within what the parser reads (the plugin cuts at 256 levels)
    DEEP = [DEEP]

# Odd but well-formed: each judged with a normal answer (200 and a verdict).
ODD = [
    ("lone surrogates everywhere", {
        "tool": "ba\udfffsh", "call_id": "c\ud800", "directory": "/p\udc80",
        "args": {"\ud800": ["\udfff", {"k": "v\ud800"}]},
    }),
    ("control characters", {"tool": "bash\x00\x1b[31m", "args": {"command": "\x07\r\n\x7f"}}),
    ("NaN and Infinity", {"args": {"a": float("nan"), "b": float("inf"), "c": -float("inf")}}),
    ("deep nesting", {"args": {"deep": DEEP}}),
    ("nesting past the parser's depth", {"args": {"deep": "DEEP"}}),
    ("huge numbers", {"args": {"big": 10**4000, "bigger": "HUGE", "tiny": 1e-320}}),
    ("unknown extra fields", {"model": "x", "extra": {"nested": [1, 2]}, "version": 3}),
    ("fell_open below zero", {"fell_open": -5}),
    ("fell_open a string", {"fell_open": "12"}),
    ("fell_open too large", {"fell_open": 10**9}),
    ("directory relative", {"directory": "project"}),
    ("directory a number", {"directory": 5}),
    ("call_id missing", {"call_id": None}),
    ("call_id a number", {"call_id": 12}),
]  # fmt: skip


def odd_body(odd: dict) -> bytes:
    body = {**CALL, **odd}
    if odd.get("call_id", "") is None:
        del body["call_id"]
    # 5,000 digits: past what int() parses by default (4,300).
    # 100,000 levels: past what `json.loads` reads (RecursionError at about 1,000).
    deep = "[" * 100_000 + '{"x": NaN}' + "]" * 100_000
    return json.dumps(body).replace('"HUGE"', "9" * 5000).replace('"DEEP"', deep).encode()


async def test_every_malformed_body_is_answered_and_every_odd_one_judged(
    folder, monkeypatch
) -> None:
    # Issue 33: 24 malformed bodies each get a 4xx with `{"error": text}`; the odd but
    # well-formed ones are judged (a normal answer, the tracker asked); /metrics and /status
    # answer after each. Reports never cost a decision: an unusable optional field is
    # taken as unknown and logged once.
    from monitor.testing import FakeOpencode
    from tests.harness import FAST, start, stop

    assert len(MALFORMED) == 24
    # /status answers 20 a second (a burst of as many), the rest 429: this test asks more.
    monkeypatch.setattr(metrics_server, "STATUS_RATE", 1e6)
    fake = FakeOpencode()
    fake.streams = [fake.live]
    path = folder / "plugin.sock"
    # A read limit no loaded machine reaches: a reconnect's resync would answer a question
    # 503 while it reads the new session's directory back (seen at a load average of 10).
    patient = dataclasses.replace(FAST, read_timeout=30.0)
    with structlog.testing.capture_logs() as logs:
        server, watch, task = await start(
            fake, patient, metrics_addr="127.0.0.1:0", plugin_socket=str(path)
        )
        try:
            await wait_for(lambda: watch.plugins.server is not None and watch.metrics_server)
            # The well-formed questions below are judged once the first resync has ended.
            await wait_for(lambda: any(e["event"] == "stream.resynced" for e in logs))
            port = watch.metrics_server.port
            connector = aiohttp.UnixConnector(str(path))
            async with (
                aiohttp.ClientSession(connector=connector) as plugin,
                aiohttp.ClientSession() as http,
            ):

                async def still_up(case: str) -> None:
                    for route in ("metrics", "status"):
                        async with http.get(f"http://127.0.0.1:{port}/{route}") as r:
                            assert r.status == 200, (case, route)
                            await r.read()

                answers = []
                for case, content_type, body, _ in MALFORMED:
                    headers = {"Content-Type": content_type} if content_type else {}
                    async with plugin.post(
                        "http://localhost/v1/decide", data=body, headers=headers
                    ) as r:
                        error = await r.json(content_type=None)
                        answers.append((case, r.status, set(error), type(error["error"])))
                    await still_up(case)
                assert answers == [(case, status, {"error"}, str) for case, _, _, status in
                                   MALFORMED]  # fmt: skip
                asked = watch.monitor.tracker.sessions_seen
                assert asked == 0  # nothing of them reached the judge

                verdicts = []
                for n, (case, odd) in enumerate(ODD):
                    session = f"ses_dd4d5c831ffemmgMvdYdtb{n:04d}"
                    body = odd_body({"session_id": session, **odd})
                    async with plugin.post(
                        "http://localhost/v1/decide", data=body, headers=JSON
                    ) as r:
                        verdicts.append((case, r.status, await r.json()))
                    await still_up(case)
                assert verdicts == [(case, 200, {"verdict": "allow"}) for case, _ in ODD]
                # Each was judged: the tracker took its session.
                assert watch.monitor.tracker.sessions_seen == len(ODD)
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                # The two with a directory it cannot use, counted as unknown.
                assert 'directory="unknown",verdict="allow"} 2.0' in text
        finally:
            await stop(server, watch, task)
    unusable = [entry["fields"] for entry in logs if entry["event"] == "plugin.report_unusable"]
    assert unusable == [["fell_open"], ["directory"], ["call_id"]]  # each field once
