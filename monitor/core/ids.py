"""OpenCode's id shapes, checked before an id goes into a request path.

OpenCode makes every id as a prefix, "_", 12 hex digits of time and 14 base62 characters
(`ses_dd4d5c831ffemmgMvdYdtbM3cW`, `per_22b2a3d850013DUJ47NNWqN5pa`; the OpenAPI document
only says the id starts with its prefix). We accept the prefix and the base62 alphabet at
any length up to 64, so a longer id from a later server still works, while ".", "..", "/",
"?", "%", whitespace and anything outside ASCII never reach a URL.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["is_permission_id", "is_session_id"]

_BASE62 = "[0-9A-Za-z]{1,64}"
SESSION_ID = re.compile(f"ses_{_BASE62}")
PERMISSION_ID = re.compile(f"per_{_BASE62}")


def is_session_id(value: object) -> bool:
    return isinstance(value, str) and _is_session_id(value)


# The daemon checks the session id of every frame that names one, and a server has a few
# sessions busy at a time: the answer for the recent ones is remembered (C, no regex).
@lru_cache(maxsize=1024)
def _is_session_id(value: str) -> bool:
    return SESSION_ID.fullmatch(value) is not None


def is_permission_id(value: object) -> bool:
    return isinstance(value, str) and PERMISSION_ID.fullmatch(value) is not None
