"""The plugin's TCP endpoint under abuse (issue 25): what a neighbour's flood costs detection.

`python -m bench.abuse slowloris` (another user, as root only: `nobody`) or `python -m
bench.abuse flood` (this user, with the right token); about 20 s each. The monitor runs as
its own process with 1,024 descriptors (a monitor started by hand) against the stand-in
server, `--plugin-addr` on loopback. Ten loops are stopped unloaded, then under the flood:
the time from the frame that completes a loop to the abort's arrival at the stand-in; ten
plugin-like calls on new connections (status and time); the monitor's open descriptors
(`/proc/PID/fd`), the most seen; the `plugin.refused` lines it wrote. Prints JSON.

- slowloris: 1,100 connections, each an unfinished request head, one more header every
  0.5 s, a closed one opened again (the test suite runs it too, tests/test_abuse.py);
- flood: 2,000 connections sending valid requests back to back;
- calls: 300 plugin-like calls, one every 13 ms, amid the slowloris of tests/test_abuse.py
  (768 connections against a monitor of 256 descriptors): how many failed, how many took over
  0.5 s and over 1.5 s, the slowest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from monitor.core.plugin_protocol import question_mac
from monitor.testing import FakeOpencode, frames
from tests import frames_factory as ff
from tests.monitor_process import MonitorProcess

NEIGHBOUR = "nobody"
SLOWLORIS = """
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
def head():
    s = socket.socket(); s.setblocking(False)
    try: s.connect(("127.0.0.1", port))
    except BlockingIOError: pass
    return s
conns = [head() for _ in range(count)]
time.sleep(0.2)
for s in conns:
    try: s.send(b"POST /v1/decide HTTP/1.1\\r\\n")
    except OSError: pass
print("ready", flush=True)
n = 0
while True:  # one more header every 0.5 s; a connection the monitor closed is opened again
    time.sleep(0.5); n += 1
    for i, s in enumerate(conns):
        try: s.send(b"X-Slow-%d: 1\\r\\n" % n)
        except OSError:
            s.close(); conns[i] = head()
"""
WRONG_TOKEN = """
import http.client, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
answered, end = 0, time.monotonic() + seconds
conn = None
while time.monotonic() < end:
    try:
        conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("POST", "/v1/decide", b"{}", {"Authorization": "Bearer wrong",
                                                   "Content-Type": "application/json"})
        answered += conn.getresponse().read() is not None
    except OSError:
        conn = None
print(answered, flush=True)
"""


def neighbour(script: str, *args: object, user: str | None = NEIGHBOUR) -> subprocess.Popen[str]:
    """`script` as the other user (None: as this one), in a process group of its own."""
    return subprocess.Popen(
        [sys.executable if user is None else "python3", "-c", script, *map(str, args)],
        user=user,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def end(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


async def decide_call(port: int, token: str) -> tuple[int, float]:
    """One plugin-like call on a new connection: its status and how long it took."""
    call = {
        "session_id": "ses_pluginxx",
        "call_id": "call_0",
        "tool": "read",
        "args": {"filePath": "/w/a"},
        "directory": "/w",
    }
    body = json.dumps(call).encode()
    nonce = secrets.token_hex(16)
    # Signed as the plugin signs its questions: the token in the clear is refused.
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"OLM-HMAC {nonce} {question_mac(token, nonce, body)}",
    }
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"http://127.0.0.1:{port}/v1/decide",
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=5),
        ) as r:
            await r.read()
            return r.status, time.monotonic() - started


FLOOD = """
import asyncio, hashlib, hmac, json, secrets, sys
port, count, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = json.dumps({"session_id": "ses_floodxx", "call_id": "c", "tool": "read", "args": {},
                   "directory": "/w"}).encode()
def request():
    # Each question signed afresh, as the plugin signs: a nonce asked before is refused.
    nonce = secrets.token_hex(16)
    mac = hmac.new(token.encode(), b"question " + nonce.encode() + b"\\n" + body,
                   hashlib.sha256).hexdigest()
    return (f"POST /v1/decide HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
            f"Authorization: OLM-HMAC {nonce} {mac}\\r\\nContent-Length: {len(body)}\\r\\n\\r\\n"
            ).encode() + body
async def one():
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            while True:
                writer.write(request())
                if not await reader.readline():
                    break
                while await reader.readline() not in (b"\\r\\n", b""):
                    pass
                await reader.read(64)
        except OSError:
            await asyncio.sleep(0.01)
async def main():
    print("ready", flush=True)
    await asyncio.gather(*(one() for _ in range(count)))
asyncio.run(main())
"""
# A monitor started by hand has 1,024 descriptors (the units give 8,192).
NOFILE = 1024
# The test suite's stand-in for 1,100 connections against 1,024 (tests/test_abuse.py): a
# monitor of this many descriptors, and three times as many connections against it.
SUITE_NOFILE = 256
SUITE_CONNECTIONS = 3 * SUITE_NOFILE


def limited(nofile: int) -> str:
    """The monitor's command line as a program that first lowers its file limit."""
    return (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
        "from monitor.cli import main; sys.exit(main(sys.argv[1:]))"
    )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Guarded:
    """A monitor process with `nofile` descriptors serving the plugin on `port`, watching
    `fake`; `token` is what its plugins send."""

    fake: FakeOpencode
    monitor: MonitorProcess
    port: int
    token: str

    def descriptors(self) -> int:
        assert self.monitor.process is not None
        return len(os.listdir(f"/proc/{self.monitor.process.pid}/fd"))

    async def loop(self, session: str) -> None:
        await self.fake.push(frames(*(ff.envelope(f, "/w") for f in ff.loop_of(session, 4))))


@contextlib.asynccontextmanager
async def guarded(folder: Path, nofile: int = NOFILE) -> AsyncIterator[Guarded]:
    """Start the stand-in and the monitor (until it has resynced); stop both at the end."""
    fake = FakeOpencode()
    fake.streams = [fake.live]
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    port = free_port()
    monitor = MonitorProcess(
        ["watch", "--url", str(server.make_url("")).rstrip("/"), "--plugin-addr",
         f"127.0.0.1:{port}", "--plugin-token-file", str(folder / "token"), "--log-format", "json"],
        folder,
    )  # fmt: skip
    monitor.args = [sys.executable, "-c", limited(nofile), *monitor.args[1:]]
    try:
        monitor.start()
        await monitor.wait_event("stream.resynced")
        yield Guarded(fake, monitor, port, (folder / "token").read_text().strip())
    finally:
        monitor.kill()
        fake.close()
        await server.close()


@contextlib.asynccontextmanager
async def flooding(script: str, *args: object, user: str | None = NEIGHBOUR) -> AsyncIterator[None]:
    """`neighbour(script, ...)` from the moment it says it is ready until the end."""
    flood = neighbour(script, *args, user=user)
    try:
        assert flood.stdout is not None
        assert await asyncio.to_thread(flood.stdout.readline) == "ready\n"
        yield
    finally:
        end(flood)


async def aborts(guard: Guarded, count: int, tag: str) -> list[float]:
    """Milliseconds from pushing each loop's frames to its abort's arrival."""
    loop = asyncio.get_running_loop()
    taken = []
    for n in range(count):
        session = f"ses_{tag}{n}"
        pushed = loop.time()
        await guard.loop(session)
        while not (arrived := [r.at for r in guard.fake.of("abort") if r.session_id == session]):
            if loop.time() - pushed > 10:
                raise TimeoutError(f"no abort of {session} within 10 s")
            await asyncio.sleep(0.001)
        taken.append((arrived[0] - pushed) * 1000)
        await asyncio.sleep(0.2)
    return taken


async def measure(mode: str) -> dict[str, object]:
    async with guarded(Path(tempfile.mkdtemp(prefix="olm-abuse-"))) as guard:
        unloaded = await aborts(guard, 10, "calm")
        if mode == "slowloris":
            flood = flooding(SLOWLORIS, guard.port, 1100)
        else:
            flood = flooding(FLOOD, guard.port, 2000, guard.token, user=None)
        async with flood:
            await asyncio.sleep(3)
            held = [guard.descriptors()]
            calls = []
            for _ in range(10):
                try:
                    calls.append(await decide_call(guard.port, guard.token))
                except (aiohttp.ClientError, TimeoutError):
                    calls.append((0, 0.0))  # reset or timed out: the plugin falls open
                held.append(guard.descriptors())
            loaded = await aborts(guard, 10, "flood")
            held.append(guard.descriptors())
        await guard.monitor.stop()
    return {
        "mode": mode,
        "abort_ms_unloaded": {"median": statistics.median(unloaded), "max": max(unloaded)},
        "abort_ms_flood": {"median": statistics.median(loaded), "max": max(loaded)},
        "abort_ratio_median": statistics.median(loaded) / statistics.median(unloaded),
        "plugin_calls_answered": sum(status == 200 for status, _ in calls),
        "plugin_call_ms_max": max(took for _, took in calls) * 1000,
        "descriptors_max": max(held),
        "refused_lines": len(guard.monitor.events("plugin.refused")),
    }


async def amid_slowloris(count: int = 300) -> dict[str, object]:
    async with guarded(Path(tempfile.mkdtemp(prefix="olm-abuse-")), SUITE_NOFILE) as guard:
        async with flooding(SLOWLORIS, guard.port, SUITE_CONNECTIONS):
            failed, took = 0, []
            for _ in range(count):
                try:
                    status, seconds = await decide_call(guard.port, guard.token)
                except (aiohttp.ClientError, TimeoutError):
                    failed += 1
                else:
                    failed += status != 200
                    took.append(seconds)
                await asyncio.sleep(0.013)  # out of step with the flood's 0.5 s
        await guard.monitor.stop()
    return {
        "calls": count,
        "failed": failed,
        "over_0_5_s": sum(t > 0.5 for t in took),
        "over_1_5_s": sum(t > 1.5 for t in took),
        "slowest_s": max(took, default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("slowloris", "flood", "calls"))
    mode = parser.parse_args().mode
    result = asyncio.run(amid_slowloris() if mode == "calls" else measure(mode))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
