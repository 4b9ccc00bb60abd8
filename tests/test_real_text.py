"""Text loops on the real `opencode serve`: a model that streams the same paragraph again and
again is stopped early and told why; long legitimate answers are left alone.

The scripted model (monitor/kit/scripted_model.py) streams its answer in deltas of a few
characters with a pause between them, as a local model generating tokens does.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from monitor.kit.sandbox import free_loopback_port
from monitor.kit.scripted_model import script
from tests.corpus.record_text import (
    PARAGRAPH,
    REASONING,
    code_block,
    different_lines,
    numbered_list,
    table,
)
from tests.harness import REPO, assistant_texts, seen_idle, start_watching, user_texts

pytestmark = pytest.mark.real_server

CHUNK = 12
GAP = 0.004  # seconds between deltas: about 3,000 characters a second
# Chunks the server stored past the one the monitor decided on, per real-server text loop:
# bench/run.py does not read it; docs/performance.md quotes it.
TEXT_OVERSHOOT = REPO / ".cache" / "text-overshoot.jsonl"


def text_script(**fields):
    return script([("read", {"filePath": "README.md"})], 0, chunk=CHUNK, chunk_delay=GAP, **fields)


def stored_parts(messages, kind):
    return [
        p
        for m in messages
        if m["info"]["role"] == "assistant"
        for p in m["parts"]
        if p["type"] == kind
    ]


def note_overshoot(test, decided_chunk, stored_chars):
    streamed = math.ceil(stored_chars / CHUNK)
    TEXT_OVERSHOOT.parent.mkdir(parents=True, exist_ok=True)
    with TEXT_OVERSHOOT.open("a", encoding="utf-8") as out:
        record = {"test": test, "decided": decided_chunk, "stored": streamed}
        out.write(json.dumps(record | {"past": streamed - decided_chunk}) + "\n")
    return streamed - decided_chunk


# How soon the stream is stopped depends on the monitor and the server getting the CPU at once.
@pytest.mark.alone
@pytest.mark.parametrize("kind", ["text", "reasoning"])
async def test_a_paragraph_repeated_hundreds_of_times_is_stopped_early(
    opencode_server, start_monitor, http, kind
):
    monitor = await start_watching(start_monitor, opencode_server)
    client = opencode_server.client(http)
    session = await client.create_session("text loop")
    if kind == "text":
        prompt = text_script(answer=PARAGRAPH, repeat=300)
    else:
        prompt = text_script(answer="Found it.", reasoning=REASONING, reasoning_repeat=300)
    await client.prompt_async(session["id"], prompt)
    messages = await client.wait_idle(session["id"], 60, user_messages=2)

    [detected] = await monitor.wait_event("intervention.outcome")
    assert (detected["rule"], detected["outcome"]) == ("text_repeat", "aborted")
    assert detected["session_id"] == session["id"] and detected["tools"] == []
    looped = stored_parts(messages, kind)[0]
    assert detected["part_id"] == looped["id"]
    repeated = PARAGRAPH if kind == "text" else REASONING
    units = 4 if kind == "text" else 2
    assert (detected["cycle_length"], detected["repetitions"]) == (units, 5)
    # The 5th repetition completes on this delta (the first character after it).
    assert detected["call_index"] == math.ceil((5 * len(repeated) - 1) / CHUNK)
    # Stopped long before the end (300 copies), however busy the machine: within a tenth.
    assert len(looped["text"]) < 30 * len(repeated)
    assert note_overshoot(kind, detected["call_index"], len(looped["text"])) >= 0

    users = user_texts(messages)
    where = "answer" if kind == "text" else "reasoning"
    what = "sentence" if units == 1 else f"passage of {units} sentences"
    assert len(users) == 2
    assert f"in your {where} you wrote the same {what} 5 times in a row" in users[1]
    assert repeated.split(".")[0] not in users[1]  # named, never quoted
    # The model answers the feedback with its scripted answer once, without repeating it.
    assert assistant_texts(messages)[-1] == (PARAGRAPH if kind == "text" else "Found it.")
    assert len(monitor.events("loop.detected")) == 1
    assert monitor.events("feedback.sent")[0]["session_id"] == session["id"]


async def test_long_legitimate_answers_are_not_stopped(opencode_server, start_monitor, http):
    address = f"127.0.0.1:{free_loopback_port()}"
    monitor = await start_watching(start_monitor, opencode_server, "--metrics-addr", address)
    client = opencode_server.client(http)
    answers = {
        "different lines": different_lines(),
        "code block": code_block(),
        "table": table(),
        "numbered list": numbered_list(),
    }
    sessions = {name: (await client.create_session(name))["id"] for name in answers}
    await asyncio.gather(
        *(
            client.prompt_async(sessions[name], text_script(answer=answers[name]))
            for name in answers
        )
    )
    for name, text in answers.items():
        messages = await client.wait_idle(sessions[name], 60)
        assert len(user_texts(messages)) == 1, name
        assert assistant_texts(messages) == [text], name  # streamed to its end
        await seen_idle(http, address, sessions[name])  # it read the whole answer
    assert monitor.events("loop.detected") == []


async def test_dry_run_only_logs_a_text_loop(opencode_server, start_monitor, http):
    monitor = await start_watching(start_monitor, opencode_server, "--dry-run")
    client = opencode_server.client(http)
    session = await client.create_session("dry run")
    await client.prompt_async(session["id"], text_script(answer=PARAGRAPH, repeat=20))
    messages = await client.wait_idle(session["id"], 60)
    assert assistant_texts(messages) == [PARAGRAPH * 20]  # streamed to its end
    assert len(user_texts(messages)) == 1
    [detected] = await monitor.wait_event("intervention.outcome")
    assert (detected["rule"], detected["outcome"]) == ("text_repeat", "dry_run")
    assert detected["call_index"] == math.ceil((5 * len(PARAGRAPH) - 1) / CHUNK)
