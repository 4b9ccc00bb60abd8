"""`opencode-loop-monitor model` run as a person runs it, for the tests that need it:
tests/test_model_command.py, and tests/test_real_model.py beside a real server."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tests.harness import REPO

LINE_S = 30  # a fresh interpreter importing aiohttp on a busy machine

# What docs/usage.md says a person sees of each story (`opencode run` with the plugin and
# `watch`), which tests/test_real_model.py finds in what `opencode run` printed.
LOOP_SHOWS = (
    "ls failed",
    "Automatic notice: this call was refused and did not run: ",
    "Understood. I will stop repeating and change approach.",
)
ESCALATE_SHOWS = ("it is on hold until a person replies", "Error: ")


class Served:
    def __init__(self, process: asyncio.subprocess.Process, printed: list[str]) -> None:
        self.process, self.printed = process, printed

    async def line(self) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), LINE_S)
        assert raw, f"the model exited: {self.printed}"
        self.printed.append(raw.decode().rstrip("\n"))
        return self.printed[-1]

    async def until(self, end: str) -> list[str]:
        """The lines printed from here to the first that starts with `end`, that one too."""
        start = len(self.printed)
        while not (await self.line()).startswith(end):
            pass
        return self.printed[start:]

    async def reach(self, text: str) -> str:
        """The first line printed from here that holds `text`."""
        while text not in (line := await self.line()):
            pass
        return line


@asynccontextmanager
async def model_command(*flags: str) -> AsyncIterator[Served]:
    """`opencode-loop-monitor model --port 0 FLAGS`, killed at the end whatever happened."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "monitor", "model", "--port", "0", *flags,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield Served(process, [])
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def block_of(printed: list[str]) -> dict[str, Any]:
    start, end = printed.index("{"), printed.index("}")
    return json.loads("\n".join(printed[start : end + 1]))
