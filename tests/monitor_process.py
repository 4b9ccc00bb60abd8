"""The monitor started through its console script, as an operator runs it.

Each monitor runs in its own process group; `stop` ends the group, so nothing outlives a
test, also when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from monitor.kit.poll import until

CONSOLE_SCRIPT = Path(sys.executable).parent / "opencode-loop-monitor"
# The checkout these tests belong to. The console script imports whichever checkout the venv's
# editable install points at: from a git worktree sharing that venv, it ran the other
# checkout's monitor, and a bug in this one passed every test that starts a monitor process.
CHECKOUT = Path(__file__).resolve().parent.parent

Record = dict[str, Any]


class MonitorProcess:
    def __init__(self, args: list[str], log_dir: Path, env: Mapping[str, str] | None = None):
        self.args = [str(CONSOLE_SCRIPT), *args]
        self.stdout_path = log_dir / f"monitor-{time.monotonic_ns()}.log"
        self.stderr_path = self.stdout_path.with_suffix(".err")
        self.env = {**os.environ, **(env or {})}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(CHECKOUT), *filter(None, [self.env.get("PYTHONPATH")])]
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MonitorProcess:
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                self.args, stdout=out, stderr=err, env=self.env, start_new_session=True
            )
        return self

    def records(self) -> list[Record]:
        records = []
        for line in self.stdout_path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                records.append({"event": "<not json>", "line": line})
        return records

    def events(self, name: str) -> list[Record]:
        return [r for r in self.records() if r.get("event") == name]

    def output(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8") + self.stderr_path.read_text(
            encoding="utf-8"
        )

    async def wait_for(
        self, check: Callable[[list[Record]], bool], timeout: float = 30.0
    ) -> list[Record]:

        def shown() -> list[Record] | None:
            records = self.records()
            if check(records):
                return records
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"monitor exited {self.process.returncode}: {self.output()}")
            return None

        try:
            return await until(shown, timeout, what="the monitor log")
        except TimeoutError:
            raise AssertionError(f"monitor log did not show it in time:\n{self.output()}") from None

    async def wait_event(self, name: str, count: int = 1, timeout: float = 30.0) -> list[Record]:
        await self.wait_for(lambda rs: sum(r.get("event") == name for r in rs) >= count, timeout)
        return self.events(name)

    async def wait_exit(self, timeout: float) -> int:
        process = self.process
        assert process is not None
        try:
            await until(lambda: process.poll() is not None, timeout, 0.02, "the monitor to exit")
        except TimeoutError:
            raise AssertionError("monitor did not exit in time") from None
        return process.returncode

    async def stop(self, timeout: float = 5.0) -> tuple[int, float]:
        """SIGTERM, then the exit status and how long the exit took."""
        assert self.process is not None
        started = time.monotonic()
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            code = await self.wait_exit(timeout)
        finally:
            self.kill()
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
