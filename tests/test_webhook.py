"""Notifications: what a stand-in webhook receives, and that a failing one delays nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.core.decisions import Outcome
from monitor.core.tracker import Tracker
from monitor.shell.backoff import Backoff
from monitor.shell.notify import Notifier
from monitor.shell.watch import Watch
from monitor.shell.webhook import Delivery, notification
from monitor.testing import FakeOpencode, frames, play
from tests.frames_factory import READ, call, envelope
from tests.harness import FAST, events, loop_frames, wait_for

QUICK = Delivery(attempts=3, timeout=0.5, backoff=Backoff(initial=0.01, cap=0.02))


@dataclass
class Hook:
    """A stand-in chat webhook: answers `status` after `delay` seconds, records each post."""

    status: int = 200
    delay: float = 0.0
    bodies: list[dict] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)
    answered_at: list[float] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        self.authorization.append(request.headers.get("Authorization"))
        await asyncio.sleep(self.delay)
        self.answered_at.append(asyncio.get_running_loop().time())
        return web.Response(status=self.status, text="ok")


@pytest.fixture
async def serve() -> AsyncIterator:
    servers: list[TestServer] = []

    async def start(app: web.Application) -> str:
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        await server.close()


def hook_app(hook: Hook) -> web.Application:
    app = web.Application()
    app.router.add_post("/hooks/T0/B0", hook.handle)
    return app


async def run_until(watch: Watch, condition) -> None:
    task = asyncio.create_task(watch.run())
    try:
        await wait_for(condition)
    finally:
        watch.stop()
        assert await asyncio.wait_for(task, 5) == 0


def watch_for(opencode: str, hook: str, delivery: Delivery = QUICK) -> Watch:
    settings = load_settings(
        {"url": opencode, "notify_url": hook + "/hooks/T0/B0", "max_interventions": "1"},
        {"OPENCODE_SERVER_PASSWORD": "server-pw-77"},
        isatty=False,
    )
    return Watch(settings, Notifier(None), dataclasses.replace(FAST, webhook=delivery))


async def test_every_intervention_and_hold_is_posted(serve):
    # The 5th call comes once the first intervention was carried out (else it is the same).
    fake = FakeOpencode()
    fake.streams = [fake.live]
    hook = Hook()
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)))

    async def repeated() -> None:
        await wait_for(fake.live_connected.is_set)
        await fake.push(loop_frames("ses_1", 4))
        await wait_for(lambda: len(hook.bodies) == 1)
        await fake.push(frames(*(envelope(f, "/w") for f in call("ses_1", "p5", "read", READ))))

    pushing = asyncio.create_task(repeated())
    await run_until(watch, lambda: len(hook.bodies) == 2)
    await pushing
    first, second = sorted(hook.bodies, key=lambda body: body["interventions"])
    ids = first.pop("id"), second.pop("id")
    assert len(set(ids)) == 2 and all(len(i) == 32 for i in ids)
    common = {
        "session_id": "ses_1",
        "directory": "/w",
        "rule": "cycle",
        "tools": ["read"],
        "cycle_length": 1,
        "repetitions": 4,
    }
    assert first == {
        **common,
        "text": "opencode-loop-monitor: session ses_1 in /w looped "
        "(1 call (read) repeated 4 times) and was stopped; the model was told why and carries on",
        "event": "intervention",
        "interventions": 1,
        "outcome": "aborted",
    }
    assert second == {
        **common,
        "text": "opencode-loop-monitor: session ses_1 in /w looped "
        "(read with the same arguments again, a call of the loop interrupted before) and was "
        "stopped and put on hold: "
        "it waits for a person to read the feedback and go on",
        "event": "hold",
        "interventions": 2,
        "outcome": "held",
    }
    # The OpenCode password is for OpenCode only.
    assert hook.authorization == [None, None]


async def test_a_failing_webhook_delays_no_intervention(serve):
    fake = FakeOpencode(streams=[play(loop_frames("ses_1", 4))])
    hook = Hook(status=500, delay=0.3)
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)))
    with capture_logs() as logs:
        await run_until(watch, lambda: events(logs, "webhook.failed"))
    [abort], [prompt] = fake.of("abort"), fake.of("prompt_async")
    # Abort and feedback were done before the webhook answered even once.
    assert abort.at < prompt.at < hook.answered_at[0]
    assert len(hook.bodies) == 3  # tried, then retried twice
    [failed] = events(logs, "webhook.failed")
    assert len({body["id"] for body in hook.bodies}) == 1  # every copy the same id
    assert failed == {
        "id": hook.bodies[0]["id"],
        "event": "webhook.failed",
        "log_level": "warning",
        "session_id": "ses_1",
        "outcome": "aborted",
        "attempts": 3,
        "error": "500",
    }


async def test_a_refusing_webhook_is_not_retried(serve):
    fake = FakeOpencode(streams=[play(loop_frames("ses_1", 4))])
    hook = Hook(status=400)
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)))
    with capture_logs() as logs:
        await run_until(watch, lambda: events(logs, "webhook.failed"))
    assert len(hook.bodies) == 1
    assert events(logs, "webhook.failed")[0]["error"] == "400"


async def test_a_hanging_webhook_times_out(serve):
    fake = FakeOpencode(streams=[play(loop_frames("ses_1", 4))])
    hook = Hook(delay=30)
    watch = watch_for(
        await serve(fake.app()), await serve(hook_app(hook)), Delivery(attempts=1, timeout=0.2)
    )
    with capture_logs() as logs:
        await run_until(watch, lambda: events(logs, "webhook.failed"))
    assert fake.of("prompt_async")
    assert events(logs, "webhook.failed")[0]["error"] == "timeout"


async def test_a_timed_out_post_is_never_sent_again(serve):
    fake = FakeOpencode(streams=[play(loop_frames("ses_1", 4))])
    hook = Hook(delay=1.0)
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)), QUICK)
    with capture_logs() as logs:
        await run_until(watch, lambda: events(logs, "webhook.failed"))
    assert len(hook.bodies) == 1
    assert events(logs, "webhook.failed")[0]["attempts"] == 1


async def test_a_slow_receiver_gets_each_notification_once_and_none_fails(serve):
    # Ten loops at once, a receiver taking 0.3 s, two connections: the last posts wait about
    # 1.5 s for a connection, three times their 0.5 s timeout, which must not count it.
    sessions = [f"ses_{n}" for n in range(10)]
    fake = FakeOpencode(streams=[play(b"".join(loop_frames(s, 4, prefix=s) for s in sessions))])
    hook = Hook(delay=0.3)
    delivery = dataclasses.replace(QUICK, connections=2)
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)), delivery)
    with capture_logs() as logs:
        # The watch's stop waits for every post under way: each has ended, delivered,
        # failed (`webhook.failed`) or given up (`webhook.dropped`), when `run_until` returns.
        await run_until(watch, lambda: len(hook.answered_at) == 10)
    assert sorted(body["session_id"] for body in hook.bodies) == sorted(sessions)
    assert len({body["id"] for body in hook.bodies}) == 10
    assert events(logs, "webhook.dropped") == []
    assert events(logs, "webhook.failed") == []


async def test_notifications_given_up_at_shutdown_are_counted(serve):
    sessions = [f"ses_{n}" for n in range(3)]
    fake = FakeOpencode(streams=[play(b"".join(loop_frames(s, 4, prefix=s) for s in sessions))])
    hook = Hook(delay=30)
    delivery = dataclasses.replace(QUICK, timeout=10.0)
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)), delivery)
    with capture_logs() as logs:
        await run_until(watch, lambda: len(hook.bodies) == 3)
    assert [(r["count"], r["reason"]) for r in events(logs, "webhook.dropped")] == [(3, "shutdown")]


async def test_hostile_names_reach_the_webhook_cleaned_and_escaped(serve):
    from monitor.testing import frames
    from tests.frames_factory import call, envelope

    tool = "read\n\x1b[2J\x00\u202e<!channel> <https://evil|click> @here" + "x" * 10_000
    directory = "/w\n<!here>"
    calls = [envelope(f, directory) for n in range(4) for f in call("ses_1", f"p{n}", tool, {})]
    fake = FakeOpencode(streams=[play(frames(*calls))])
    hook = Hook()
    watch = watch_for(await serve(fake.app()), await serve(hook_app(hook)))
    await run_until(watch, lambda: len(hook.bodies) == 1)
    [body] = hook.bodies
    [name] = body["tools"]
    assert name.startswith("read [2J <!channel> <https://evil|click> @herexx") and len(name) == 64
    assert body["directory"] == "/w <!here>"
    text = body["text"]
    assert "<" not in text and ">" not in text and "\n" not in text and "\x1b" not in text
    assert "&lt;!channel&gt;" in text and "@\u2060here" in text and len(text) < 400


def test_a_text_loop_is_told_as_what_was_repeated():
    tracker = Tracker()
    delta = {
        "sessionID": "ses_1",
        "messageID": "msg_1",
        "partID": "prt_t",
        "field": "text",
        "delta": "I will read the file again. ",
    }
    frames = [{"type": "message.part.delta", "properties": delta}] * 6
    [decision] = [d for frame in frames for d in tracker.feed(frame).decisions]
    body = notification(decision, Outcome.ABORTED)
    assert body["text"] == (
        "opencode-loop-monitor: session ses_1 looped (the same sentence 5 times in a row) and "
        "was stopped; the model was told why and carries on"
    )
    assert (body["rule"], body["tools"], body["cycle_length"], body["repetitions"]) == (
        "text_repeat",
        [],
        1,
        5,
    )
