"""A stdout nobody reads never stops the guard: the log goes through a bounded queue to a
writer thread (monitor.shell.logs.LogWriter); what does not fit is dropped and counted, and
the reader, once back, is told how much it missed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import structlog
from aiohttp.test_utils import TestServer

from monitor.kit.poll import until
from monitor.shell.logs import LogWriter, configure_logging, lines_dropped
from monitor.testing import FakeOpencode, play
from tests.harness import loop_frames
from tests.monitor_process import MonitorProcess

# Loops of their own session each: their log lines (about 1 KB a loop, a few lines) fill
# the 64 KiB of a pipe and the 4,096 lines of the writer's queue twice over (1,500 did not
# always fill them: a fresh clone's CI saw no line dropped).
LOOPS = 3000
DROPPED = "opencode_loop_monitor_log_lines_dropped_total"
# A call of the first looping session, as the plugin asks about it.
QUESTION = {
    "session_id": "ses_p0",
    "call_id": "call_q",
    "tool": "read",
    "args": {"filePath": "README.md"},
    "directory": "/w",
}


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


class Pipe:
    """The read end of a pipe whose write end is a monitor's stdout, read only when asked."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.read_end, False)
        self.data = b""

    def drain(self) -> list[dict[str, object]]:
        """Read what the pipe holds now; every whole line read so far, parsed."""
        while True:
            try:
                chunk = os.read(self.read_end, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.data += chunk
        lines = self.data.decode("utf-8").split("\n")[:-1]
        return [json.loads(line) for line in lines]

    def events(self, name: str) -> list[dict[str, object]]:
        return [record for record in self.drain() if record["event"] == name]

    def close_write_end(self) -> None:
        """Once the monitor has it: the monitor's stdout is then the pipe's only writer."""
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1  # never closed twice: its number may be another's by then

    def close(self) -> None:
        self.close_write_end()
        os.close(self.read_end)


def until_sync(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("not in time")
        time.sleep(0.01)


def test_a_full_queue_drops_and_counts_and_says_so_when_the_reader_is_back() -> None:
    pipe = Pipe()
    try:
        writer = LogWriter(os.fdopen(pipe.write_end, "w", closefd=False), capacity=8).start()
        configure_logging("json", "info", writer=writer, environ={})
        log = structlog.get_logger("test")
        # The pipe is never read while these are logged: they fill it, then the queue.
        n = 0
        while lines_dropped() == 0:
            n += 1
            log.info("a.line", n=n, pad="x" * 200)
        log.info("a.line", n=n + 1)  # dropped too, or queued: never waited for
        dropped = lines_dropped()
        records = []

        def said() -> bool:
            records.extend(pipe.drain())
            pipe.data = pipe.data[pipe.data.rfind(b"\n") + 1 :]
            return any(record["event"] == "log.dropped" for record in records)

        until_sync(said)
        [note] = [record for record in records if record["event"] == "log.dropped"]
        assert list(note) == ["count", "total", "event", "level", "timestamp"]
        assert note["level"] == "warning" and note["count"] == note["total"] >= dropped
        assert writer.close(5)
        records.extend(pipe.drain())
        numbers = [record["n"] for record in records if record["event"] == "a.line"]
        assert numbers == sorted(numbers) and numbers[0] == 1  # in order, the first ones kept
        assert len(numbers) + int(str(note["total"])) == n + 1  # each written or counted
    finally:
        pipe.close()


async def test_a_watch_whose_stdout_nobody_reads_stops_every_loop_and_answers(
    tmp_path: Path, socket_path: Path
) -> None:
    stream = b"".join(loop_frames(f"ses_p{n}", 4, prefix=f"p{n}_") for n in range(LOOPS))
    fake = FakeOpencode(streams=[play(stream)])
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    pipe = Pipe()
    monitor = MonitorProcess(
        [
            "watch",
            "--url", str(server.make_url("")).rstrip("/"),
            "--log-format", "json",
            "--metrics-addr", "127.0.0.1:0",
            "--plugin-socket", str(socket_path),
        ],
        tmp_path,
    )  # fmt: skip
    try:
        with open(monitor.stderr_path, "wb") as err:
            monitor.process = subprocess.Popen(
                monitor.args,
                stdout=pipe.write_end,
                stderr=err,
                env=monitor.env,
                start_new_session=True,
            )
        pipe.close_write_end()
        # Read until the metrics port is said, as a reader that then stalls would.
        listening = await until(lambda: pipe.events("metrics.listening"), 30, 0.02, "its port")
        base = f"http://127.0.0.1:{listening[0]['port']}"
        # From here on nobody reads the pipe: every loop is still stopped.
        await until(lambda: len(fake.of("abort")) >= LOOPS, 120, 0.05, "every abort")
        assert {request.session_id for request in fake.of("abort")} == {
            f"ses_p{n}" for n in range(LOOPS)
        }
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"{base}/status") as response:
                assert response.status == 200
                assert (await response.json())["totals"]["interventions"] >= LOOPS

            async def dropped() -> float:
                async with http.get(f"{base}/metrics") as response:
                    text = await response.text()
                [count] = [
                    line.split()[1] for line in text.splitlines() if line.startswith(DROPPED)
                ]
                return float(count)

            # The last loops' lines may still be on their way to the queue.
            await until(dropped, 30, 0.05, "a line dropped")
        # The plugin's question is answered while the log stalls (it waits 200 ms at most).
        connector = aiohttp.UnixConnector(str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as plugin:
            asked = time.monotonic()
            async with plugin.post("http://localhost/v1/decide", json=QUESTION) as answer:
                assert answer.status == 200, await answer.text()
            assert time.monotonic() - asked < 2.0  # loose: a shared host; 503 ms before
        # The reader is back: what was queued comes, then how much went missing.
        await until(lambda: pipe.events("log.dropped"), 30, 0.02, "log.dropped")
        # Every loop's feedback posted, and the reader still reading while the monitor stops:
        # its last lines (monitor.stopped) are written within the exit's 0.5 s, not left
        # behind a pipe nobody empties.
        await until(lambda: len(fake.of("prompt_async")) >= LOOPS, 60, 0.05, "every feedback")
        stopping = asyncio.ensure_future(monitor.stop())
        while not stopping.done():
            pipe.drain()
            await asyncio.sleep(0.01)
        code, _ = await stopping
        assert code == 0
        records = pipe.drain()
        assert records[-1]["event"] == "monitor.stopped"
        notes = [record for record in records if record["event"] == "log.dropped"]
        # Each dropped line told of once: the counts add up to the last line's total.
        assert sum(int(str(note["count"])) for note in notes) == notes[-1]["total"]
    finally:
        monitor.kill()
        pipe.close()
        await server.close()
