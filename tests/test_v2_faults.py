"""OpenCode 2's surfaces under faults, against the stand-in (issue 56): a web page answered
where the API's JSON was asked for (2.x's web app, or a proxy's page) is never taken for
success and the intervention goes on as its table says (monitor/core/intervention.py); a
stream that brings only 2.x's `: heartbeat` comments while a run is under way is checked
against the server (monitor/shell/silence.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from monitor.shell.api import WEB_PAGE
from monitor.testing import PROXY_PAGE, WEB_APP_PAGE, FakeOpencode, engine_call, frames, play
from tests.frames_factory import engine_record
from tests.harness import FAST, events, start, stop, wait_for

S = "ses_s1"
PAGES = [(WEB_APP_PAGE, 200), (PROXY_PAGE, 200), ("", 200), (PROXY_PAGE, 502)]
PAGE_IDS = ["web-app", "proxy-200", "empty-page", "proxy-502"]


def reads(first: int, last: int) -> list[dict[str, object]]:
    """Identical reads `first` to `last` of session S, as 2.2.5 streams them."""
    events_: list[dict[str, object]] = []
    for n in range(first, last + 1):
        events_ += engine_call(S, n, "read", {"path": "README.md"}, 3 * n, "/w")
    return events_


def gated_reads(last: int) -> list[dict[str, object]]:
    """Reads 1 to `last` under the permission gate: each asks once called (2.2.5 asks in
    the call's hook, after `tool.called`); a person allows all but the last."""
    events_: list[dict[str, object]] = []
    for n in range(1, last + 1):
        started, called, success = engine_call(S, n, "read", {"path": "README.md"}, 3 * n, "/w")
        events_ += [started, called, asked(n)]
        if n < last:
            answer = {"sessionID": S, "requestID": f"per_{n}", "reply": "once"}
            events_ += [{"type": "permission.replied", "data": answer}, success]
    return events_


def asked(n: int) -> dict[str, object]:
    """2.2.5's permission request for call n (its id at `source.id`)."""
    source = {"type": "tool", "messageID": f"msg_{n}", "id": f"call_{n}"}
    data = {"id": f"per_{n}", "sessionID": S, "action": "read", "resources": ["README.md"]}
    return {"type": "permission.asked", "data": {**data, "save": ["*"], "source": source}}


def outcome(logs: list[dict[str, Any]]) -> dict[str, Any]:
    [said] = events(logs, "intervention.outcome")
    return said


@pytest.mark.parametrize(("page", "status"), PAGES, ids=PAGE_IDS)
async def test_an_interrupt_answered_by_a_web_page_is_no_stop(page: str, status: int) -> None:
    fake = FakeOpencode(
        generation=2,
        streams=[play(frames(*reads(1, 4)))],
        answers={"interrupt": [status]},
        pages={"interrupt": page},
    )
    with capture_logs() as logs:
        running = await start(fake)
        try:
            await wait_for(lambda: events(logs, "intervention.outcome"))
        finally:
            await stop(*running)
    said = outcome(logs)
    # Not stopped: said so, and no feedback tells the model it was.
    assert said["outcome"] == "abort_failed"
    assert fake.of("prompt") == [] and events(logs, "feedback.sent") == []
    if status == 200:
        assert WEB_PAGE in said["error"] and len(fake.of("interrupt")) == 1
    else:
        assert len(fake.of("interrupt")) == FAST.retry.attempts  # a 5xx may pass


@pytest.mark.parametrize(("page", "status"), PAGES, ids=PAGE_IDS)
async def test_feedback_answered_by_a_web_page_is_not_sent(page: str, status: int) -> None:
    fake = FakeOpencode(
        generation=2,
        streams=[play(frames(*reads(1, 4)))],
        answers={"prompt": [status]},
        pages={"prompt": page},
    )
    with capture_logs() as logs:
        running = await start(fake)
        try:
            await wait_for(lambda: events(logs, "feedback.failed"))
        finally:
            await stop(*running)
    assert outcome(logs)["outcome"] == "aborted"
    assert events(logs, "feedback.sent") == []
    assert fake.actions()[0] == f"/api/session/{S}/interrupt"


@pytest.mark.parametrize(("page", "status"), PAGES, ids=PAGE_IDS)
async def test_a_refusal_answered_by_a_web_page_falls_back_to_the_interrupt(
    page: str, status: int
) -> None:
    # The permission gate refuses call 4's request; the answer is a page, so the call may
    # run: the loop is stopped as one without a request, once.
    fake = FakeOpencode(
        generation=2,
        streams=[play(frames(*gated_reads(4)))],
        answers={"reply": [status]},
        pages={"reply": page},
    )
    with capture_logs() as logs:
        running = await start(fake, permissions="gate")
        try:
            await wait_for(lambda: fake.of("prompt"))
        finally:
            await stop(*running)
    said = outcome(logs)
    assert (said["outcome"], said["request_id"]) == ("aborted", "per_4")
    assert said["fallback"] != "answered first"
    assert fake.actions() == [
        *[f"/api/session/{S}/permission/per_4/reply"] * len(fake.of("reply")),
        f"/api/session/{S}/interrupt",
        f"/api/session/{S}/prompt",
    ]


async def test_a_1x_refusal_answered_by_a_proxys_page_is_not_taken_as_answered_first() -> None:
    # On 1.x a 404 to a permission reply means someone answered first; a page does not.
    from tests.frames_factory import BASH, envelope, part, replied
    from tests.frames_factory import asked as asked_1x

    loop: list[dict[str, Any]] = []
    for n in (1, 2, 3):
        loop += [part(n, "running", *BASH), asked_1x(n, "bash"), replied(n, "once")]
        loop.append(part(n, "completed", *BASH))
    loop += [part(4, "running", *BASH), asked_1x(4, "bash")]
    fake = FakeOpencode(
        streams=[play(frames(*(envelope(event, "/w") for event in loop)))],
        pages={"reply": PROXY_PAGE},
    )
    with capture_logs() as logs:
        running = await start(fake)
        try:
            await wait_for(lambda: fake.of("prompt_async"))
        finally:
            await stop(*running)
    said = outcome(logs)
    assert said["outcome"] == "aborted" and WEB_PAGE in said["fallback"]


# --- a stream of heartbeats only ----------------------------------------------------------


def heartbeats_after(chunk: bytes, every: float = 0.05) -> Any:
    """2.2.5's stream: `server.connected`, `chunk`, then only `: heartbeat` comments."""

    async def script(request: web.Request, response: web.StreamResponse) -> None:
        await response.prepare(request)
        await response.write(frames({"id": "evt_0", "type": "server.connected", "data": {}}))
        await response.write(chunk)
        for _ in range(1000):
            await response.write(b": heartbeat\n\n")
            await asyncio.sleep(every)

    return script


async def test_a_run_under_way_heard_of_by_heartbeats_only_is_checked_and_resynced() -> None:
    # Two reads seen live; then only heartbeats, while the server ran two more (a loop):
    # the silence check asks the server, finds what the stream did not bring, and reconnects.
    started = {"type": "session.execution.started", "data": {"sessionID": S}}
    fake = FakeOpencode(generation=2, streams=[heartbeats_after(frames(started, *reads(1, 2)))])
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        watch.timing = dataclasses.replace(FAST, silence=0.3)
        try:
            await wait_for(lambda: watch.monitor.running())
            fake.busy = {S: {}}
            fake.messages = {S: engine_record(4)}
            await wait_for(lambda: fake.of("interrupt"), timeout=5)
        finally:
            await stop(server, watch, task)
    [stalled] = events(logs, "stream.stalled")
    assert stalled["sessions"] == [S] and stalled["silent_s"] >= 0.3
    [disconnected] = events(logs, "stream.disconnected")
    assert disconnected["reason"] == "stalled: the server ran what the stream did not show"
    assert [r.path for r in fake.of("interrupt")] == [f"/api/session/{S}/interrupt"]


async def test_a_long_call_under_way_amid_heartbeats_is_no_stall() -> None:
    # One read still running: the server agrees with what we saw; the stream is kept.
    started = {"type": "session.execution.started", "data": {"sessionID": S}}
    record = engine_record(1)
    record[-1]["content"][0]["state"] = {"status": "running", "input": {"path": "README.md"}}
    fake = FakeOpencode(
        generation=2,
        streams=[heartbeats_after(frames(started, *reads(1, 1)[:2]))],
        busy={S: {}},
        messages={S: record},
    )
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        watch.timing = dataclasses.replace(FAST, silence=0.2)
        try:
            await wait_for(lambda: len(fake.of("message")) >= 2, timeout=5)
        finally:
            await stop(server, watch, task)
    assert events(logs, "stream.stalled") == [] and fake.connections == 1
