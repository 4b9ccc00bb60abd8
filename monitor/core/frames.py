"""Decoding frames: SSE `data:` payloads to JSON values, and SSE text to payloads.

`SSEChunkDecoder` splits the live stream's bytes into events as they arrive; `iter_sse_data`
runs the lines of recorded files through it, so `replay` and the tests read exactly what the
daemon would have read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import orjson

from monitor.core import deep_json
from monitor.errors import ServerError

__all__ = [
    "FrameError",
    "HEARTBEAT",
    "MAX_LINE_BYTES",
    "SSEChunkDecoder",
    "decode_frame",
    "encode_sse",
    "iter_sse_data",
    "json_int",
    "loads",
]

# A tool output can be large (a whole file read), but a frame beyond this is not something
# the server sends: refuse it rather than hold it in memory.
MAX_FRAME_BYTES = 16 * 1024 * 1024
# JSON nested deeper than `json.loads` reads (a tool call's arguments 3,000 levels deep, which
# an MCP tool takes) is read by `deep_json`, a few times slower, up to this size: 1 MiB takes
# 0.25 to 0.55 s, the most one frame or answer may hold up the event loop. Past it, refused.
MAX_DEEP_BYTES = 1024 * 1024


class FrameError(ServerError, ValueError):
    """A payload that is not usable JSON; the message is safe to log. The server sent it:
    the remote kind of `MonitorError` (still a `ValueError`, as decoding errors are)."""


_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def json_int(digits: str) -> int | float:
    """A JSON integer as `loads` reads it: an int within 64 bits, a float past them (as
    orjson reads it; also past the interpreter's limit on the digits `int` converts). Every
    reader of the server's and the plugin's JSON takes this rule, so a call's arguments
    give one signature whichever path they came by."""
    try:
        value = int(digits)
    except ValueError:
        return float(digits)
    return value if _INT64_MIN <= value <= _UINT64_MAX else float(digits)


def loads(text: str | bytes) -> object:
    """JSON as the monitor reads the server's: orjson where it reads it (every frame of the
    stream goes through here, and orjson takes a third of `json.loads`' time), `json.loads`
    for the rest: NaN and Infinity, lone surrogates, bytes that are not UTF-8, numbers past
    a double, nesting deeper than orjson's 1,024. So every answer and every error is
    `json.loads`' but for integers, read by `json_int` on both paths. Nesting deeper than
    `json.loads` reads is read by `deep_json` up to MAX_DEEP_BYTES (FrameError past it)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text, parse_int=json_int)
    except RecursionError:
        pass
    # Still JSON, and it may hold a call that loops: four calls of an MCP tool, their
    # arguments 3,000 levels deep, ran unseen (issue 46).
    if len(text) > MAX_DEEP_BYTES:
        raise FrameError("nested too deeply")
    if isinstance(text, bytes):
        text = text.decode(json.detect_encoding(text), "surrogatepass")  # as json.loads does
    return deep_json.loads(text, parse_int=json_int)


def decode_frame(data: str) -> object:
    """Decode one event's data into a JSON value, or raise FrameError."""
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError("frame too large")
    try:
        # `loads`' first try, here without the call: what every frame of the stream takes.
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return loads(data)
    except FrameError:
        raise FrameError("frame nested too deeply") from None
    except ValueError:
        raise FrameError("frame is not JSON") from None


_BOM = b"\xef\xbb\xbf"
# OpenCode 2's heartbeat is a comment, `: heartbeat` every 15 s (V2-REAL-NOTES.md), where 1.x
# sends an event every 10 s. Decoded as 1.x's event, it is the same proof that the server
# lives (the stream's frame deadline, the readiness check) on both; any other comment is
# still none, as a proxy can send comments while the server behind it is gone.
_HEARTBEAT_COMMENTS = (b": heartbeat", b":heartbeat")
HEARTBEAT = '{"type":"server.heartbeat","properties":{}}'
# The longest line held, by the live decoder and by replay: a `data:` line carrying the
# largest frame we take, with room for the prefix and line ends. A longer line is cut there
# and the rest skipped, so one broken or binary stream cannot make us hold it whole; the cut
# line then fails as a frame that is too large.
MAX_LINE_BYTES = MAX_FRAME_BYTES + 64


class SSEChunkDecoder:
    """Feed the bytes of a live event stream in any chunks, get the data of each event.

    The WHATWG rules that matter for OpenCode, applied to bytes: lines end at LF, CRLF or
    CR (exactly what `bytes.splitlines` splits on), `data:` lines of one event join with
    newlines, a blank line ends the event, comments and other fields are ignored (but 2.x's
    `: heartbeat`, which is decoded as 1.x's heartbeat event, `HEARTBEAT`), a leading byte
    order mark is dropped. A line longer than `max_line` raises FrameError rather than
    growing without bound. Invalid UTF-8 becomes U+FFFD, as in a browser's EventSource.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._max_line = max_line
        self._data: list[bytes] = []
        self._data_size = 0
        # The start of a line whose end has not arrived yet, in the chunks that brought it.
        self._partial: list[bytes] = []
        self._partial_size = 0
        # A chunk that ended in CR: an LF starting the next one belongs to that line end.
        self._after_cr = False
        self._started = False

    def feed(self, chunk: bytes) -> list[str]:
        if not self._started and chunk:
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        if not chunk:
            return []
        last = chunk[-1]
        self._after_cr = last == 0x0D
        ends_line = last == 0x0A or last == 0x0D
        if not ends_line and b"\n" not in chunk and b"\r" not in chunk:
            # Part of one long line: keep the pieces, join them once the line is complete.
            self._partial.append(chunk)
            self._partial_size += len(chunk)
            if self._partial_size > self._max_line:
                raise FrameError("line too long")
            return []
        if self._partial:
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
            self._partial.clear()
        self._partial_size = 0
        events: list[str] = []
        if not self._data and b"\r" not in chunk:
            # What OpenCode sends: events of one `data: ` line, each ended by LF LF. Up to the
            # last LF LF, split on that; an event of any other form gets the line rules.
            cut = chunk.rfind(b"\n\n")
            if cut >= 0:
                limit = self._max_line
                for block in chunk[:cut].split(b"\n\n"):
                    # `0x0A`, not `b"\n"`: bytes' `in` tries its operand as an int first, and
                    # for a bytes one makes and drops a TypeError, on every frame (about 2,200
                    # instructions, a twentieth of a small 2.x frame's decoding and tracking).
                    if block[:6] == b"data: " and 0x0A not in block:
                        if len(block) - 5 > limit:
                            raise FrameError("event too large")
                        events.append(block[6:].decode("utf-8", "replace"))
                    else:
                        self._lines([*block.split(b"\n"), b""], events)
                chunk = chunk[cut + 2 :]
                if not chunk:
                    return events
        lines = chunk.splitlines()
        if not ends_line:
            tail = lines.pop()
            self._partial.append(tail)
            self._partial_size = len(tail)
        self._lines(lines, events)
        return events

    def _lines(self, lines: list[bytes], events: list[str]) -> None:
        """The line rules, on whole lines: each event these end goes to `events`."""
        data = self._data
        # Two lines a frame, so the loop keeps its state in locals.
        size, limit = self._data_size, self._max_line
        for line in lines:
            if not line:
                if data:
                    events.append(b"\n".join(data).decode("utf-8", "replace"))
                    data.clear()
                    size = 0
            elif line[:6] == b"data: ":
                # Many data lines without the blank line that ends the event would otherwise
                # grow it without bound, line limit or not.
                size += len(line) - 5
                if size > limit:
                    self._data_size = size
                    raise FrameError("event too large")
                data.append(line[6:])
            elif line.startswith(b"data:"):
                size += len(line) - 4
                if size > limit:
                    self._data_size = size
                    raise FrameError("event too large")
                data.append(line[5:])
            elif line == b"data":
                data.append(b"")
            elif line in _HEARTBEAT_COMMENTS and not data:
                events.append(HEARTBEAT)
        self._data_size = size


def encode_sse(data: str) -> str:
    """The SSE text of one event carrying `data`: what the decoders turn back into `data`."""
    return "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each event in the lines of a recorded stream, by the live stream's rules."""
    decoder = SSEChunkDecoder()
    for line in lines:
        yield from decoder.feed(line.encode("utf-8", "surrogatepass"))
