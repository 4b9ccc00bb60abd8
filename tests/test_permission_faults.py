"""Permission answers against a stand-in server: the races and reconnects a real server
cannot be made to show on demand, and `--permissions off`."""

from __future__ import annotations

from structlog.testing import capture_logs

from monitor.core.feedback import MARK
from monitor.testing import FakeOpencode, frames, play
from tests.frames_factory import BASH, asked, doom_loop, envelope, part, replied
from tests.harness import events, start, stop, wait_for

DIRECTORY = "/w"


def stream(*events_: dict) -> bytes:
    return frames(*(envelope(event, DIRECTORY) for event in events_))


def answered_calls(count: int) -> list[dict]:
    """`count` identical bash calls that asked and that someone else approved."""
    out: list[dict] = []
    for n in range(1, count + 1):
        out += [
            part(n, "running", *BASH),
            asked(n, "bash"),
            replied(n, "once"),
            part(n, "completed", *BASH),
        ]
    return out


def replies_sent(fake: FakeOpencode) -> list[tuple[str, object]]:
    return [(r.path, r.body) for r in fake.requests if r.path.startswith("/permission/")]


async def test_a_refusal_answered_first_by_someone_else_falls_back_to_the_abort():
    loop = [*answered_calls(3), part(4, "running", *BASH), asked(4, "bash")]
    fake = FakeOpencode(streams=[play(stream(*loop))], answers={"reply": [404]})
    with capture_logs() as logs:
        running = await start(fake)
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    [(path, body)] = replies_sent(fake)
    assert path == "/permission/per_4/reply" and fake.of("reply")[0].query == {"directory": "/w"}
    assert body["reply"] == "reject" and body["message"].startswith(MARK)  # type: ignore[index]
    assert [r.path for r in fake.of("abort")] == ["/session/ses_1/abort"]
    assert "stopped at this call" in fake.of("prompt_async")[0].body["parts"][0]["text"]  # type: ignore[index]
    [detected] = events(logs, "intervention.outcome")
    assert (detected["outcome"], detected["fallback"], detected["request_id"]) == (
        "aborted",
        "answered first",
        "per_4",
    )
    assert detected["rule"] == "cycle" and detected["part_id"] == "prt_4"


async def test_requests_pending_across_a_reconnect_are_read_back_and_answered():
    """The 4th call's request is made while the stream is down: only GET /permission has it.
    Session ses_2 has a call running that asked meanwhile too; under approve it may run."""
    second_session = {
        "info": {"role": "assistant", "sessionID": "ses_2"},
        "parts": [
            {
                "id": "prt_9",
                "type": "tool",
                "tool": "read",
                "callID": "call_9",
                "messageID": "msg_9",
                "sessionID": "ses_2",
                "state": {"status": "running", "input": {"filePath": "a.md"}},
            }
        ],
    }
    fake = FakeOpencode(
        busy={"ses_1": {"type": "busy"}, "ses_2": {"type": "busy"}},
        messages={"ses_2": [second_session]},
    )
    before = play(stream(*answered_calls(3), part(4, "running", *BASH)), then="end")

    async def first(request, response):
        await before(request, response)
        # Asked while the stream is down: these never reach the stream.
        fake.permissions = [
            asked(4, "bash")["properties"],
            asked(9, "read", session="ses_2")["properties"],
        ]

    fake.streams = [first, play()]
    with capture_logs() as logs:
        running = await start(fake, permissions="approve")
        await wait_for(lambda: len(replies_sent(fake)) == 5)
        await wait_for(lambda: events(logs, "intervention.outcome"))
        await stop(*running)
    answers = dict(replies_sent(fake))
    assert len(answers) == 5  # calls 1-3 approved live, 4 and 9 once read back
    assert answers["/permission/per_9/reply"] == {"reply": "once"}
    assert answers["/permission/per_4/reply"]["reply"] == "reject"  # type: ignore[index]
    [detected] = events(logs, "intervention.outcome")
    assert (detected["outcome"], detected["request_id"]) == ("rejected", "per_4")
    assert fake.of("abort") == [] and fake.of("prompt_async") == []
    assert events(logs, "stream.resynced")[-1]["pending_permissions"] == 2


async def test_off_answers_nothing_and_aborts_as_before():
    loop = [*answered_calls(3), part(4, "running", *BASH), asked(4, "bash"), doom_loop(1)]
    fake = FakeOpencode(streams=[play(stream(*loop))], permissions=[asked(5)["properties"]])
    with capture_logs() as logs:
        running = await start(fake, permissions="off")
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    assert [r.path for r in fake.requests if "permission" in r.path] == []
    [detected] = events(logs, "intervention.outcome")
    assert (detected["outcome"], detected["part_id"]) == ("aborted", "prt_4")
    assert [r.path for r in fake.of("abort")] == ["/session/ses_1/abort"]


async def test_a_doom_loop_answered_within_the_grace_period_is_left_alone():
    requests = [part(n, "running", *BASH) for n in (1, 2, 3)]
    fake = FakeOpencode(
        streams=[
            play(stream(*requests, doom_loop(1, "bash")), then="end"),
            # A person at the TUI answers it meanwhile; the stream tells the monitor so.
            play(stream(replied("per_doom1", "once"))),
        ]
    )
    with capture_logs() as logs:
        running = await start(fake, permission_grace=1)
        await wait_for(lambda: events(logs, "intervention.outcome"))
        await stop(*running)
    assert replies_sent(fake) == [] and fake.of("abort") == []
    [detected] = events(logs, "intervention.outcome")
    assert (detected["rule"], detected["outcome"], detected["part_id"]) == (
        "doom_loop",
        "answered",
        "prt_3",
    )


async def test_a_refused_doom_loop_is_aborted_then_given_the_feedback():
    requests = [part(n, "running", *BASH) for n in (1, 2, 3)]
    fake = FakeOpencode(streams=[play(stream(*requests, doom_loop(1, "bash")))])
    with capture_logs() as logs:
        running = await start(fake, permission_grace=0)
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    order = fake.actions()
    assert order == [
        "/permission/per_doom1/reply",
        "/session/ses_1/abort",
        "/session/ses_1/prompt_async",
    ]
    [detected] = events(logs, "intervention.outcome")
    assert (detected["rule"], detected["outcome"]) == ("doom_loop", "rejected")
    assert fake.of("prompt_async")[0].body["parts"][0]["text"].startswith(MARK)  # type: ignore[index]


async def test_a_held_loop_is_refused_aborted_and_its_feedback_stored():
    loop = [*answered_calls(3), part(4, "running", *BASH), asked(4, "bash")]
    fake = FakeOpencode(streams=[play(stream(*loop))])
    with capture_logs() as logs:
        running = await start(fake, on_loop="hold")
        await wait_for(lambda: fake.of("prompt_async"))
        await stop(*running)
    [(path, body)] = replies_sent(fake)
    assert path == "/permission/per_4/reply" and "on hold" in body["message"]  # type: ignore[index]
    assert [r.path for r in fake.of("abort")] == ["/session/ses_1/abort"]
    assert fake.of("prompt_async")[0].body["noReply"] is True  # type: ignore[index]
    [detected] = events(logs, "intervention.outcome")
    assert (detected["outcome"], detected["request_id"]) == ("held", "per_4")
