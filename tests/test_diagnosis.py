"""Pointed at the wrong thing, the monitor says once what is likely wrong and how to fix it.

Each case runs `Watch` against what a newcomer could really point it at: a port nothing
listens on, a web server that is not OpenCode, plain HTTP spoken to with https://, a server
that wants a password. The stand-in OpenCode server plays the project list for --directory.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.errors import ConfigError
from monitor.shell.diagnosis import directory_known
from monitor.shell.notify import Notifier
from monitor.shell.watch import Watch
from monitor.testing import FakeOpencode, play
from tests.harness import FAST, events, stop, wait_for


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def watch_of(url: str, environ: dict[str, str] | None = None, **flags: object) -> Watch:
    settings = load_settings({"url": url, **flags}, environ or {}, isatty=False)
    return Watch(settings, notifier=Notifier(None), timing=FAST)


async def attempts(watch: Watch, logs: list, count: int) -> None:
    """Run the watch until it has failed `count` times, then stop it."""
    task = asyncio.create_task(watch.run())
    try:
        # One warning for the outage, then a debug line per retry.
        failed = ("stream.connect_failed", "stream.retry_failed")
        await wait_for(lambda: sum(e["event"] in failed for e in logs) >= count)
    finally:
        watch.stop()
        assert await asyncio.wait_for(task, 5) == 0
    assert len(events(logs, "stream.connect_failed")) == 1


async def page(request: web.Request) -> web.Response:
    return web.Response(text="<html>app</html>", content_type="text/html")


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


# What a port can hold that is no OpenCode: a one-page server (404 elsewhere), or one that
# answers every path with an HTML page, as a web app's fallback route does.
PAGES = {"plain": ("/", hello), "page": ("/{tail:.*}", page)}


@pytest.fixture
async def plain_server() -> AsyncIterator[TestServer]:
    """An aiohttp server with one page: not OpenCode, and no TLS."""
    app = web.Application()
    app.router.add_get("/", hello)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def test_wrong_port_says_nothing_listens_once_and_never_disconnected():
    port = free_port()
    with capture_logs() as logs:
        await attempts(watch_of(f"http://127.0.0.1:{port}"), logs, 3)
    [diagnosis] = events(logs, "stream.diagnosis")
    assert diagnosis["problem"] == "cannot_connect"
    assert diagnosis["hint"] == (
        f"nothing accepts connections on 127.0.0.1:{port}: start `opencode serve --port {port}`"
        " there, or give --url the address `opencode serve` printed when it started (with"
        " OpenCode 2, run `opencode service start` and give no --url: its service is found)"
    )
    assert diagnosis["log_level"] == "error"
    assert events(logs, "stream.disconnected") == []
    assert events(logs, "stream.connect_failed")[0]["reason"].startswith("cannot connect (")


async def test_a_server_that_is_not_opencode(plain_server: TestServer):
    port = plain_server.port
    with capture_logs() as logs:
        await attempts(watch_of(f"http://127.0.0.1:{port}"), logs, 2)
    [diagnosis] = events(logs, "stream.diagnosis")
    assert diagnosis["problem"] == "not_opencode"
    assert diagnosis["hint"].startswith(f"127.0.0.1:{port} has no OpenCode event stream (404)")
    assert events(logs, "stream.connect_failed")[0]["reason"] == "server answered 404"


async def test_https_to_a_plain_server(plain_server: TestServer):
    port = plain_server.port
    with capture_logs() as logs:
        await attempts(watch_of(f"https://127.0.0.1:{port}"), logs, 2)
    [diagnosis] = events(logs, "stream.diagnosis")
    assert diagnosis["problem"] == "tls_failed"
    assert diagnosis["hint"] == (
        f"the TLS handshake with 127.0.0.1:{port} failed; `opencode serve` speaks plain HTTP,"
        f" so unless a TLS proxy stands in front of it use --url http://127.0.0.1:{port}"
    )


@pytest.fixture
async def stand_in(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The port of the server named by the test's parameter, or one where nothing listens."""
    if request.param is None:
        yield free_port()
        return
    app = web.Application()
    app.router.add_get(*PAGES[request.param])
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server.port
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("scheme", "stand_in", "problem"),
    [
        ("http", None, "cannot_connect"),
        ("https", "plain", "tls_failed"),
        ("http", "plain", "not_opencode"),
        ("http", "page", "not_a_stream"),
    ],
    ids=["dead-port", "tls", "not-opencode", "not-a-stream"],
    indirect=["stand_in"],
)
async def test_no_server_is_said_detected_before_one_answered(
    scheme: str, stand_in: int, problem: str
):
    """Issue 32: a dead port's first line was `server.detected server='opencode (no version
    given): 1.x and 2.x API'`, the next that nothing accepts connections there."""
    watch = watch_of(f"{scheme}://127.0.0.1:{stand_in}")
    with capture_logs() as logs:
        await attempts(watch, logs, 2)
    assert [d["problem"] for d in events(logs, "stream.diagnosis")] == [problem]
    assert events(logs, "server.detected") == []
    assert watch.status()["stream"]["server"] is None


async def test_a_server_is_said_detected_once_its_stream_answered():
    fake = FakeOpencode(streams=[play()])
    with capture_logs() as logs:
        running = await start_fake(fake)
        await wait_for(lambda: events(logs, "stream.resynced"))
        await stop(*running)
    names = [e["event"] for e in logs]
    assert names.index("stream.connected") < names.index("server.detected")
    [detected] = events(logs, "server.detected")
    assert (detected["classic"], detected["changed"]) == (True, False)


@pytest.mark.parametrize(
    ("stand_in", "status"), [("page", 200), ("plain", 404)], indirect=["stand_in"]
)
async def test_a_url_with_an_extra_path_is_told_the_path(stand_in: int, status: int):
    """`--url http://127.0.0.1:4096/session` was told it "points at another web server"."""
    port = stand_in
    with capture_logs() as logs:
        await attempts(watch_of(f"http://127.0.0.1:{port}/session"), logs, 2)
    [diagnosis] = events(logs, "stream.diagnosis")
    assert diagnosis["problem"] == "extra_path"
    assert diagnosis["hint"] == (
        f"127.0.0.1:{port} answered {status} for the event stream under the path /session "
        f"that --url has: give --url the server's address alone, http://127.0.0.1:{port} "
        "(a path only where a proxy serves OpenCode under it)"
    )
    assert events(logs, "server.detected") == []


@pytest.fixture
async def locked_server() -> AsyncIterator[tuple[TestServer, list[str | None]]]:
    """Answers 401 to everything; records the Authorization header it got (never printed)."""
    seen: list[str | None] = []

    async def refuse(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.Response(status=401, text="Unauthorized")

    app = web.Application()
    app.router.add_get("/global/event", refuse)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server, seen
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {},
            "the server wants a password (401) and none was sent: set OPENCODE_SERVER_PASSWORD "
            "to the password `opencode serve` runs with, or give --password-file FILE",
        ),
        (
            {"OPENCODE_SERVER_PASSWORD": "wrong-pw-1b2c"},
            "the server refused our credentials (401): check the password in "
            "OPENCODE_SERVER_PASSWORD or in the --password-file file, and the user name in "
            "OPENCODE_SERVER_USERNAME (default opencode)",
        ),
    ],
    ids=["no-password", "wrong-password"],
)
async def test_401_says_whether_a_password_was_sent(locked_server, environ, expected):
    server, seen = locked_server
    watch = watch_of(f"http://127.0.0.1:{server.port}", environ)
    with pytest.raises(ConfigError) as caught:
        await asyncio.wait_for(watch.run(), 5)
    assert str(caught.value) == expected
    assert len(seen) == 1 and (seen[0] is None) == (not environ)
    assert "wrong-pw-1b2c" not in str(caught.value)


async def start_fake(fake: FakeOpencode, **flags: object):
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    watch = watch_of(f"http://127.0.0.1:{server.port}", **flags)
    return server, watch, asyncio.create_task(watch.run())


@pytest.mark.parametrize(
    ("directory", "warned"),
    [("/home/dev/other", True), ("/home/dev/app", False), ("/home/dev/app/sub", False)],
)
async def test_directory_is_checked_against_the_servers_projects(directory, warned):
    projects = [{"id": "p1", "worktree": "/home/dev/app", "sandboxes": ["/tmp/box"]}]
    fake = FakeOpencode(streams=[play()], projects=projects)
    with capture_logs() as logs:
        running = await start_fake(fake, directory=directory)
        await wait_for(lambda: events(logs, "stream.resynced"))
        await stop(*running)
    assert [r.path for r in fake.requests if r.path == "/project"] == ["/project"]
    unknown = events(logs, "stream.directory_unknown")
    if warned:
        assert [(u["directory"], u["known"]) for u in unknown] == [
            (directory, ["/home/dev/app", "/tmp/box"])
        ]
        assert unknown[0]["log_level"] == "warning"
    else:
        assert unknown == []


async def test_without_directory_the_projects_are_not_asked():
    fake = FakeOpencode(streams=[play()])
    with capture_logs() as logs:
        running = await start_fake(fake)
        await wait_for(lambda: events(logs, "stream.resynced"))
        await stop(*running)
    assert [r for r in fake.requests if r.path == "/project"] == []


@pytest.mark.parametrize(
    ("directory", "known"),
    [
        ("/a/b", True),
        ("/a/b/c", True),
        ("/a/bc", False),
        ("/a/b/", False),  # the server compares directories as written
        ("a/b", False),
        ("/x", False),
    ],
)
def test_directory_known(directory: str, known: bool) -> None:
    assert directory_known(directory, ["/a/b"]) is known
