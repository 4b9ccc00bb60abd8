"""The watch shell against a stand-in server that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import gc
import io
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.core.calls import Step
from monitor.errors import ConfigError
from monitor.shell.notify import Notifier
from monitor.shell.stream import CONNECTION_LOST
from monitor.shell.timing import Timing
from monitor.shell.watch import Watch
from monitor.testing import FakeOpencode, engine_call, frames, no_headers, play
from tests import frames_factory as ff
from tests.frames_factory import call, envelope, idle
from tests.harness import FAST, events, loop_frames, start, stop, wait_for


async def test_loop_is_aborted_and_feedback_posted():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async"))
        assert await stop(*running) == 0
    [abort] = fake.of("abort")
    [prompt] = fake.of("prompt_async")
    assert abort.path == "/session/ses_s1/abort" and abort.query == {"directory": "/w"}
    assert prompt.query == {"directory": "/w"}
    assert "noReply" not in prompt.body
    assert "1 call (read) repeated 4 times" in prompt.body["parts"][0]["text"]
    [detected] = events(logs, "loop.detected")
    assert {k: detected[k] for k in ("session_id", "directory", "cycle_length", "repetitions")} == {
        "session_id": "ses_s1",
        "directory": "/w",
        "cycle_length": 1,
        "repetitions": 4,
    }
    assert detected["tools"] == ["read"] and "outcome" not in detected
    assert detected["part_id"] == "p4"
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["session_id"], outcome["part_id"], outcome["outcome"]) == (
        "ses_s1",
        "p4",
        "aborted",
    )
    # Decided, then acted on: the decision is logged before the request is answered.
    names = [entry["event"] for entry in logs if entry["event"] != "stream.resynced"]
    assert names.index("loop.detected") < names.index("intervention.outcome")
    assert events(logs, "feedback.sent")[0]["session_id"] == "ses_s1"


async def test_what_was_made_before_a_run_is_out_of_the_collectors_sight_until_it_ends():
    # A full collection walked every module and setting of the process: a pause of ~35 ms.
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 1))])
    server, watch, task = await start(fake)
    try:
        # server.connected and the three updates of the call
        await wait_for(lambda: watch.follow is not None and watch.follow.stream.frames == 4)
        frozen = gc.get_freeze_count()
    finally:
        assert await stop(server, watch, task) == 0
    # The modules and the tracker at least, and nothing kept from the collector afterwards.
    assert frozen > 10_000 and gc.get_freeze_count() == 0


async def test_clean_end_reconnects_and_resyncs():
    fake = FakeOpencode(
        streams=[
            play(loop_frames("ses_s1", 3), then="end"),
            play(loop_frames("ses_s1", 1, prefix="q")),
        ],
        busy={},  # after the reconnect the server says nothing runs: s1's run is over
    )
    # server.connected and three updates per call, on each connection.
    frames_sent = (1 + 3 * 3) + (1 + 3 * 1)
    with capture_logs() as logs:
        running = await start(fake)
        watch = running[1]
        # Asked at the first connect, and at the reconnect for s1's directory and ours.
        await wait_for(lambda: fake.connections == 2 and len(fake.of("status")) == 3)
        await wait_for(lambda: watch.follow.stream.frames == frames_sent)
        await stop(*running)
    # 3 calls before, 1 after: the history was dropped, and no decision was made.
    assert watch.monitor.tracker.interventions("s1") == 0 and fake.of("abort") == []
    [disconnected] = events(logs, "stream.disconnected")
    assert disconnected["reason"] == "stream ended" and disconnected["retry_in_s"] <= 0.1
    assert len(events(logs, "stream.connected")) == 2


async def test_resync_reads_busy_runs_back():
    fake = FakeOpencode(
        streams=[
            play(loop_frames("ses_s1", 3), then="end"),
            play(loop_frames("ses_s1", 1, prefix="q")),
        ],
        busy={"ses_s1": {"type": "busy"}},
        # The server's record of the run: the three calls we saw.
        messages={"ses_s1": ff.run_record("ses_s1", 3)},
    )
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("abort"))
        await stop(*running)
    # After the reconnect the server is asked about the directory the stream showed.
    assert {"directory": "/w"} in [r.query for r in fake.of("status")]
    # The run is seeded from the whole record (after the first connect's look for held
    # sessions); the checks before the abort and before the feedback read only its end.
    reads = [(r.path, r.query) for r in fake.of("message")]
    path = "/session/ses_s1/message"
    recent = {"directory": "/w", "limit": "20"}
    assert reads == [(path, {}), (path, {"directory": "/w"}), (path, recent), (path, recent)]
    [detected] = events(logs, "loop.detected")
    assert (detected["part_id"], detected["call_index"]) == ("q1", 4)
    assert events(logs, "session.seeded")[-1] == {
        "event": "session.seeded",
        "log_level": "info",
        "session_id": "ses_s1",
        "calls": 3,
        "loop": False,
    }


async def test_a_watch_started_before_an_abort_s_calls_ended_takes_their_ends_as_late():
    """Issue 43: the monitor starts once the feedback was stored, the aborted step's six reads
    still running in the record (before the feedback); their ends, on the stream after the
    read-back, are late (`late_frames`), not a cycle of the feedback's run."""
    step = ff.assistant_message(
        "ses_s1", *(ff.export_part("ses_s1", f"p{n}", "running") for n in range(1, 7))
    )
    step["info"]["error"] = {"name": "MessageAbortedError"}
    feedback = ff.user_message("ses_s1", "Automatic notice: your run was stopped.")
    record = [ff.user_message("ses_s1"), step, feedback, ff.assistant_message("ses_s1")]
    ends = [
        envelope(
            ff.tool_part(
                "ses_s1", f"p{n}", "read", "error", ff.READ, error="Tool execution aborted"
            ),
            "/w",
        )
        for n in range(1, 7)
    ]
    fake = FakeOpencode(
        streams=[play(frames(*ends))],
        busy={"ses_s1": {"type": "busy"}},
        messages={"ses_s1": record},
    )
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        try:
            await wait_for(lambda: watch.follow is not None and watch.follow.stream.frames == 7)

            def taken() -> int:
                """The ends taken: late, or (as before the fix) calls of the run."""
                views = watch.monitor.tracker.sessions_view()
                return watch.monitor.tracker.stray[Step.LATE] + sum(view.calls for view in views)

            await wait_for(lambda: taken() == 6)
        finally:
            await stop(server, watch, task)
    assert watch.monitor.tracker.stray == {Step.LATE: 6}
    assert (fake.of("abort"), fake.of("prompt_async"), events(logs, "loop.detected")) == (
        [],
        [],
        [],
    )
    assert [(v.run_calls, v.interventions) for v in watch.monitor.tracker.sessions_view()] == [
        (0, 1)
    ]


async def test_calls_made_while_away_count():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 2), then="end"), play()],
        busy={"ses_s1": {"type": "busy"}},
        # Two more identical calls ran while the stream was down: the loop is complete.
        messages={"ses_s1": ff.run_record("ses_s1", 4)},
    )
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    [detected] = events(logs, "loop.detected")
    assert (detected["part_id"], detected["call_index"]) == ("p4", 4)
    assert fake.of("abort")[0].path == "/session/ses_s1/abort"


async def test_a_loop_found_in_a_read_back_is_counted_like_one_from_the_stream():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 2), then="end"), play()],
        busy={"ses_s1": {"type": "busy"}},
        messages={"ses_s1": ff.run_record("ses_s1", 4)},
    )
    with capture_logs() as logs:
        running = await start(fake, metrics_addr="127.0.0.1:0")
        watch = running[1]
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    assert [d["call_index"] for d in events(logs, "loop.detected")] == [4]
    assert watch.metrics is not None
    loops = watch.metrics.registry.get_sample_value(
        "opencode_loop_monitor_loops_detected_total", {"cycle_length": "1", "rule": "cycle"}
    )
    assert loops == 1.0


async def test_a_run_under_way_at_start_is_read_back():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 1, prefix="q"))],
        busy={"ses_s1": {"type": "busy"}},
        messages={"ses_s1": ff.run_record("ses_s1", 3)},
    )
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("abort"))
        await stop(*running)
    assert fake.of("status")[0].query == {}  # the server's own directory: we know no other
    [detected] = events(logs, "loop.detected")
    assert (detected["part_id"], detected["call_index"]) == ("q1", 4)


async def test_a_run_found_busy_mid_resync_counts_a_call_read_back_and_streamed_once():
    # A session unknown at the connect: its frames wait for its directory's answer, the run
    # is read back (3 reads), then its frames are fed: call 3 again (counted once), then 4.
    streamed = [envelope(f, "/w") for f in call("ses_s1", "p3", "read", ff.READ)]
    fake = FakeOpencode(
        streams=[play(frames(*streamed) + loop_frames("ses_s1", 1, prefix="q"))],
        busy={"ses_s1": {"type": "busy"}},
        messages={"ses_s1": ff.run_record("ses_s1", 3)},
    )
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("abort"))
        await stop(*running)
    [seeded] = events(logs, "session.seeded")
    assert seeded["calls"] == 3
    [detected] = events(logs, "loop.detected")
    assert (detected["part_id"], detected["call_index"]) == ("q1", 4)


async def test_a_session_being_stopped_is_not_read_back():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4), then="end"), play()], delays={"abort": 0.3}
    )
    running = await start(fake)
    await wait_for(lambda: fake.of("status"))
    # Busy from now on, with the loop in its record: only the abort in flight tells.
    fake.busy = {"ses_s1": {"type": "busy"}}
    fake.messages = {"ses_s1": ff.run_record("ses_s1", 4)}
    await wait_for(lambda: fake.of("prompt_async"))
    await stop(*running)
    [abort] = fake.of("abort")
    prompt = fake.of("prompt_async")[0]
    # The stream came back while the abort was under way; the run was not read back then.
    assert [r for r in fake.of("status") if abort.at < r.at < prompt.at]
    # Read only by the abort's own checks (another monitor's intervention?), one before the
    # abort and one before the feedback, never by the resync.
    reads = [r for r in fake.of("message") if r.at < prompt.at]
    assert [r.at < abort.at for r in reads] == [True, False]


async def test_error_in_mid_read_reconnects():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 2), then="break")])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.connections >= 2)
        await stop(*running)
    # Issue 45: the reason in people's words, not aiohttp's ClientPayloadError.
    reason = events(logs, "stream.disconnected")[0]["reason"]
    assert reason == CONNECTION_LOST


async def test_silent_stream_hits_read_timeout_and_reconnects():
    fake = FakeOpencode(streams=[play()])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.connections >= 2, timeout=3)
        await stop(*running)
    first, second = [r.at for r in fake.requests if r.path == "/global/event"][:2]
    assert second - first >= 0.5  # the read limit ran out first
    # The socket's read timeout and the frame deadline run out together; either says it.
    reason = events(logs, "stream.disconnected")[0]["reason"]
    assert reason in ("read timeout", "no frame for 0.5 s")


async def test_opencode_2s_comment_heartbeats_keep_a_quiet_stream():
    # 2.2.5's only sign of life on an idle server is a `: heartbeat` comment (every 15 s,
    # inside the read limit): its stream is kept for as long as they come, and a loop after
    # a quiet while is stopped on the same connection.
    beats = 12  # 1.2 s of heartbeats, past the 0.5 s read limit

    async def quiet(request, response):
        await response.prepare(request)
        await response.write(frames({"id": "evt_0", "type": "server.connected", "data": {}}))
        for _ in range(beats):
            await response.write(b": heartbeat\n\n")
            await asyncio.sleep(0.1)
        reads = [engine_call("ses_s1", n, "read", {"path": "a.md"}, 3 * n) for n in range(1, 5)]
        await response.write(frames(*(event for call in reads for event in call)))
        await asyncio.sleep(3600)

    fake = FakeOpencode(generation=2, streams=[quiet])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("interrupt"), timeout=5)
        await stop(*running)
    assert fake.connections == 1 and events(logs, "stream.disconnected") == []
    assert running[1].status()["stream"]["frames"] >= 1 + beats + 12


async def test_a_stream_of_comments_alone_is_dropped_at_the_read_limit():
    # A byte every 0.1 s keeps the socket busy, well inside the 0.5 s read timeout.
    async def comments(request, response):
        await response.prepare(request)
        await response.write(frames({"type": "server.connected", "properties": {}}))
        for _ in range(100):
            await response.write(b":\n")
            await asyncio.sleep(0.1)

    fake = FakeOpencode(streams=[comments])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.connections >= 2, timeout=3)
        await stop(*running)
    first, second = [r.at for r in fake.requests if r.path == "/global/event"][:2]
    assert 0.5 <= second - first < 1.5
    assert events(logs, "stream.disconnected")[0]["reason"] == "no frame for 0.5 s"


async def test_stream_without_headers_hits_read_timeout():
    fake = FakeOpencode(streams=[no_headers])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.connections >= 2, timeout=3)
        await stop(*running)
    # It never connected: the failure is not called a disconnection.
    assert events(logs, "stream.disconnected") == []
    assert events(logs, "stream.connect_failed")[0]["reason"] == "no answer for 0.5 s"


async def test_a_server_that_takes_the_request_and_never_answers_is_retried_early(monkeypatch):
    # A server still starting after a restart: the reconnect waited out the whole read
    # limit (25 s) before it tried again. The answer has a shorter limit of its own.
    import dataclasses

    from monitor.shell import stream

    monkeypatch.setattr(stream, "HEADERS_TIMEOUT_S", 0.3)
    fake = FakeOpencode(streams=[play(then="end"), no_headers, play()])
    with capture_logs() as logs:
        running = await start(fake, dataclasses.replace(FAST, read_timeout=30))
        await wait_for(lambda: events(logs, "stream.reconnected"), timeout=5)
        await stop(*running)
    assert events(logs, "stream.retry_failed")[0]["reason"] == "no answer for 0.3 s"
    assert fake.connections == 3


async def test_garbage_frames_are_counted_and_the_loop_still_caught():
    garbage = (
        b"data: not json\n\n"
        b"data: [1, 2]\n\n"
        + frames({"type": "some.future.event", "properties": {}})
        + frames({"type": "message.part.updated", "properties": {"part": {"type": "tool"}}})
        + b": a comment\n\n"
        + b'event: odd\nid: 7\nretry: x\ndata: {"type": "session.idle"}\n\n'
        + b'data: {"half": \n\n'
    )
    fake = FakeOpencode(streams=[play(garbage + loop_frames("ses_s1", 4))])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async"))
        watch = running[1]
        await stop(*running)
    assert sum(watch.monitor.tracker.malformed.values()) == 5
    [logged] = events(logs, "frame.malformed")  # rate limited: one line for the burst
    assert logged["reason"] == "frame is not JSON" and logged["count"] == 1
    assert len(fake.of("abort")) == 1 and fake.connections == 1


async def test_abort_500_then_200_is_retried():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))], answers={"abort": [500, 200]})
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    assert fake.actions() == [
        "/session/ses_s1/abort",
        "/session/ses_s1/abort",
        "/session/ses_s1/prompt_async",
    ]
    assert events(logs, "intervention.outcome")[0]["outcome"] == "aborted"


async def test_abort_failing_every_time_is_logged_and_the_daemon_goes_on():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4) + loop_frames("ses_s2", 4))],
        answers={"abort": [503]},
    )
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: len(events(logs, "intervention.outcome")) == 2)
        await stop(*running)
    assert len(fake.of("abort")) == 2 * FAST.retry.attempts
    assert fake.of("prompt_async") == []
    detected = events(logs, "intervention.outcome")
    assert [d["outcome"] for d in detected] == ["abort_failed", "abort_failed"]
    assert "503" in detected[0]["error"]


async def test_prompt_timeout_does_not_stop_the_daemon():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4) + loop_frames("ses_s2", 4))],
        delays={"prompt_async": 2.0},
    )
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: len(events(logs, "feedback.failed")) == 2, timeout=8)
        await stop(*running)
    assert sorted(r.path for r in fake.of("abort")) == [
        "/session/ses_s1/abort",
        "/session/ses_s2/abort",
    ]
    # Sent, never answered, not among the messages: never sent again (it may still arrive).
    assert len(fake.of("prompt_async")) == 2
    error = events(logs, "feedback.failed")[0]["error"]
    assert "TimeoutError" in error and "not sent again" in error


async def test_abort_404_drops_the_session_and_sends_no_feedback():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))], answers={"abort": [404]})
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: events(logs, "intervention.outcome"))
        watch = running[1]
        await stop(*running)
    assert len(fake.of("abort")) == 1 and fake.of("prompt_async") == []
    assert events(logs, "intervention.outcome")[0]["outcome"] == "abort_failed"
    assert watch.monitor.tracker.interventions("ses_s1") == 0  # forgotten


async def test_slow_abort_of_one_session_does_not_delay_another():
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_slow", 4) + loop_frames("ses_fast", 4))],
        delays={"ses_slow/abort": 0.4},
    )
    running = await start(fake)
    await wait_for(lambda: len(fake.of("prompt_async")) == 2)
    await stop(*running)
    order = fake.actions()
    assert order.index("/session/ses_fast/prompt_async") < order.index(
        "/session/ses_slow/prompt_async"
    )


async def test_dry_run_calls_no_api():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))])
    with capture_logs() as logs:
        running = await start(fake, dry_run=True)
        await wait_for(lambda: events(logs, "intervention.outcome"))
        await stop(*running)
    assert fake.actions() == []
    assert events(logs, "intervention.outcome")[0]["outcome"] == "dry_run"


async def test_escalation_third_intervention_holds():
    # The model repeats the stopped loop in each run the feedback starts (armed: 4, then the
    # first call of each next run); each is a new intervention, the one before carried out.
    fake = FakeOpencode()
    fake.streams = [fake.live]
    with capture_logs() as logs:
        running = await start(fake, max_interventions=2)
        await wait_for(fake.live_connected.is_set)
        await fake.push(loop_frames("ses_s1", 4))
        for run in (1, 2):
            await wait_for(lambda run=run: len(fake.of("prompt_async")) == run)
            ended = frames(envelope(idle("ses_s1"), "/w"))
            await fake.push(ended + loop_frames("ses_s1", 1, prefix=f"r{run}-"))
        await wait_for(lambda: len(fake.of("prompt_async")) == 3)
        await stop(*running)
    bodies = [r.body for r in fake.of("prompt_async")]
    assert ["noReply" in b for b in bodies] == [False, False, True]
    assert "on hold" in bodies[2]["parts"][0]["text"]
    escalated = [d["escalated"] for d in events(logs, "loop.detected")]
    outcomes = [d["outcome"] for d in events(logs, "intervention.outcome")]
    assert list(zip(outcomes, escalated, strict=True)) == [
        ("aborted", False),
        ("aborted", False),
        ("held", True),
    ]


async def test_unauthorized_stream_is_a_config_error():
    async def refuse(request, response):
        raise web.HTTPUnauthorized()

    fake = FakeOpencode(streams=[refuse])
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    settings = load_settings({"url": str(server.make_url("")).rstrip("/")}, {}, isatty=False)
    with capture_logs() as logs, pytest.raises(ConfigError, match="401") as raised:
        await asyncio.wait_for(Watch(settings, Notifier(None), FAST).run(), 5)
    await server.close()
    assert fake.connections == 1
    # Issue 45: a bare `monitor.stopped` came before the error, as if stopped cleanly; the
    # last line now says why it stopped.
    last = logs[-1]
    assert (last["event"], last["log_level"], last["error"]) == (
        "monitor.stopped",
        "error",
        str(raised.value),
    )
    assert last["signal"] is None


async def test_the_role_lines_of_watch_name_no_session(tmp_path):
    """Issue 45: `monitor.acting session_id=None` at every start of `watch`."""
    fake = FakeOpencode(streams=[play()])
    with capture_logs() as logs:
        running = await start(fake, roles=tmp_path, plugin_socket="off")
        await wait_for(lambda: events(logs, "stream.resynced"))
        await stop(*running)
    roles = [e for e in logs if e["event"] in ("monitor.acting", "monitor.standby")]
    assert roles and all("session_id" not in e for e in roles)


async def test_a_metrics_address_in_use_says_a_monitor_probably_runs_there():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = {"url": "http://127.0.0.1:1", "metrics_addr": f"127.0.0.1:{port}"}
        settings = load_settings(flags, {}, isatty=False)
        with pytest.raises(ConfigError) as raised:
            await asyncio.wait_for(Watch(settings, Notifier(None), FAST).run(), 5)
    assert str(raised.value).startswith(f"metrics_addr 127.0.0.1:{port}: cannot listen (")
    assert str(raised.value).endswith(
        "another monitor is probably running there already (`opencode-loop-monitor status "
        f"--metrics-addr 127.0.0.1:{port}` shows it): give this one another address"
    )


async def test_credentials_refused_after_the_stream_worked_are_retried_not_fatal():
    # The server restarted with another password: the monitor said so and kept trying (it
    # exited 78 and stayed down under systemd), and watches again once the server takes it.
    async def refuse(request, response):
        raise web.HTTPUnauthorized()

    fake = FakeOpencode(streams=[play(then="end"), refuse, refuse, refuse, play()])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: events(logs, "stream.reconnected"), timeout=10)
        assert not running[2].done()
        await stop(*running)
    [diagnosis] = events(logs, "stream.diagnosis")
    assert diagnosis["problem"] == "credentials_refused" and "401" in diagnosis["hint"]
    assert events(logs, "stream.disconnected")[0]["reason"] == "stream ended"
    assert events(logs, "stream.reconnected")[0]["attempts"] == 4
    assert fake.connections == 5


async def test_directory_mode_reads_the_project_stream():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))])
    running = await start(fake, directory="/proj")
    await wait_for(lambda: fake.of("abort"))
    await stop(*running)
    # After the three health routes that tell which server this is.
    assert [r.path for r in fake.requests[:3]] == ["/api/info", "/global/health", "/api/health"]
    stream_request = fake.requests[3]
    assert (stream_request.path, stream_request.query) == ("/event", {"directory": "/proj"})


async def test_large_frame_is_read():
    big = "x" * 3_000_000
    events_ = [envelope(f) for n in range(4) for f in call("ses_s1", f"p{n}", "write", {"c": big})]
    fake = FakeOpencode(streams=[play(frames(*events_))])
    running = await start(fake)
    await wait_for(lambda: fake.of("abort"), timeout=10)
    await stop(*running)
    assert fake.connections == 1


def test_timing_defaults_suit_the_real_server():
    timing = Timing()
    assert timing.read_timeout == 25.0 and timing.reconnect.cap == 2.0


async def test_record_appends_every_raw_frame(tmp_path):
    from monitor.core.frames import iter_sse_data

    path = tmp_path / "day.sse"
    path.write_text('data: {"earlier": true}\n\n', encoding="utf-8")
    body = b"data: not json\n\n" + b'data: {"a":\ndata: 1}\n\n' + loop_frames("ses_s1", 4)
    fake = FakeOpencode(streams=[play(body)])
    running = await start(fake, record=str(path))
    await wait_for(lambda: fake.of("abort"))
    await stop(*running)
    with open(path, encoding="utf-8") as lines:
        recorded = list(iter_sse_data(lines))
    assert recorded[:4] == [
        '{"earlier": true}',
        '{"type": "server.connected", "properties": {}}',
        "not json",
        '{"a":\n1}',
    ]
    assert len(recorded) == 4 + 12


async def test_record_to_an_unwritable_path_is_a_config_error(tmp_path):
    fake = FakeOpencode()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    settings = load_settings(
        {"url": str(server.make_url("")).rstrip("/"), "record": str(tmp_path / "no" / "f.sse")},
        {},
        isatty=False,
    )
    with pytest.raises(ConfigError, match="record .*f.sse: cannot append"):
        await Watch(settings, Notifier(None), FAST).run()
    await server.close()
    assert fake.connections == 0


async def test_metrics_scraped_from_a_running_monitor():
    import aiohttp

    fake = FakeOpencode(
        streams=[
            play(
                b"data: nope\n\n" + loop_frames("ses_s1", 4) + loop_frames("ses_s2", 2), then="end"
            )
        ],
        busy={"ses_s2": {"type": "busy"}},
        messages={"ses_s2": ff.run_record("ses_s2", 2)},
    )
    running = await start(fake, metrics_addr="127.0.0.1:0")
    watch = running[1]
    await wait_for(lambda: fake.of("prompt_async") and len(fake.of("status")) == 3)
    port = watch.metrics_server.port
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{port}"
        async with http.get(base + "/metrics") as response:
            text = await response.text()
        async with http.get(base + "/healthz") as response:
            health = response.status
        async with http.get(base + "/readyz") as response:
            ready = response.status
    await stop(*running)
    lines = set(text.splitlines())
    prefix = "opencode_loop_monitor_"
    assert f'{prefix}loops_detected_total{{cycle_length="1",rule="cycle"}} 1.0' in lines
    assert f'{prefix}interventions_total{{outcome="aborted"}} 1.0' in lines
    assert f"{prefix}malformed_frames_total 1.0" in lines
    assert f'{prefix}frames_total{{event_type="message.part.updated"}} 18.0' in lines
    assert f"{prefix}stream_connected 1.0" in lines
    assert f"{prefix}sessions_busy 1.0" in lines  # s1 was reset, s2 holds 2 calls
    assert f"{prefix}sessions_known 2.0" in lines  # both, as `status` counts them
    assert any(line.startswith(f"{prefix}stream_reconnects_total 1.0") for line in lines)
    assert f"{prefix}sessions_held 0.0" in lines
    # No session id becomes a label or a value (the ids here are ses_s1, ses_s2).
    assert "ses_" not in text
    assert (health, ready) == (200, 200)


async def test_started_log_lists_the_detection_settings():
    fake = FakeOpencode(streams=[play()])
    with capture_logs() as logs:
        running = await start(fake, ignore_tool=["todowrite"], ignore_arg=["bash.description"])
        await wait_for(lambda: events(logs, "stream.connected"))
        await stop(*running)
    [started] = events(logs, "monitor.started")
    assert {k: v for k, v in started.items() if k not in ("url", "version")} == {
        "event": "monitor.started",
        "log_level": "info",
        "directory": None,
        "dry_run": False,
        "max_period": 10,
        "repeats": 3,
        "history": 32,
        "match": "input",
        "ignore_tools": ["todowrite"],
        "ignore_args": {"bash": ["description"]},
        "on_loop": "resume",
        "max_interventions": 2,
        "first_action": "block",
        "armed_runs": 2,
        "max_sessions": 10_000,
        "failure_repeats": 4,
        "wait_calls": 20,
        "profile": "opencode",
        "text_repeats": 5,
        "text_steps": 8,
        "no_progress_runs": 5,
        "revisits": 12,
        "circles": 10,
        "runaway_updates": 20,
        "call_seconds": 0,
        "run_budget": "off",
        "tree_budget": "off",
        "tree_depth": 3,
        "tree_fanout": 20,
        "permissions": "gate",
        "permission_grace": 30.0,
    }


async def test_a_failing_record_stops_recording_not_watching(tmp_path, monkeypatch):
    class FullDisk(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("monitor.shell.watch.open_record", lambda path: FullDisk())
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))])
    with capture_logs() as logs:
        running = await start(fake, record=str(tmp_path / "r.sse"))
        await wait_for(lambda: fake.of("abort"))
        await stop(*running)
    [failed] = events(logs, "record.failed")
    assert failed["error"] == "No space left on device" and failed["path"].endswith("r.sse")
    assert fake.connections == 1 and len(fake.of("prompt_async")) == 1


async def test_escalation_counts_the_interventions_of_an_earlier_monitor():
    from monitor.core.feedback import MARK

    feedback = ff.user_message("ses_s1", MARK + "a repeated tool-call cycle was detected ...")
    record = ff.run_record("ses_s1", 4, prefix="a")
    record += [feedback, *ff.export_reads("ses_s1", 4, prefix="b"), feedback]
    fake = FakeOpencode(
        streams=[play(loop_frames("ses_s1", 4, prefix="c"))],
        busy={"ses_s1": {"type": "busy"}},
        messages={"ses_s1": record},  # a monitor before us intervened twice
    )
    with capture_logs() as logs:
        running = await start(fake, max_interventions=2)
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    [detected] = events(logs, "loop.detected")
    [outcome] = events(logs, "intervention.outcome")
    assert (outcome["outcome"], detected["escalated"], detected["interventions"]) == (
        "held",
        True,
        3,
    )
    assert fake.of("prompt_async")[0].body["noReply"] is True


async def test_a_stop_goes_ahead_of_the_resyncs_reads_within_their_bound():
    import dataclasses

    from monitor.shell.resync import RESYNC_CONCURRENCY

    @dataclasses.dataclass
    class Slow(FakeOpencode):
        under_way: int = 0
        most: int = 0
        # Once the second connect has asked /d0 (where the loop's session may be busy),
        # its other status reads wait for the gate: set once the abort came.
        gate: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
        asked_d0: bool = False

        async def _status(self, request):
            self.under_way += 1
            self.most = max(self.most, self.under_way)
            if self.connections > 1 and request.query.get("directory") == "/d0":
                self.asked_d0 = True
            elif self.asked_d0:
                await self.gate.wait()
            await asyncio.sleep(0.02)
            self.under_way -= 1
            return await super()._status(request)

    # A call under way in each of 200 directories, then the stream ends: the resync asks
    # every one of them (and the configured one); the new stream's first frames are a loop.
    first = [
        envelope(f, f"/d{n}") for n in range(200) for f in call(f"ses_d{n}", "p", "read", {})[:2]
    ]
    fake = Slow(
        streams=[play(frames(*first), then="end"), play(loop_frames("ses_x", 4, "/d0"))],
        busy={f"ses_d{n}": {"type": "busy"} for n in range(200)},
    )
    # Nothing here is about time: on a loaded machine 201 requests take seconds, and the
    # FAST timings' 0.5 s read timeout would fail them (then the test), not the bound.
    patient = dataclasses.replace(
        FAST, read_timeout=60, retry=dataclasses.replace(FAST.retry, timeout=60)
    )
    with capture_logs() as logs:
        server, watch, task = await start(fake, patient)
        try:
            # The second connect's status reads are held until the loop's abort and its
            # feedback came (the feedback is posted after a check read of its own).
            await wait_for(lambda: fake.of("prompt_async"), timeout=60)
            held = len(events(logs, "stream.resynced"))
            fake.gate.set()
            await wait_for(lambda: len(events(logs, "stream.resynced")) == 2, timeout=60)
        finally:
            await stop(server, watch, task)
    second = fake.requests.index(fake.of("event")[1])
    asked = [r for r in fake.requests[second:] if r.path == "/session/status"]
    assert len({r.query.get("directory") for r in asked}) == 201
    assert fake.most == RESYNC_CONCURRENCY
    # The loop that came during the resync was stopped while its reads were held.
    [abort], [feedback] = fake.of("abort"), fake.of("prompt_async")
    assert abort.session_id == feedback.session_id == "ses_x" and held == 1
    assert abort.at < feedback.at < max(r.at for r in asked)


def heartbeats_after(chunk: bytes, every: float = 0.05):
    """A stream that sends `chunk`, then heartbeats alone: connected, alive, and silent."""

    async def script(request, response):
        await response.prepare(request)
        await response.write(frames({"type": "server.connected", "properties": {}}))
        await response.write(chunk)
        for _ in range(1000):
            await response.write(frames(envelope({"type": "server.heartbeat", "properties": {}})))
            await asyncio.sleep(every)

    return script


async def test_a_stream_of_heartbeats_alone_is_checked_against_the_server_and_resynced():
    import dataclasses

    # Two reads seen live; then only heartbeats, while the server ran two more (a loop).
    fake = FakeOpencode(streams=[heartbeats_after(loop_frames("ses_h", 2)), play()])
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        watch.timing = dataclasses.replace(FAST, silence=0.3)
        try:
            await wait_for(lambda: watch.monitor.tracker.running())
            # From now on the server runs ses_h, whose record holds two reads more.
            fake.busy = {"ses_h": {"type": "busy"}}
            fake.messages = {"ses_h": ff.run_record("ses_h", 4)}
            await wait_for(lambda: fake.of("abort"), timeout=5)
        finally:
            await stop(server, watch, task)
    [stalled] = events(logs, "stream.stalled")
    assert stalled["sessions"] == ["ses_h"] and stalled["silent_s"] >= 0.3
    [disconnected] = events(logs, "stream.disconnected")
    assert disconnected["reason"] == "stalled: the server ran what the stream did not show"
    assert [r.session_id for r in fake.of("abort")] == ["ses_h"]


async def test_a_long_call_under_way_is_not_taken_for_a_stall():
    import dataclasses

    # One call running for ever: the server agrees with what we saw; no reconnect.
    running = [envelope(f, "/w") for f in call("ses_l", "p1", "bash", {"c": "make"})[:2]]
    record = [
        ff.user_message("ses_l"),
        ff.assistant_message("ses_l", ff.export_part("ses_l", "p1", "running")),
    ]
    fake = FakeOpencode(
        streams=[heartbeats_after(frames(*running))],
        busy={"ses_l": {"type": "busy"}},
        messages={"ses_l": record},
    )
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        watch.timing = dataclasses.replace(FAST, silence=0.2)
        try:
            await wait_for(lambda: len(fake.of("message")) >= 2, timeout=5)
        finally:
            await stop(server, watch, task)
    assert events(logs, "stream.stalled") == [] and fake.connections == 1


async def bad_gateway(request, response) -> None:
    """What a proxy in front of a restarting server answers: no stream."""
    response.set_status(502)
    await response.prepare(request)


async def test_an_outage_is_one_warning_and_one_info_and_one_reconnect():
    import aiohttp

    # Connected, lost, six failed attempts (a proxy answering 502), then back.
    fake = FakeOpencode(streams=[play(then="end"), *[bad_gateway] * 6, play()])
    with capture_logs() as logs:
        running = await start(fake, metrics_addr="127.0.0.1:0")
        watch = running[1]
        await wait_for(lambda: fake.connections == 8 and watch.follow.stream.connected)
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{watch.metrics_server.port}/metrics"
            async with http.get(url) as response:
                text = await response.text()
        await stop(*running)
    [down] = events(logs, "stream.disconnected")
    assert down["reason"] == "stream ended"
    [back] = events(logs, "stream.reconnected")
    assert back["attempts"] == 7 and back["down_s"] > 0
    assert [e["attempts"] for e in events(logs, "stream.retry_failed")] == [1, 2, 3, 4, 5, 6]
    names = [e["event"] for e in logs]
    assert names.index("stream.disconnected") < names.index("stream.reconnected")
    # Counted once: the stream came back once, whatever it took.
    assert "opencode_loop_monitor_stream_reconnects_total 1.0" in text.splitlines()


async def test_a_stopped_loop_is_toasted_at_the_tui():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))])
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("show-toast") and events(logs, "toast.posted"))
        await stop(*running)
    [toast] = fake.of("show-toast")
    assert toast.query == {"directory": "/w"}
    assert toast.body == {
        "title": "opencode-loop-monitor",
        "message": "opencode-loop-monitor: session ses_s1 in /w looped (1 call (read) repeated "
        "4 times) and was stopped; the model was told why and carries on (rule: cycle, call 4)",
        "variant": "warning",
    }
    # After the stop, never before it.
    assert toast.at > fake.of("abort")[0].at
    assert events(logs, "toast.posted")[0]["answer"] is True


async def test_a_failing_toast_changes_nothing_else():
    fake = FakeOpencode(streams=[play(loop_frames("ses_s1", 4))], answers={"show-toast": [400]})
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async") and events(logs, "toast.failed"))
        await stop(*running)
    [failed] = events(logs, "toast.failed")
    assert failed["log_level"] == "debug" and "400" in failed["error"]
    assert events(logs, "intervention.outcome")[0]["outcome"] == "aborted"
    assert events(logs, "feedback.sent")[0]["session_id"] == "ses_s1"
