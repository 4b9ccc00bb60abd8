"""SSEChunkDecoder: the live stream's bytes, in any chunks, give the events' data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.core.frames import HEARTBEAT, FrameError, SSEChunkDecoder


def decode(*chunks: bytes) -> list[str]:
    decoder = SSEChunkDecoder()
    return [data for chunk in chunks for data in decoder.feed(chunk)]


@pytest.mark.parametrize(
    ("chunks", "events"),
    [
        ([b"data: {}\n\n"], ["{}"]),
        ([b"data:{}\n\n"], ["{}"]),  # the space after the colon is optional
        ([b"data:  x\n\n"], [" x"]),  # and only one is dropped
        ([b"data: a\ndata: b\n\n"], ["a\nb"]),
        ([b"data: a\r\n\r\n", b"data: b\r\r"], ["a", "b"]),
        ([b"data: a\r", b"\n\r\n"], ["a"]),  # CRLF split between chunks is one line end
        ([b"da", b"ta: ", b"x", b"\n", b"\n"], ["x"]),
        ([b"\xef\xbb\xbfdata: x\n\n"], ["x"]),  # byte order mark
        ([b": comment\nevent: e\nid: 1\nretry: 5\ndata: x\n\n"], ["x"]),
        ([b"data\n\n"], [""]),
        ([b"\n\n\n"], []),  # blank lines without data dispatch nothing
        ([b"data: x\n"], []),  # an event not ended by a blank line is not dispatched
        ([b"data: \xe2\x82", b"\xac\n\n"], ["\u20ac"]),  # UTF-8 split between chunks
        ([b"data: \xff\n\n"], ["\ufffd"]),
    ],
)
def test_chunks_give_events(chunks, events):
    assert decode(*chunks) == events


def test_a_line_longer_than_the_limit_is_refused():
    decoder = SSEChunkDecoder(max_line=100)
    decoder.feed(b"data: " + b"x" * 90)
    with pytest.raises(FrameError):
        decoder.feed(b"x" * 20)


@given(
    st.lists(st.text(alphabet=st.characters(exclude_characters="\r"), max_size=40), max_size=8),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.lists(st.integers(min_value=1, max_value=50), max_size=20),
)
def test_any_split_gives_the_same_events(events, newline, cuts):
    raw = "".join(
        "".join(f"data: {line}{newline}" for line in data.split("\n")) + newline for data in events
    ).encode("utf-8", "surrogatepass")
    chunks, at = [], 0
    for cut in cuts:
        chunks.append(raw[at : at + cut])
        at += cut
    chunks.append(raw[at:])
    # Lone surrogates are not UTF-8: they come back replaced, as any decoder would do.
    expected = [e.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for e in events]
    assert decode(*chunks) == expected


def test_an_event_of_many_data_lines_is_bounded_too():
    decoder = SSEChunkDecoder(max_line=100)
    decoder.feed(b"data: " + b"x" * 40 + b"\n" + b"data: " + b"x" * 40 + b"\n")
    with pytest.raises(FrameError, match="event too large"):
        decoder.feed(b"data: " + b"x" * 40 + b"\n")


def test_the_size_count_starts_over_with_each_event():
    decoder = SSEChunkDecoder(max_line=100)
    for _ in range(10):
        assert decoder.feed(b"data: " + b"x" * 60 + b"\n\n") == ["x" * 60]


_LINE = st.one_of(
    st.builds(lambda text: f"data: {text}", st.text(max_size=12)),
    st.builds(lambda text: f"data:{text}", st.text(max_size=12)),
    st.sampled_from(["", "", "data", ": comment", "event: e", "id: 7", "data: \u20ac"]),
)


@given(
    st.lists(
        st.text(alphabet="\n", min_size=1, max_size=3).flatmap(
            lambda ends: _LINE.map(lambda line: line.replace("\n", "").replace("\r", "") + ends)
        ),
        max_size=30,
    ),
    st.lists(st.integers(min_value=1, max_value=80), max_size=10),
)
def test_whole_blocks_decode_as_the_line_rules_do(lines, cuts):
    # Fed a byte at a time, no chunk ever holds a blank line: every event takes the line
    # rules, the reference for the split on LF LF that bigger chunks take.
    raw = "".join(lines).encode("utf-8", "surrogatepass")
    chunks, at = [], 0
    for cut in cuts:
        chunks.append(raw[at : at + cut])
        at += cut
    chunks.append(raw[at:])
    assert decode(*chunks) == decode(*(raw[i : i + 1] for i in range(len(raw))))


def test_an_event_too_large_in_a_whole_block_is_refused():
    decoder = SSEChunkDecoder(max_line=100)
    assert decoder.feed(b"data: " + b"x" * 95 + b"\n\n") == ["x" * 95]
    with pytest.raises(FrameError, match="event too large"):
        decoder.feed(b"data: " + b"x" * 100 + b"\n\n")


def test_opencode_2s_heartbeat_comment_is_decoded_as_1xs_heartbeat_event() -> None:
    # 2.2.5 sends `: heartbeat` every 15 s and no heartbeat event (V2-REAL-NOTES.md); any
    # other comment is still nothing, in one chunk or byte by byte.
    stream = b'data: {"type":"server.connected","data":{}}\n\n: heartbeat\n\n:\n: ping\n\n'
    stream += b":heartbeat\r\n\r\n"
    whole = SSEChunkDecoder().feed(stream)
    assert whole == ['{"type":"server.connected","data":{}}', HEARTBEAT, HEARTBEAT]
    decoder = SSEChunkDecoder()
    assert [data for byte in stream for data in decoder.feed(bytes([byte]))] == whole
    assert json.loads(HEARTBEAT) == {"type": "server.heartbeat", "properties": {}}
