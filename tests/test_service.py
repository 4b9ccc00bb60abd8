"""OpenCode 2's background service found by its registration (monitor/service.py), and
followed by a watch given no `--url` when it restarts on another port (monitor/shell/locate.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.service import Service, parse_service, read_service, service_file
from monitor.shell.api import basic_auth_header
from monitor.shell.notify import Notifier
from monitor.shell.watch import Watch
from monitor.testing import FakeOpencode, engine_call, frames, play
from tests.frames_factory import engine_record
from tests.harness import FAST, wait_for

S = "ses_s1"


def test_a_registration_as_2_2_5_writes_it_names_the_service() -> None:
    text = json.dumps(
        {
            "id": "2622e434-6c1b",
            "version": "2.2.5",
            "url": "http://127.0.0.1:49374",
            "pid": 16823,
            "password": "NTUKs3cret",
        }
    )
    service = parse_service(text)
    assert service == Service("http://127.0.0.1:49374", "NTUKs3cret", 16823, "2.2.5")
    assert "NTUKs3cret" not in repr(service)


@pytest.mark.parametrize(
    ("text", "service"),
    [
        ("", None),
        ("{", None),
        ('"http://127.0.0.1:1"', None),
        ('{"url": null}', None),
        ('{"url": "127.0.0.1:49374"}', None),  # no scheme
        ('{"url": "http://u:p@127.0.0.1:1"}', None),  # credentials are never in it
        ('{"url": "http://127.0.0.1:99999"}', None),
        # What it lacks or gives of another type is taken as not given.
        ('{"url": "http://127.0.0.1:1/"}', Service("http://127.0.0.1:1")),
        (
            '{"url": "http://127.0.0.1:1", "password": "", "pid": true, "version": 2}',
            Service("http://127.0.0.1:1"),
        ),
    ],
)
def test_a_registration_that_names_no_usable_service_is_none(
    text: str, service: Service | None
) -> None:
    assert parse_service(text) == service


def test_the_registration_is_in_xdgs_state_folder() -> None:
    assert service_file({"XDG_STATE_HOME": "/s", "HOME": "/h"}) == Path("/s/opencode/service.json")
    assert service_file({"HOME": "/h"}) == Path("/h/.local/state/opencode/service.json")
    assert service_file({"XDG_STATE_HOME": " "}) is None


def test_a_file_that_is_missing_unreadable_or_not_text_is_no_service(tmp_path: Path) -> None:
    assert read_service(None) is None
    assert read_service(tmp_path / "none.json") is None
    assert read_service(tmp_path) is None  # a folder
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"url": "http://127.0.0.1:1", "x": "\xff"}')
    assert read_service(binary) is None
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"url": "http://127.0.0.1:1", "pad": "x" * 70_000}))
    assert read_service(huge) is None


def register(state: Path, server: TestServer, password: str) -> None:
    path = state / "opencode" / "service.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    url = str(server.make_url("")).rstrip("/")
    registration = {"version": "2.2.5", "url": url, "pid": 1, "password": password}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(registration))
    temporary.replace(path)  # as a restart writes it: whole


def reads(first: int, last: int) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for n in range(first, last + 1):
        events += engine_call(S, n, "read", {"path": "README.md"}, 3 * n, "/w")
    return events


async def test_a_watch_given_no_url_follows_the_service_to_its_new_port(tmp_path: Path) -> None:
    # The service runs on one port; it restarts on another with a new password, and the
    # registration says so. The loop it then runs is stopped there.
    state = tmp_path / "state"
    first = FakeOpencode(generation=2)
    first.streams = [first.live]
    second = FakeOpencode(generation=2, streams=[play(frames(*reads(1, 4)))])
    before, after = (TestServer(f.app(), host="127.0.0.1") for f in (first, second))
    await before.start_server()
    await after.start_server()
    old_url, new_url = (str(server.make_url("")).rstrip("/") for server in (before, after))
    register(state, before, "first-password")
    settings = load_settings({}, {"XDG_STATE_HOME": str(state)}, isatty=False)
    watch = Watch(settings, notifier=Notifier(None), timing=FAST, roles=tmp_path / "roles")
    try:
        with capture_logs() as logs:
            task = asyncio.create_task(watch.run())
            await wait_for(first.live_connected.is_set)
            register(state, after, "second-password")
            first.close()
            await wait_for(lambda: second.of("prompt"))
            watch.stop()
            assert await asyncio.wait_for(task, 5) == 0
    finally:
        await before.close()
        await after.close()
    [moved] = [line for line in logs if line["event"] == "server.moved"]
    assert (moved["before"], moved["url"]) == (old_url, new_url)
    assert second.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    assert not any("password" in json.dumps(line, default=str) for line in logs)
    assert watch.status()["url"] == new_url


def basic(password: str) -> str:
    return basic_auth_header("opencode", password)["Authorization"]


def link_to(state: Path, server: TestServer, password: str) -> None:
    """The registration replaced by a link to one naming `server`."""
    elsewhere = state / "elsewhere"
    register(elsewhere, server, password)
    path = state / "opencode" / "service.json"
    path.unlink()
    path.symlink_to(elsewhere / "opencode" / "service.json")


def open_to_others(state: Path, server: TestServer, password: str) -> None:
    register(state, server, password)
    (state / "opencode" / "service.json").chmod(0o666)


@pytest.mark.parametrize("swap", [link_to, open_to_others], ids=["link", "writable"])
async def test_a_registration_that_turns_untrusted_is_never_followed(
    tmp_path: Path, swap: Callable[[Path, TestServer, str], None]
) -> None:
    # Watching a registered service, the registration is replaced by one someone else could
    # have written, naming another server: that server is never asked, and its password never
    # sent; the watch stays with the service it followed, said once.
    state = tmp_path / "state"
    first, planted = FakeOpencode(generation=2), FakeOpencode(generation=2)
    first.streams = [first.live, play()]
    servers = [TestServer(f.app(), host="127.0.0.1") for f in (first, planted)]
    for server in servers:
        await server.start_server()
    register(state, servers[0], "first-password")
    settings = load_settings({}, {"XDG_STATE_HOME": str(state)}, isatty=False)
    watch = Watch(settings, notifier=Notifier(None), timing=FAST, roles=tmp_path / "roles")
    try:
        with capture_logs() as logs:
            task = asyncio.create_task(watch.run())
            await wait_for(first.live_connected.is_set)
            swap(state, servers[1], "planted-password")
            first.close()
            await wait_for(lambda: first.connections == 2)
            watch.stop()
            assert await asyncio.wait_for(task, 5) == 0
    finally:
        for server in servers:
            await server.close()
    assert planted.requests == []
    assert {r.authorization for r in first.requests} == {basic("first-password")}
    [refused] = [line for line in logs if line["event"] == "service.refused"]
    assert str(state / "opencode" / "service.json") in refused["reason"]
    assert [line for line in logs if line["event"] == "server.moved"] == []
    assert "planted-password" not in json.dumps(logs, default=str)


def restarted(password: str) -> FakeOpencode:
    """The service after a restart: its sessions kept (S busy, its 3rd read made while the
    service restarted), the loop's next reads on its stream, another password."""
    return FakeOpencode(
        generation=2,
        password=password,
        streams=[play(frames(*reads(4, 6)))],
        busy={S: {}},
        messages={S: engine_record(3)},
    )


@contextlib.asynccontextmanager
async def looping_on_the_service(
    tmp_path: Path,
) -> AsyncIterator[tuple[FakeOpencode, TestServer]]:
    """The service registered with its password, a watch given no url on it, two reads of S
    seen there; the watch stopped (exit 0) and the service closed at the end."""
    state = tmp_path / "state"
    first = FakeOpencode(generation=2, password="first-password")
    first.streams = [first.live]
    before = TestServer(first.app(), host="127.0.0.1")
    await before.start_server()
    register(state, before, "first-password")
    settings = load_settings({}, {"XDG_STATE_HOME": str(state)}, isatty=False)
    watch = Watch(settings, notifier=Notifier(None), timing=FAST, roles=tmp_path / "roles")
    task = asyncio.create_task(watch.run())
    try:
        await wait_for(first.live_connected.is_set)
        await first.push(frames(*reads(1, 2)))
        await wait_for(lambda: watch.monitor.running())
        yield first, before
    finally:
        watch.stop()
        exit_status = await asyncio.wait_for(task, 5)
        await before.close()
    assert exit_status == 0


def stopped_once_there(logs: list[dict[str, Any]], second: FakeOpencode) -> None:
    """The loop stopped once, at its 4th read, on the restarted service; no password said."""
    [stopped] = [line for line in logs if line["event"] == "intervention.outcome"]
    assert (stopped["outcome"], stopped["call_index"]) == ("aborted", 4)
    assert second.actions() == [f"/api/session/{S}/interrupt", f"/api/session/{S}/prompt"]
    # Refusals of a password are said (`refused_credentials`), never with a password.
    said = json.dumps(logs, default=str)
    assert "first-password" not in said and "second-password" not in said


async def test_a_service_restarted_mid_loop_has_its_loop_stopped_once_there(
    tmp_path: Path,
) -> None:
    # Two reads on the service; it restarts on another port with another password and the
    # loop goes on there. It is stopped once, at its 4th call, on the new service, with the
    # new password only: the old one never reaches it, nor is the old service asked again.
    second = restarted("second-password")
    after = TestServer(second.app(), host="127.0.0.1")
    await after.start_server()
    with capture_logs() as logs:
        try:
            async with looping_on_the_service(tmp_path) as (first, before):
                register(tmp_path / "state", after, "second-password")
                first.close()
                await before.close()  # gone: its port refuses
                await wait_for(lambda: second.of("prompt"))
        finally:
            await after.close()
    stopped_once_there(logs, second)
    assert first.actions() == [] and first.refused() == [] and second.refused() == []


async def test_a_service_back_on_its_port_with_a_new_password_is_asked_with_it_once_registered(
    tmp_path: Path,
) -> None:
    # As `opencode service restart` does on its fixed port: the service is back, with a new
    # password, before its registration says so. Until then the old password is refused
    # (each connect, with the reconnect's backoff); from then on only the new one is sent,
    # and the loop going on there is stopped once.
    second = restarted("second-password")
    with capture_logs() as logs:
        async with looping_on_the_service(tmp_path) as (first, before):
            after = TestServer(second.app(), host="127.0.0.1", port=before.port)
            try:
                first.close()
                await before.close()
                await after.start_server()
                await wait_for(lambda: len(second.refused()) >= 2)
                registered_at = asyncio.get_running_loop().time()
                register(tmp_path / "state", after, "second-password")
                await wait_for(lambda: second.of("prompt"))
            finally:
                await after.close()
    assert all(request.at < registered_at for request in second.refused())
    assert {r.authorization for r in second.refused()} == {basic("first-password")}
    stopped_once_there(logs, second)
