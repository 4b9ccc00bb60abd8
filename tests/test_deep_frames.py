"""Frames nested past the depth `json.loads` reads (issue 46): a call 3,000 levels deep is
read from the stream, bounded, and four identical ones are a loop, without the plugin."""

from __future__ import annotations

import json

import pytest

from monitor.core.frames import MAX_DEEP_BYTES, FrameError, decode_frame, loads
from monitor.core.plugin_protocol import PluginCall, read_body
from monitor.core.signature import canonical_signature, signature_digest
from monitor.core.tracker import Tracker
from tests.frames_factory import call

DEPTH = 3_000
PLACE = '"PLACE"'


def nested(depth: int, leaf: str = "1") -> str:
    """Arguments nested `depth` levels deep, as an MCP tool's may be (objects in arrays)."""
    return '{"query": ' + '{"a": [' * depth + leaf + "]}" * depth + "}"


def frames_of(part: str, args: str) -> list[str]:
    """The stream's frames of one call, with `args` (JSON text) as its arguments."""
    return [
        json.dumps(frame).replace(json.dumps(PLACE), args)
        for frame in call("ses_deep", part, "mcp_query", PLACE)
    ]


def feed(tracker: Tracker, calls: list[str]) -> list[int]:
    caught = []
    for n, args in enumerate(calls, 1):
        for data in frames_of(f"prt_{n}", args):
            fed = tracker.feed_data(data)
            assert fed.malformed is None
            caught += [decision.call_index for decision in fed.decisions]
    return caught


def test_four_identical_calls_nested_3000_deep_are_a_loop_at_the_4th():
    tracker = Tracker()
    assert feed(tracker, [nested(DEPTH)] * 5) == [4, 5]
    assert tracker.malformed == {}


def test_deep_calls_that_differ_at_the_deepest_level_are_not_one_call():
    tracker = Tracker()
    assert feed(tracker, [nested(DEPTH, str(n)) for n in range(6)]) == []


def test_the_stream_and_the_plugin_read_a_deep_call_alike():
    # One signature whichever path the call came by: the plugin's question about it and
    # the stream's update of it are one call.
    args = nested(DEPTH)
    [_, running, _] = frames_of("prt_1", args)
    frame = decode_frame(running)
    assert isinstance(frame, dict)
    streamed = frame["properties"]["part"]["state"]["input"]
    body = '{"session_id": "ses_deep", "call_id": "c", "tool": "mcp_query", "args": ' + args + "}"
    asked = read_body(body.encode())
    assert isinstance(asked, PluginCall)
    assert canonical_signature("mcp_query", asked.args) == canonical_signature(
        "mcp_query", streamed
    )
    # A fixed-size digest, the same in every process (blake2b, not the salted hash()).
    signature = canonical_signature("mcp_query", streamed)
    assert len(signature) == len("mcp_query\x00") + len(args.replace(" ", ""))
    assert signature_digest(signature) == signature_digest(
        canonical_signature("mcp_query", loads(args))
    )


def test_past_the_bound_a_deep_frame_is_still_refused():
    depth = MAX_DEEP_BYTES // 2 + 1
    with pytest.raises(FrameError, match="^frame nested too deeply$"):
        decode_frame("[" * depth + "]" * depth)
    # Within it, read: not an object, so not a frame the tracker takes, but not "too deep".
    depth = MAX_DEEP_BYTES // 2 - 1
    assert Tracker().feed_data("[" * depth + "]" * depth).malformed == "frame is not an object"


def test_a_server_answer_nested_past_json_loads_is_read():
    # The messages of a session with such a call, as the API reads them back (resync).
    text = f'[{{"parts": [{{"state": {{"input": {nested(DEPTH)}}}}}]}}]'
    value = loads(text.encode())
    assert isinstance(value, list) and value[0]["parts"][0]["state"]["input"]["query"]["a"]
    with pytest.raises(FrameError):
        loads(b"[" * (MAX_DEEP_BYTES + 1))
