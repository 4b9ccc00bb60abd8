"""Wait for something another process does, by asking again until it is so.

The kit and the tests watch servers and monitors they cannot subscribe to (a session's
messages, a log file, a pid file, a process table), so they poll. One helper keeps every such
wait bounded, and every timeout says what was being waited for.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["until"]

T = TypeVar("T")


# A `check` answers None (or False) for "not yet", so what `until` returns is never None.
@overload
async def until(
    check: Callable[[], Awaitable[T | None]],
    timeout: float,
    interval: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def until(
    check: Callable[[], T | None],
    timeout: float,
    interval: float = ...,
    what: str = ...,
) -> T: ...


async def until(
    check: Callable[[], Any],
    timeout: float,
    interval: float = 0.05,
    what: str = "the condition",
) -> Any:
    """Call `check` (plain or async) until it returns something true, and return that.

    `check` is called at least once, also with a timeout of 0; it may raise to end the wait
    early (a process that exited will never show what we wait for). After `timeout` seconds
    without a true result, raises TimeoutError naming `what`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
