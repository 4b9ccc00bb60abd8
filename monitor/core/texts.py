"""Text and reasoning parts as they stream: the state of rule `text_repeat`, per part.

The one rule over a part's deltas (monitor/core/rules/text.py) keeps its state per part, not
per session: a `TextStream` for each part being streamed, in the order they started, at most
`MAX_STREAMING_PARTS` of them over all sessions (the oldest is dropped first).
"""

from __future__ import annotations

from monitor.core.events import PartDelta, TextPart
from monitor.core.findings import TextPassage
from monitor.core.rules.text import TextStream

__all__ = ["MAX_STREAMING_PARTS", "TextStreams"]

# Each holds at most about 3 KB (docs/performance.md), so all of them stay under 12 MB.
MAX_STREAMING_PARTS = 4096


class TextStreams:
    """The parts being streamed; `repeats` is `Detection.text_repeats` (0: off)."""

    def __init__(self, repeats: int) -> None:
        self._repeats = repeats
        self.parts: dict[str, TextStream] = {}
        # Deltas that reached parts after a text loop was found in them, counted when each
        # such part ends: what stopping a text loop late costs.
        self.chunks_after_detection = 0

    def delta(self, event: PartDelta) -> TextPassage | None:
        """A delta of a part's text; the passage it completes, if it repeats itself."""
        if not self._repeats or event.field != "text":
            return None
        stream = self.parts.get(event.part_id)
        if stream is None:
            # Its first update was missed (we connected mid-part): judge it from here on.
            stream = self._start(event.part_id, "text")
        found = stream.feed(event.delta)
        if found is None:
            return None
        return TextPassage(stream.kind, found.units, found.repetitions, found.chunk)

    def part(self, part: TextPart) -> None:
        """A part's own update: one that starts is followed, one that ends is let go."""
        if not part.ended:
            if part.started and self._repeats and part.part_id not in self.parts:
                self._start(part.part_id, part.kind)
            return
        stream = self.parts.pop(part.part_id, None)
        if stream is not None and stream.found is not None:
            self.chunks_after_detection += stream.chunks - stream.found.chunk

    def _start(self, part_id: str, kind: str) -> TextStream:
        parts = self.parts
        if len(parts) >= MAX_STREAMING_PARTS:
            del parts[next(iter(parts))]
        stream = parts[part_id] = TextStream(kind, self._repeats)
        return stream
