"""JSON of any depth, read with a stack instead of recursion.

`json.loads` recurses once per level of nesting and raises RecursionError past the
interpreter's limit (about 1,000 levels); a call's arguments nested deeper are still valid
JSON, odd but not malformed, and must be judged like any other (issue 33). This reads what
`json.loads` reads, in the same way (strict strings, NaN and Infinity, a float for a number
with a fraction or an exponent), with the C string scanner of the json module; it is slower
than `json.loads` (about 0.3 s for a MiB of nesting), so it is called only for what
`json.loads` could not read for depth. Every other part of the monitor walks a call's
arguments with a stack too (monitor.core.signature).
"""

from __future__ import annotations

import json.decoder
import re
from collections.abc import Callable
from typing import Any

__all__ = ["loads"]

# The json module's own string reader (C): escapes, surrogates and strictness as it reads
# them. Public in json.decoder, though its stubs leave it out.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_CONSTANTS: dict[str, Any] = {
    "null": None,
    "true": True,
    "false": False,
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}


class _Object:
    """An object being read, and the key of the value to come."""

    __slots__ = ("members", "key")

    def __init__(self, key: str) -> None:
        self.members: dict[str, Any] = {}
        self.key = key


# Deep nesting is mostly runs of `[`, of `]` and of `{"key":` (a key with no escape), taken
# a run or a level at a time with one match: a MiB of either reads in a few tenths of a
# second (1.2 s one character at a time).
_ARRAYS = re.compile(r"(?:\[[ \t\n\r]*)+")
_CLOSING = re.compile(r"(?:[ \t\n\r]*\])+")
_OBJECT = re.compile(r'\{[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*')


def loads(text: str, parse_int: Callable[[str], Any] = int) -> Any:
    """The value of the JSON document `text`; ValueError when it is not one."""
    stack: list[list[Any] | _Object] = []  # the arrays and objects open, innermost last
    pos = _skip(text, 0)
    while True:
        value, pos = _open(text, pos, stack)
        if value is _OPENED:
            continue
        if isinstance(value, _Number):
            value = parse_int(value) if value.integer else float(value)
        done, value, pos = _settle(text, pos, value, stack)
        if done:
            return value


# What `_open` returns when it opened a container whose first value is still to be read.
_OPENED = object()


def _open(text: str, pos: int, stack: list[list[Any] | _Object]) -> tuple[Any, int]:
    """Open the containers that start at `pos`, then read the value there: the value (an
    empty array closed at once included) and where it ends, or `_OPENED` and where the first
    value of the object it opened starts."""
    opened = _OBJECT.match(text, pos)
    while opened is not None:
        stack.append(_Object(opened.group(1)))
        pos = opened.end()
        opened = _OBJECT.match(text, pos)
    run = _ARRAYS.match(text, pos)
    if run is not None:
        stack.extend([] for _ in range(run.group().count("[")))
        pos = run.end()
        if text.startswith("]", pos):  # the last one opened is empty
            return stack.pop(), pos + 1
    value, pos, other = _value(text, pos)
    if other is not None:
        stack.append(other)
        return _OPENED, pos
    return value, pos


def _settle(
    text: str, pos: int, value: Any, stack: list[list[Any] | _Object]
) -> tuple[bool, Any, int]:
    """Put a value read in its container, closing every container that ends here: whether
    the document is whole (then its value), else where the next value starts."""
    while True:
        run = _CLOSING.match(text, pos)
        if run is not None:
            for _ in range(run.group().count("]")):
                array = stack.pop() if stack else None
                if not isinstance(array, list):
                    raise ValueError(f"unexpected ']' near character {pos}")
                array.append(value)
                value = array
            pos = run.end()
        pos = _skip(text, pos)
        if not stack:
            if pos != len(text):
                raise ValueError(f"extra data at character {pos}")
            return True, value, pos
        top = stack[-1]
        if isinstance(top, list):
            top.append(value)
        else:
            top.members[top.key] = value
        char = text[pos : pos + 1]
        if char == ",":
            pos = _skip(text, pos + 1)
            if isinstance(top, _Object):
                top.key, pos = _key(text, pos)
            return False, None, pos
        if char != ("]" if isinstance(top, list) else "}"):
            raise ValueError(f"expected ',' or a closing bracket at character {pos}")
        pos += 1
        stack.pop()
        value = top if isinstance(top, list) else top.members


class _Number(str):
    """A number's text; `integer` when it has neither fraction nor exponent."""

    integer = False


def _value(text: str, pos: int) -> tuple[Any, int, _Object | None]:
    """The scalar or empty container at `pos` and where it ends, or the container it opens
    (its first key read, for an object) and where its first value starts."""
    char = text[pos : pos + 1]
    if char == '"':
        string, end = _scanstring(text, pos + 1, True)
        return string, end, None
    if char == "{":  # an array opens in `loads`, as a run
        inner = _skip(text, pos + 1)
        if text.startswith("}", inner):
            return {}, inner + 1, None
        key, start = _key(text, inner)
        return None, start, _Object(key)
    for name, constant in _CONSTANTS.items():
        if text.startswith(name, pos):
            return constant, pos + len(name), None
    match = _NUMBER.match(text, pos)
    if match is None:
        raise ValueError(f"expected a value at character {pos}")
    number = _Number(match.group())
    number.integer = match.group(2) is None and match.group(3) is None
    return number, match.end(), None


def _key(text: str, pos: int) -> tuple[str, int]:
    """An object's key at `pos`, and where its value starts."""
    if not text.startswith('"', pos):
        raise ValueError(f"expected a key at character {pos}")
    key, end = _scanstring(text, pos + 1, True)
    end = _skip(text, end)
    if not text.startswith(":", end):
        raise ValueError(f"expected ':' at character {end}")
    return key, _skip(text, end + 1)


def _skip(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()
