"""`watch` says when the server runs tool calls and no plugin asks it (the trial's plugin
pointed at another monitor's socket: every call fell open, and nobody read the server's
log), and `status` shows it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp
from structlog.testing import capture_logs

from monitor.shell.status import render_status
from monitor.testing import FakeOpencode, play
from tests.harness import FAST, events, loop_frames, start, stop, wait_for

RECORDINGS = Path(__file__).parent / "recordings"
# The silence check (every silence / 2) also checks for plugins: no frame need come.
TIMING = dataclasses.replace(FAST, silence=0.2, unasked=0.3)


async def test_calls_with_no_plugin_asking_are_said_once_and_shown_in_status():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 2))])
    with capture_logs() as logs:
        running = await start(fake, TIMING)
        watch = running[1]
        await wait_for(lambda: events(logs, "plugin.not_asking"))
        status = watch.status()
        await stop(*running)
    [said] = events(logs, "plugin.not_asking")
    assert said["calls"] == 2 and said["log_level"] == "warning"
    assert said["endpoint"] == status["plugins"]["endpoint"]
    assert "plugin install" in said["hint"]
    assert status["plugins"]["unasked_calls"] == 2
    [line] = [line for line in render_status(status, 0).splitlines() if "plugins" in line]
    assert line == (
        f"plugins: none asked at {said['endpoint']}; 2 tool calls had run unasked when that was "
        "noticed: the plugin is not installed where the server looks, or asks elsewhere "
        "(`opencode-loop-monitor plugin status`)"
    )


async def test_nothing_is_said_when_a_plugin_asks():
    fake = FakeOpencode(streams=[play()])
    with capture_logs() as logs:
        running = await start(fake, TIMING)
        watch = running[1]
        await wait_for(lambda: events(logs, "stream.resynced"))  # questions judged from here
        socket = str(watch.plugins.server.endpoint.socket)
        call = {
            "session_id": "ses_dd4d5c831ffemmgMvdYdtbM3cW",
            "call_id": "call_0",
            "tool": "read",
            "args": {"filePath": "/w/a"},
            "directory": "/w",
        }
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(socket)) as http:
            async with http.post("http://localhost/v1/decide", json=call) as answer:
                assert answer.status == 200
        # The positive sign: the check has seen the request.
        await wait_for(lambda: watch.monitor.unasked.done)
        status = watch.status()
        await stop(*running)
    assert events(logs, "plugin.not_asking") == []
    assert status["plugins"]["unasked_calls"] is None
    assert "unasked" not in render_status(status, 0)


async def test_calls_of_new_engine_sessions_are_not_taken_for_a_plugin_missing():
    # Issue 32: after new-engine sessions, `plugin.not_asking` advised installing a plugin that
    # was installed and loaded: 1.18 calls no 1.x plugin for a new-engine call. Only the calls
    # of classic sessions count (here 2 of 10).
    # A real capture of 1.18.33's /global/event: a new-engine session making 8 reads.
    engine = (RECORDINGS / "engine" / "new-engine-8-reads.global.sse").read_bytes()
    fake = FakeOpencode(streams=[play(engine, loop_frames("ses_s1", 2))])
    with capture_logs() as logs:
        running = await start(fake, TIMING)
        await wait_for(lambda: events(logs, "plugin.not_asking"))
        views = {view.session_id: view.calls for view in running[1].monitor.sessions_view()}
        await stop(*running)
    assert sorted(views.values()) == [2, 8]  # both sessions seen
    [said] = events(logs, "plugin.not_asking")
    assert said["calls"] == 2
