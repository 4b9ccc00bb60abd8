"""A plugin file and a daemon of different releases know it (issue 46): the plugin sends its
version and protocol, the daemon says its own on every answer and logs a skew once per
plugin, `plugin status` and `status` say it, and the token in the clear is refused."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import aiohttp
import pytest
import structlog
from aiohttp import web

from monitor import __version__
from monitor.config import load_settings
from monitor.core.plugin_protocol import (
    ALLOW,
    PROTOCOL,
    VERSION_HEADER,
    PluginCall,
    Probe,
    Versions,
    plugin_release,
    read_body,
    skew_advice,
)
from monitor.core.plugin_stats import PluginStats
from monitor.exits import EX_OK, EX_OTHER_RELEASE
from monitor.shell.decide import DecideServer
from monitor.shell.endpoint import PluginEndpoint, socket_name
from monitor.shell.plugin_file import shipped_version, template
from monitor.shell.plugin_install import FILE_NAME, install, installed_version, render, status
from monitor.shell.status import render_status
from tests import earlier_plugins

SESSION = "ses_dd4d5c831ffemmgMvdYdtbM3cW"
CALL = {"session_id": SESSION, "call_id": "c", "tool": "read", "args": {}, "directory": "/p"}
OURS = shipped_version()
EARLIER = "(it says no version)"


def body(**fields: object) -> bytes:
    return json.dumps({**CALL, **fields}).encode()


# -- the protocol, pure ------------------------------------------------------------------------


def test_a_question_carries_the_plugins_release_and_one_without_is_an_earlier_plugins():
    call = read_body(body(plugin_version="0.1.0+0123abcd", protocol=PROTOCOL))
    assert isinstance(call, PluginCall)
    assert (call.plugin_version, call.protocol, call.unusable) == ("0.1.0+0123abcd", 2, ())
    earlier = read_body(body())
    assert isinstance(earlier, PluginCall)
    assert (earlier.plugin_version, earlier.protocol, earlier.unusable) == (None, None, ())
    odd = read_body(body(plugin_version=7, protocol="2"))
    assert isinstance(odd, PluginCall) and odd.tool == "read"  # judged all the same
    assert (odd.plugin_version, odd.protocol) == (None, None)
    assert odd.unusable == ("plugin_version", "protocol")
    assert read_body(b'{"probe": true, "plugin_version": "x", "protocol": 2}') == Probe("x", 2)


def test_the_plugin_version_is_the_package_version_and_a_digest_of_the_file():
    assert plugin_release("0.1.0", "abc") == "0.1.0+" + hashlib.sha256(b"abc").hexdigest()[:8]
    assert OURS == plugin_release(__version__, template())
    # The package's file says "dev"; install writes the release's version into it.
    assert 'export const VERSION = "dev"\n' in template()
    assert installed_version(render(PluginEndpoint(Path("/s.sock")))) == OURS
    assert installed_version(template()) == "dev"
    assert installed_version(earlier_plugins.text("3872d79")) is None


def test_a_skew_is_said_once_per_directory_and_version():
    versions = Versions("0.2.0+0123abcd")
    same = PluginCall(SESSION, "c", "read", {}, "/a", plugin_version="0.2.0+0123abcd")
    assert versions.differs(same) is None
    older = PluginCall(SESSION, "c", "read", {}, "/a")
    said = versions.differs(older)
    assert said is not None and said.advice == (
        f"the installed plugin is of an earlier release {EARLIER}, this monitor "
        "0.2.0+0123abcd: run `opencode-loop-monitor plugin install` and restart OpenCode"
    )
    assert versions.differs(older) is None
    assert versions.differs(PluginCall(SESSION, "c", "read", {}, "/b")) is not None
    newer = PluginCall(SESSION, "c", "read", {}, "/a", plugin_version="0.3.0+1", protocol=3)
    said = versions.differs(newer)
    assert said is not None and said.advice == (
        "the installed plugin is version 0.3.0+1, this monitor 0.2.0+0123abcd: restart the "
        "monitor with the release that installed the plugin"
    )
    bounded = Versions("v", size=2)
    for directory in ("/1", "/2", "/3"):
        assert bounded.differs(PluginCall(SESSION, "c", "read", {}, directory)) is not None
    assert bounded.differs(PluginCall(SESSION, "c", "read", {}, "/1")) is not None  # forgotten


# -- the daemon --------------------------------------------------------------------------------


async def served(endpoint: PluginEndpoint, judged: list[PluginCall]) -> DecideServer:
    def judge(call: PluginCall):
        judged.append(call)
        return ALLOW

    server = DecideServer(endpoint, judge, lambda c, v: None, lambda r: None)
    await server.start()
    return server


async def test_every_answer_says_the_daemons_version_and_a_probe_is_judged_as_nothing(folder):
    judged: list[PluginCall] = []
    path = folder / "plugin.sock"
    server = await served(PluginEndpoint(path), judged)
    stamp = f"{OURS}; protocol={PROTOCOL}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as http:
            async with http.post("http://localhost/v1/decide", data=body()) as r:
                assert (r.status, r.headers[VERSION_HEADER]) == (415, stamp)
            headers = {"Content-Type": "application/json"}
            async with http.post("http://localhost/v1/decide", data=body(), headers=headers) as r:
                assert (r.status, r.headers[VERSION_HEADER]) == (200, stamp)
            async with http.get("http://localhost/v2/decide") as r:
                assert (r.status, r.headers[VERSION_HEADER]) == (404, stamp)
            probe = json.dumps({"probe": True, "plugin_version": None, "protocol": 2}).encode()
            async with http.post("http://localhost/v1/decide", data=probe, headers=headers) as r:
                assert (r.status, await r.json()) == (
                    200,
                    {"monitor_version": OURS, "protocol": PROTOCOL},
                )
    finally:
        await server.close()
    assert len(judged) == 1


async def test_a_plugin_of_another_release_is_answered_and_said_once_per_plugin(folder):
    judged: list[PluginCall] = []
    path = folder / "plugin.sock"
    server = await served(PluginEndpoint(path), judged)
    headers = {"Content-Type": "application/json"}
    questions = [
        body(plugin_version=OURS, protocol=PROTOCOL),  # this release's: nothing to say
        body(),  # a file left behind by an upgrade
        body(),
        body(directory="/q"),  # another project's plugin: said too
        body(plugin_version="9.0.0+0123abcd", protocol=PROTOCOL + 1),  # a newer one
        body(plugin_version="9.0.0+0123abcd", protocol=PROTOCOL + 1),
    ]
    try:
        with structlog.testing.capture_logs() as logs:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as http:
                for question in questions:
                    url = "http://localhost/v1/decide"
                    async with http.post(url, data=question, headers=headers) as r:
                        assert (r.status, await r.json()) == (200, {"verdict": "allow"})
    finally:
        await server.close()
    assert len(judged) == len(questions)
    said = [
        (log["directory"], log["plugin_version"], log["advice"])
        for log in logs
        if log["event"] == "plugin.version_differs"
    ]
    assert said == [
        ("/p", None, skew_advice(None, None, OURS)),
        ("/q", None, skew_advice(None, None, OURS)),
        ("/p", "9.0.0+0123abcd", skew_advice("9.0.0+0123abcd", PROTOCOL + 1, OURS)),
    ]
    assert "restart the monitor" in said[2][2]


def test_status_says_a_plugin_of_another_release():
    stats = PluginStats()
    stats.asked(PluginCall(SESSION, "c", "read", {}, "/w"), ALLOW, 98.0)
    stats.asked(PluginCall(SESSION, "c", "read", {}, "/v", plugin_version=OURS), ALLOW, 98.0)
    plugins = {
        "endpoint": "unix:/run/p.sock",
        "refused": 0,
        "directories": stats.view(),
        "unasked_calls": None,
        "version": OURS,
    }
    status = {
        "version": "1",
        "url": "http://x",
        "directory": None,
        "dry_run": False,
        "stream": {"state": "connected", "frames": 1, "last_frame_unix": 97.0},
        "totals": {"sessions": 0, "busy": 0, "held": 0, "interventions": 0},
        "sessions": [],
        "plugins": plugins,
    }
    assert render_status(status, 100).splitlines()[-4:] == [
        "plugins asking at unix:/run/p.sock:",
        "  /w: 1 calls, 0 blocked, 0 fell open, last request 2 s ago",
        f"    the installed plugin is of an earlier release {EARLIER}, this monitor {OURS}: "
        "run `opencode-loop-monitor plugin install` and restart OpenCode",
        "  /v: 1 calls, 0 blocked, 0 fell open, last request 2 s ago",
    ]


# -- plugin status -----------------------------------------------------------------------------


def environ(home: Path) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(home / "config"), "XDG_RUNTIME_DIR": str(home / "run")}


URL = "http://127.0.0.1:4321"


def plugin_file(home: Path) -> Path:
    return home / "config" / "opencode" / "plugins" / FILE_NAME


async def plugin_status(home: Path, **flags: str) -> tuple[str, int]:
    # In a thread: it asks the daemon this loop serves, and waits for the answer.
    settings = load_settings({"url": URL, **flags}, {}, isatty=False)
    text, code = await asyncio.to_thread(status, settings, None, environ(home))
    return text, code


async def test_plugin_status_of_one_release_exits_0(folder):
    install(load_settings({"url": URL}, {}, isatty=False), None, environ(folder))
    socket = folder / "run" / "opencode-loop-monitor" / socket_name(URL)
    server = await served(PluginEndpoint(socket), [])
    try:
        text, code = await plugin_status(folder)
    finally:
        await server.close()
    assert (code, text.splitlines()[-1]) == (EX_OK, f"a monitor answers there, version {OURS}")


async def test_plugin_status_over_tcp_asks_signed_as_the_plugin_does(folder):
    flags = {"plugin_addr": "127.0.0.1:0", "plugin_token_file": str(folder / "token")}
    server = await served(PluginEndpoint(None, "127.0.0.1", 0, folder / "token"), [])
    try:
        flags["plugin_addr"] = f"127.0.0.1:{server.port}"
        install(load_settings({"url": URL, **flags}, {}, isatty=False), None, environ(folder))
        text, code = await plugin_status(folder, **flags)
        (folder / "token").write_text("another\n")  # the plugin's token is not the daemon's
        refused_text, refused_code = await plugin_status(folder, **flags)
    finally:
        await server.close()
    assert (code, text.splitlines()[-1]) == (EX_OK, f"a monitor answers there, version {OURS}")
    assert refused_code == EX_OTHER_RELEASE
    assert refused_text.splitlines()[-1] == (
        "the monitor there refuses the plugin's questions (401 missing or wrong bearer token or "
        f"signature); it is version {OURS}"
    )


async def test_plugin_status_says_a_plugin_file_left_behind_and_exits_non_zero(folder):
    install(load_settings({"url": URL}, {}, isatty=False), None, environ(folder))
    socket = folder / "run" / "opencode-loop-monitor" / socket_name(URL)
    endpoint = PluginEndpoint(socket, socket_dir=socket.parent)
    plugin_file(folder).write_text(earlier_plugins.written("3872d79")(endpoint))
    socket = folder / "run" / "opencode-loop-monitor" / socket_name(URL)
    server = await served(PluginEndpoint(socket), [])
    try:
        text, code = await plugin_status(folder)
    finally:
        await server.close()
    assert code == EX_OTHER_RELEASE
    assert text.splitlines()[-2:] == [
        f"the installed plugin is of an earlier release {EARLIER}, this monitor {OURS}: "
        "run `opencode-loop-monitor plugin install` and restart OpenCode",
        f"a monitor answers there, version {OURS}",
    ]


async def stand_in(socket: Path, answer: web.Response) -> web.AppRunner:
    """A daemon of another release on `socket`, answering every question with `answer`."""

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return answer

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    socket.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    await web.UnixSite(runner, str(socket)).start()
    return runner


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # A daemon from before versions refuses this release's fields (issue 46's trial).
        (
            lambda: web.json_response({"error": "unknown field(s): message_id"}, status=400),
            "the monitor there refuses the plugin's questions (400 unknown field(s): "
            "message_id): it says no version, a monitor of an earlier release than this one "
            f"({OURS}): restart it",
        ),
        # One that ignores them, and answers, but is of an earlier release all the same.
        (
            lambda: web.json_response({"verdict": "allow"}),
            f"the monitor there is of an earlier release {EARLIER}, this command {OURS}: "
            "restart the monitor with this release",
        ),
        (
            lambda: web.json_response(
                {"monitor_version": "9.0.0+0123abcd", "protocol": 3},
                headers={VERSION_HEADER: "9.0.0+0123abcd; protocol=3"},
            ),
            f"the monitor there is version 9.0.0+0123abcd, this command {OURS}: restart the "
            "monitor with this release",
        ),
    ],
)
async def test_plugin_status_says_a_monitor_of_another_release_and_exits_non_zero(
    folder, answer, said
):
    install(load_settings({"url": URL}, {}, isatty=False), None, environ(folder))
    socket = folder / "run" / "opencode-loop-monitor" / socket_name(URL)
    runner = await stand_in(socket, answer())
    try:
        text, code = await plugin_status(folder)
    finally:
        await runner.cleanup()
    assert (code, text.splitlines()[-1]) == (EX_OTHER_RELEASE, said)
