"""Text loops: a model that writes the same thing over and over, with or without tools.

`TextStream` follows one streamed part (an answer or a reasoning block) delta by delta and
finds the same passage repeated back to back. It cuts the text into units as it arrives:

- in prose, a sentence (up to `.`, `!` or `?` followed by white space, when the mark does
  not follow a digit: `1. ` numbers a list item, it does not end a sentence) or the rest of
  a line; a unit that reaches `MAX_UNIT` characters without either is cut there;
- a fenced code block (from one ``` or ~~~ line to the next) or a markdown table (a run of
  lines starting with `|`) is one unit as a whole: similar lines inside them are normal,
  the same block written again and again is not;
- list items are prose lines; their numbers stay in them, so an enumeration whose lines
  differ only in their numbers never repeats.

Units are compared by a hash of their text with white space collapsed; units without a
letter or digit (blank lines, rules, bullets) are left out. For every block length L from 1
to `MAX_BLOCK` units, a counter says how many units in a row have equalled the unit L
places before them; when it reaches L * (repeats - 1), the last L units have been written
`repeats` times back to back. That takes one pass over each character and `MAX_BLOCK`
comparisons per unit; a part holds its unfinished unit (at most `MAX_UNIT` characters plus
one delta), `MAX_BLOCK` hashes and `MAX_BLOCK` counters, whatever its length.

The chunking was chosen by measurement (docs/detection.md, "Text loops"): whole lines miss a
paragraph streamed as one long line; fixed windows only line up with a repeated passage
whose length divides the window; sentences catch both and name what the user sees.

The other text rule, `text_steps` (the same whole text at successive steps), is
monitor/core/rules/text_steps.py; `text_digest` is what it compares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from monitor.core.signature import text_crc

__all__ = ["MAX_BLOCK", "MAX_UNIT", "TextLoop", "TextStream", "text_digest"]

MAX_UNIT = 512  # characters of one unit held at most; a longer unit is cut
MAX_BLOCK = 32  # units in the longest repeated passage looked for

# A sentence ends at `.`, `!` or `?` after anything but a digit or a space, then white space.
_SENTENCE_END = re.compile(r"(?<=[^\d\s][.!?])\s+")
# Deltas without any of these, in a prose line, only lengthen the unfinished unit.
_MAYBE_BOUNDARY = re.compile(r"[\n.!?]")
_WORDY = re.compile(r"\w")

# What the current line is, decided from its first characters.
_UNKNOWN, _PROSE, _FENCE, _CODE, _TABLE = range(5)


@dataclass(frozen=True, slots=True)
class TextLoop:
    """A passage of `units` units written `repetitions` times back to back, found on the
    part's `chunk`-th delta."""

    units: int
    repetitions: int
    chunk: int


class TextStream:
    """Repetition inside one streamed part; `feed` each delta in order."""

    __slots__ = (
        "kind",
        "repeats",
        "chunks",
        "found",
        "_tail",
        "_line",
        "_in_fence",
        "_in_table",
        "_block",
        "_units",
        "_ring",
        "_runs",
    )

    def __init__(self, kind: str = "text", repeats: int = 5) -> None:
        self.kind = kind  # "text" or "reasoning"
        self.repeats = repeats
        self.chunks = 0  # deltas fed, also after a loop was found
        self.found: TextLoop | None = None
        self._tail = ""  # the current line's text not yet cut into units
        self._line = _UNKNOWN
        self._in_fence = False
        self._in_table = False
        self._block = 0  # running hash of the fenced block or table being read
        self._units = 0
        # Allocated at the first unit: most parts are short and never need them.
        self._ring: list[int] | None = None
        self._runs: list[int] | None = None

    def feed(self, delta: str) -> TextLoop | None:
        """Take the next delta; the loop, on the delta that completes it (once)."""
        self.chunks += 1
        if self.found is not None:
            return None
        tail = self._tail
        if (
            self._line == _PROSE
            and not _MAYBE_BOUNDARY.search(delta)
            and not (tail[-1:] in (".", "!", "?") and delta[:1].isspace())
            and len(tail) + len(delta) <= MAX_UNIT
        ):
            self._tail = tail + delta  # the common case: the middle of a sentence
            return None
        text = tail + delta
        start = 0
        while self.found is None:
            end = text.find("\n", start)
            if end < 0:
                self._tail = self._partial(text[start:])
                break
            self._end_line(text[start:end])
            start = end + 1
        return self.found

    def _classify(self, line: str, complete: bool) -> int:
        head = line.lstrip()
        if self._in_fence:
            if head.startswith(("```", "~~~")):
                return _FENCE
            return _CODE if complete or len(head) >= 3 else _UNKNOWN
        if head[:1] == "|":
            return _TABLE
        if head[:1] in ("`", "~") and len(head) < 3 and not complete:
            return _UNKNOWN  # maybe the start of a fence
        if head.startswith(("```", "~~~")):
            return _FENCE
        if not head and not complete:
            return _UNKNOWN
        return _PROSE

    def _start_line(self, kind: int) -> None:
        self._line = kind
        if self._in_table and kind != _TABLE:
            self._in_table = False
            self._unit_hash(self._block)
        elif kind == _TABLE and not self._in_table:
            self._in_table = True
            self._block = 0

    def _partial(self, text: str) -> str:
        """The unfinished line: cut what units it completes; return what is left."""
        if self._line == _UNKNOWN:
            kind = self._classify(text, complete=False)
            if kind == _UNKNOWN and len(text) <= MAX_UNIT:
                return text
            self._start_line(_PROSE if kind == _UNKNOWN else kind)
            if self.found is not None:
                return ""
        if self._line == _PROSE:
            return self._sentences(text)
        while len(text) > MAX_UNIT:  # a long line in a block: fold it in by pieces
            self._block = text_crc(text[:MAX_UNIT], self._block)
            text = text[MAX_UNIT:]
        return text

    def _end_line(self, line: str) -> None:
        if self._line == _UNKNOWN:
            self._start_line(self._classify(line, complete=True))
        kind = self._line
        self._line = _UNKNOWN
        if self.found is not None:
            return
        if kind == _PROSE:
            rest = self._sentences(line)
            if self.found is None:
                self._unit(rest)
        elif kind == _FENCE:
            if self._in_fence:
                self._in_fence = False
                self._unit_hash(text_crc("\n" + line.strip(), self._block))
            else:
                self._in_fence = True
                self._block = text_crc(line.strip())
        else:  # a line of code or of a table
            self._block = text_crc("\n" + line, self._block)

    def _sentences(self, text: str) -> str:
        last = 0
        for match in _SENTENCE_END.finditer(text):
            self._unit(text[last : match.start()])
            last = match.end()
            if self.found is not None:
                return ""
        text = text[last:]
        while len(text) > MAX_UNIT and self.found is None:
            self._unit(text[:MAX_UNIT])
            text = text[MAX_UNIT:]
        return text

    def _unit(self, text: str) -> None:
        if _WORDY.search(text):
            self._unit_hash(text_crc(" ".join(text.split())))

    def _unit_hash(self, digest: int) -> None:
        ring, runs = self._ring, self._runs
        if ring is None or runs is None:
            ring = self._ring = [0] * MAX_BLOCK
            runs = self._runs = [0] * (MAX_BLOCK + 1)
        n = self._units
        need = self.repeats - 1
        found = 0
        for length in range(1, min(n, MAX_BLOCK) + 1):
            if ring[(n - length) % MAX_BLOCK] == digest:
                run = runs[length] + 1
                runs[length] = run
                if not found and run >= length * need:
                    found = length
            else:
                runs[length] = 0
        ring[n % MAX_BLOCK] = digest
        self._units = n + 1
        if found:
            self.found = TextLoop(found, runs[found] // found + 1, self.chunks)
            self._tail = ""
            self._ring = self._runs = None  # nothing more is looked at


def text_digest(text: str) -> int | None:
    """What makes two whole texts the same for `text_steps`: the words, white space aside.
    None for a text with no letter or digit."""
    return text_crc(" ".join(text.split())) if _WORDY.search(text) else None
