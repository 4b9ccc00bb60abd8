"""Canonical call signatures: two tool calls are "the same" when their signatures are equal.

The signature is the exact tool name, a NUL, then compact JSON of the arguments with object
keys sorted recursively. Strings are kept byte for byte: a model that changes one space in a
command did change the command. A key whose value is null counts as absent, because that is
how an omitted optional argument reaches us (JSON has no undefined).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["canonical_signature", "int_digest", "signature_digest", "text_crc"]

_dump_scalar: Callable[[Any], str] = json.JSONEncoder(
    ensure_ascii=False, allow_nan=True, separators=(",", ":")
).encode


# Most calls' arguments are one object of strings and integers (a path, a command, a limit):
# for those orjson writes exactly what the walk below writes (keys sorted, no null to drop,
# the same escapes; tests/test_signature.py compares them), a fifth of the walk's time. Not
# floats, which it writes in a form of its own; an integer past 64 bits or a lone surrogate
# it refuses, and the walk takes those.
_FLAT_VALUES = (str, int, bool)


class _Token(str):
    """Literal output text on the work stack, told apart from string values to encode."""


_OPEN_ARRAY, _CLOSE_ARRAY = _Token("["), _Token("]")
_OPEN_OBJECT, _CLOSE_OBJECT = _Token("{"), _Token("}")
_COMMA, _COLON = _Token(","), _Token(":")


def canonical_signature(tool: str, args: Any) -> str:
    """Return the canonical signature of a call of `tool` with JSON value `args`.

    Works with an explicit stack rather than recursion: `json.loads` accepts nesting close to
    the interpreter's recursion limit, and a recursive encoder called a few frames deeper would
    then raise on input the server legitimately sent.
    """
    # Keys are strings: the arguments are decoded JSON.
    if type(args) is dict and all(type(value) in _FLAT_VALUES for value in args.values()):
        try:
            return f"{tool}\x00{orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()}"
        except orjson.JSONEncodeError:
            pass
    out: list[str] = [tool, "\x00"]
    stack: list[Any] = [args]
    while stack:
        item = stack.pop()
        if type(item) is _Token:
            out.append(item)
        elif isinstance(item, dict):
            stack.append(_CLOSE_OBJECT)
            members = sorted((k, v) for k, v in item.items() if v is not None)
            for index in range(len(members) - 1, -1, -1):
                key, value = members[index]
                stack.append(value)
                stack.append(_COLON)
                stack.append(_Token(_dump_scalar(key)))
                if index:
                    stack.append(_COMMA)
            stack.append(_OPEN_OBJECT)
        elif isinstance(item, list):
            stack.append(_CLOSE_ARRAY)
            for index in range(len(item) - 1, -1, -1):
                stack.append(item[index])
                if index:
                    stack.append(_COMMA)
            stack.append(_OPEN_ARRAY)
        else:
            out.append(_dump_scalar(item))
    return "".join(out)


def signature_digest(signature: str) -> int:
    """A fixed-size stand-in for a signature, to keep in a session's history.

    The arguments of an edit or write call can be many kilobytes; 64 bits make a collision
    between two calls of one session vanishingly unlikely. `surrogatepass` because JSON may
    carry lone surrogates (`"\\ud800"`), which plain UTF-8 refuses to encode.
    """
    raw = hashlib.blake2b(signature.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def text_crc(text: str, seed: int = 0) -> int:
    """32 bits of `text`, chained on `seed` (a digest of what came before it), the same in
    every process: the builtin `hash()` of a str is salted per process (PYTHONHASHSEED), so
    a rule that kept it decided differently from one process to the next (issue 44). CRC-32
    is as cheap as `hash()` here, and these digests are only compared for equality, where
    one false match in 2**32 is nothing next to the repetitions a rule asks for."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), seed)


_M64 = (1 << 64) - 1


def int_digest(*values: int | None) -> int:
    """64 bits of a few integers (digests, counts; None for one not known), the same in
    every process and every Python: FNV-1a over 64-bit words. Not the builtin `hash()` of a
    tuple, which the style forbids in the core (its algorithm is CPython's to change, and a
    str slipped into the tuple would make it salted per process). Compared for equality only;
    signed, as `signature_digest`, so a history's `array("q")` holds either.
    """
    digest = 0xCBF29CE484222325
    for value in values:
        word = _M64 if value is None else value & _M64
        digest = ((digest ^ word) * 0x100000001B3) & _M64
    return digest - (1 << 64) if digest >> 63 else digest
