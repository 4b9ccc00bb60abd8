"""Decoding frames: SSE `data:` payloads to JSON values, and SSE text to payloads.

The live stream is split into events by aiohttp-sse-client; `SSEDecoder` does the same for
recorded files, so `replay` and the tests read exactly what the daemon would have read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

# A tool output can be large (a whole file read), but a frame beyond this is not something
# the server sends: refuse it rather than hold it in memory.
MAX_FRAME_BYTES = 16 * 1024 * 1024


class FrameError(ValueError):
    """A payload that is not usable JSON; the message is safe to log."""


def decode_frame(data: str) -> object:
    """Decode one event's data into a JSON value, or raise FrameError."""
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError("frame too large")
    try:
        return json.loads(data)
    except RecursionError:
        raise FrameError("frame nested too deeply") from None
    except ValueError:
        raise FrameError("frame is not JSON") from None


class SSEDecoder:
    """Feed lines of an event stream, get the data of each complete event.

    Follows the WHATWG rules that matter for OpenCode: `data:` lines of one event join with
    newlines, a blank line ends the event, comments and other fields are ignored.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed_line(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                return None
            data = "\n".join(self._data)
            self._data.clear()
            return data
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The data of an event left unterminated at the end of the input, if any."""
        return self.feed_line("")


def encode_sse(data: str) -> str:
    """The SSE text of one event carrying `data`: what `SSEDecoder` turns back into `data`."""
    return "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    decoder = SSEDecoder()
    for line in lines:
        data = decoder.feed_line(line)
        if data is not None:
            yield data
    tail = decoder.flush()
    if tail is not None:
        yield tail
