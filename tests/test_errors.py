"""The errors the REST client raises for what the server answers (monitor/errors.py): a 404
means the session is gone only on a session's own route."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from monitor.errors import LocalError, MonitorError, Refused, ServerError, SessionGone
from monitor.shell.api import OpencodeAPI, Retry
from monitor.shell.api_v2 import EngineAPI

S = "ses_0000000000000000000000001"


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """A server that answers 404 to every request: its URL and the paths it was asked."""
    seen: list[str] = []

    async def not_found(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_found)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    try:
        yield str(test_server.make_url("")), seen
    finally:
        await test_server.close()


@pytest.fixture
async def api(server: tuple[str, list[str]]) -> AsyncIterator[OpencodeAPI]:
    async with aiohttp.ClientSession() as http:
        yield OpencodeAPI(http, server[0], Retry(attempts=1))


async def test_a_404_of_a_sessions_route_is_session_gone(
    api: OpencodeAPI, server: tuple[str, list[str]]
) -> None:
    with pytest.raises(SessionGone, match=f"POST /session/{S}/abort: not found"):
        await api.abort(S, None, route=1)
    with pytest.raises(SessionGone, match=f"GET /session/{S}/message: not found"):
        await api.messages(S, None, route=1)
    with pytest.raises(SessionGone, match=f"GET /session/{S}: not found"):
        await api.session(S, "/w", route=1)
    assert server[1] == [
        f"/session/{S}/abort",
        f"/session/{S}/message",
        f"/session/{S}?directory=/w",
    ]


@pytest.mark.parametrize(
    ("ask", "what"),
    [
        (lambda api: api.sessions(None), "GET /session"),
        (lambda api: api.statuses(None), "GET /session/status"),
        (lambda api: api.server_directory(), "GET /path"),
        (lambda api: api.pending_permissions(None), "GET /permission"),
    ],
)
async def test_a_404_of_any_other_route_is_refused_not_session_gone(
    api: OpencodeAPI, ask, what: str
) -> None:
    # Issue 30: any 404 read as "the session is gone", a server without the route too.
    with pytest.raises(Refused) as caught:
        await ask(api)
    assert not isinstance(caught.value, SessionGone)
    assert (caught.value.status, str(caught.value)) == (404, f"{what}: refused (404)")


async def test_a_permission_reply_met_by_a_404_was_answered_first(
    api: OpencodeAPI, server: tuple[str, list[str]]
) -> None:
    assert (
        await api.reply_permission("per_0000000000000000000000001", None, "reject", route=1)
        is False
    )
    assert server[1] == ["/permission/per_0000000000000000000000001/reply"]


async def test_a_new_engine_sessions_route_404_is_session_gone(
    server: tuple[str, list[str]],
) -> None:
    async with aiohttp.ClientSession() as http:
        api = EngineAPI(http, server[0], Retry(attempts=1), choice="2")
        await api.detect()
        with pytest.raises(SessionGone, match=f"/api/session/{S}/history"):
            await api.history(S, 0)
    assert server[1][-1].startswith(f"/api/session/{S}/history?")


@pytest.mark.parametrize(
    ("route", "path"), [(1, f"/session/{S}/abort"), (2, f"/api/session/{S}/interrupt")]
)
async def test_a_decisions_route_decides_where_its_abort_goes(
    server: tuple[str, list[str]], route: int, path: str
) -> None:
    # Issue 30: the executor passes the route the decision carries; the client does not
    # work it out again (here the server is told to be a 1.x one).
    async with aiohttp.ClientSession() as http:
        api = EngineAPI(http, server[0], Retry(attempts=1), choice="1")
        with pytest.raises(SessionGone):
            await api.abort(S, None, route=route)
    assert server[1][-1].split("?")[0] == path


def test_one_hierarchy_a_local_and_a_remote_kind() -> None:
    from monitor import errors

    for name in errors.__all__:
        kind = getattr(errors, name)
        assert issubclass(kind, MonitorError), name
        assert kind is MonitorError or issubclass(kind, LocalError) != issubclass(
            kind, ServerError
        ), name


def test_every_exception_class_of_the_package_is_a_monitor_error() -> None:
    """Issue 43: every error the package defines joins the one hierarchy (FrameError was a
    bare ValueError); only private classes that steer control flow in one module stay out."""
    import importlib
    import inspect
    import pkgutil

    import monitor

    outside = []
    for info in pkgutil.walk_packages(monitor.__path__, "monitor."):
        if info.name == "monitor.__main__":
            continue  # runs the command line
        module = importlib.import_module(info.name)
        for name, kind in inspect.getmembers(module, inspect.isclass):
            mine = kind.__module__ == info.name and issubclass(kind, Exception)
            if mine and not name.startswith("_") and not issubclass(kind, MonitorError):
                outside.append(f"{info.name}.{name}")
    assert outside == []
