"""Regular expressions run over tool outputs on every finished call, made fast for ASCII.

Python's `re` in its default (Unicode) mode consults Unicode tables for `\\b`, `\\d`, `\\s`,
`\\w` and for case folding at every character it tries. On a text that is all ASCII, which
almost every tool output is, the same pattern compiled with `re.ASCII` matches exactly the
same spans (those constructs differ only on other characters) and runs a third faster. A
`TextPattern` holds both and picks by the text (`str.isascii` is a flag check in C).
"""

from __future__ import annotations

import re

__all__ = ["TextPattern"]


class TextPattern:
    """One pattern, compiled twice: `of(text)` is the one to run on `text`."""

    __slots__ = ("_unicode", "_ascii")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._unicode = re.compile(pattern, flags)
        self._ascii = re.compile(pattern, flags | re.ASCII)

    def of(self, text: str) -> re.Pattern[str]:
        return self._ascii if text.isascii() else self._unicode
