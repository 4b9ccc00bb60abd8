"""Starting the monitor for a test: in-process against the stand-in server, or as an operator
runs it against the real `opencode serve` (the fixtures in tests/conftest.py).

The one place the tests start and stop a monitor; test modules import from here, never from
each other.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from monitor.config import load_settings
from monitor.core.commands import Do, Log, Send
from monitor.core.decisions import Action, Intervene, Plan, Reply
from monitor.core.feedback import MARK
from monitor.core.findings import CallCycle
from monitor.core.monitor import Monitor
from monitor.core.tracker import Detection, Tracker
from monitor.kit.poll import until
from monitor.kit.sandbox import OpencodeServer
from monitor.kit.scripted_model import script
from monitor.shell.actions import Interventions
from monitor.shell.api import OpencodeAPI, Retry
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.backoff import Backoff
from monitor.shell.notify import Notifier
from monitor.shell.timing import Timing
from monitor.shell.watch import Watch
from monitor.testing import FakeOpencode, frames
from tests import frames_factory as ff
from tests.frames_factory import BASH, READ, call, envelope
from tests.monitor_process import MonitorProcess

REPO = Path(__file__).resolve().parent.parent

# --- in-process, against the stand-in ---------------------------------------------------

FAST = Timing(
    read_timeout=0.5,
    reconnect=Backoff(initial=0.05, cap=0.1),
    retry=Retry(attempts=3, backoff=Backoff(initial=0.01, cap=0.02), timeout=0.5),
    # No wait before the feedback: one monitor has nobody to let go first.
    stagger=lambda: 0.0,
)
Running = tuple[TestServer, Watch, "asyncio.Task[int]"]


def loop_frames(session: str, calls: int, directory: str = "/w", prefix: str = "p") -> bytes:
    """`calls` identical reads of one session, as the stream sends them."""
    events = []
    for n in range(calls):
        events += [envelope(f, directory) for f in call(session, f"{prefix}{n + 1}", "read", READ)]
    return frames(*events)


async def start(
    fake: FakeOpencode, timing: Timing = FAST, roles: Path | None = None, **flags: Any
) -> Running:
    """Serve `fake` on loopback and run a `Watch` of it with these flags; `stop` ends both."""
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    return (server, *watching(server, timing, roles, **flags))


def watching(
    server: TestServer, timing: Timing = FAST, roles: Path | None = None, **flags: Any
) -> tuple[Watch, asyncio.Task[int]]:
    """A(nother) `Watch` of a stand-in already served; `Watch.stop` and await the task.
    `roles`: the folder where monitors mark which one acts (monitor.shell.acting); two
    watches given two folders do not see each other, so both act."""
    settings = load_settings(
        {"url": str(server.make_url("")).rstrip("/"), **flags}, {}, isatty=False
    )
    watch = Watch(settings, notifier=Notifier(None), timing=timing, roles=roles)
    return watch, asyncio.create_task(watch.run())


async def stop(server: TestServer, watch: Watch, task: asyncio.Task[int]) -> int:
    """Stop the watch, then the server also when the watch fails; the watch's exit status."""
    watch.stop()
    try:
        return await asyncio.wait_for(task, 5)
    finally:
        await server.close()


async def watched_until(
    fake: FakeOpencode, logged: str, timing: Timing = FAST, **flags: Any
) -> list[dict[str, Any]]:
    """Run a `Watch` of `fake` with these flags until it logs `logged`, then stop both
    (also when the wait fails); what it logged."""
    with capture_logs() as logs:
        running = await start(fake, timing, **flags)
        try:
            await wait_for(lambda: events(logs, logged))
        finally:
            await stop(*running)
    return logs


async def wait_for(condition: Callable[[], object], timeout: float = 5.0) -> None:
    await until(condition, timeout, 0.01)


class LoopClock:
    """The running loop's clock, which a test can stop: while it is frozen no timer comes
    due (aiohttp's request timeouts, sleeps, `wait_for`) until `advance` moves it. A request
    timeout then depends on how far the test moved the clock, never on how loaded the
    machine is."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._real = loop.time
        self._offset = 0.0
        self._frozen: float | None = None

    def time(self) -> float:
        return self._real() - self._offset if self._frozen is None else self._frozen

    def freeze(self) -> None:
        self._frozen = self.time()

    def advance(self, seconds: float) -> None:
        assert self._frozen is not None, "advance a frozen clock only"
        self._frozen += seconds

    def thaw(self) -> None:
        assert self._frozen is not None
        self._offset = self._real() - self._frozen
        self._frozen = None


@contextmanager
def loop_clock() -> Iterator[LoopClock]:
    """The running loop reads its time from a `LoopClock` until the block ends."""
    loop = asyncio.get_running_loop()
    clock = LoopClock(loop)
    loop.time = clock.time  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        del loop.time  # type: ignore[method-assign]


async def settle(condition: Callable[[], object], wall_timeout: float = 30.0) -> None:
    """`wait_for` for a frozen clock: yields to the loop (no timer) until `condition` holds;
    the bound is wall time, only so that a broken monitor fails rather than hangs."""
    deadline = time.monotonic() + wall_timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not settled within {wall_timeout:g} s")
        await asyncio.sleep(0)


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


# --- a subprocess, against the real server ----------------------------------------------


class CuttableProxy:
    """A TCP proxy on loopback in front of the server: `cut` drops every connection and
    refuses new ones until `mend`, as a network outage would."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.open = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        self.open = False
        for writer in list(self._writers):
            writer.transport.abort()

    def mend(self) -> None:
        self.open = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


# A model takes time to answer; without any, the race between the abort and the next call
# is not one a real loop runs.
MODEL_DELAY = 0.2


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [
        "".join(p.get("text", "") for p in m["parts"] if p.get("type") == "text")
        for m in messages
        if m["info"]["role"] == "user"
    ]


def assistant_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [
        p["text"]
        for m in messages
        if m["info"]["role"] == "assistant"
        for p in m["parts"]
        if p.get("type") == "text"
    ]


def watch_args(server: OpencodeServer, *flags: str) -> list[str]:
    return ["watch", "--url", server.url, "--log-format", "json", "--log-level", "debug", *flags]


async def start_watching(
    start_monitor: Callable[..., MonitorProcess], server: OpencodeServer, *flags: str
) -> MonitorProcess:
    """`watch` of the real server through the console script (the `start_monitor` fixture
    ends it), once it follows the stream: its first resync has ended (until then the plugin's
    questions are answered 503, and its own rule judges)."""
    monitor = start_monitor(*watch_args(server, *flags))
    await monitor.wait_event("stream.resynced")
    return monitor


async def seen_idle(
    http: aiohttp.ClientSession, address: str, session_id: str, timeout: float = 30.0
) -> None:
    """Wait until the monitor's `/status` (`--metrics-addr address`) shows the session idle:
    it has read the run's last frame (the server's idle comes after every update of the
    run), the positive sign a test needs before asserting that nothing was detected."""

    async def idle() -> bool:
        async with http.get(f"http://{address}/status") as response:
            body = await response.json()
        return any(
            entry["session_id"] == session_id and entry["state"] == "idle"
            for entry in body["sessions"]
        )

    await until(idle, timeout, 0.05, what=f"the monitor to see session {session_id} idle")


# The flags `seen_through` needs: /status on a port of the system's choosing.
STATUS_FLAGS = ("--metrics-addr", "127.0.0.1:0")


async def seen_through(
    monitor: MonitorProcess, server: OpencodeServer, http: aiohttp.ClientSession
) -> None:
    """The positive sign a test waits for before asserting that nothing came of what the
    server did so far: a marker session is made and runs once (text, no call); the server
    has carried it out (a run that an earlier request started would have begun by then),
    and the monitor (started with `STATUS_FLAGS`) shows the marker on /status. The server
    sends one stream, in order, so the monitor has read every frame sent before it."""
    [listening] = await monitor.wait_event("metrics.listening")
    client = server.client(http)
    marker = await client.create_session("marker")
    await client.prompt_async(marker["id"], script([("read", READ)], 0))
    await client.wait_idle(marker["id"], 60)
    await seen_idle(http, f"{listening['host']}:{listening['port']}", marker["id"])


async def opencode_run(
    server: OpencodeServer, binary: Path, prompt: str, *flags: str
) -> tuple[int, str]:
    """`opencode run --attach` as a user types it, with `prompt` (a script) as its message;
    its exit status and output. The process is ended if it outlives the wait."""
    process = await asyncio.create_subprocess_exec(
        str(binary),
        "run",
        "--attach",
        server.url,
        "--dir",
        server.directory,
        "--model",
        "fake/looper",
        *flags,
        prompt,
        cwd=server.project,
        env=server.client_environment(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode or 0, output.decode(errors="replace")


async def status(address: str, *flags: str) -> tuple[int, str]:
    """`opencode-loop-monitor status` of the monitor serving `address`: exit status, output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "monitor",
        "status",
        "--metrics-addr",
        address,
        *flags,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode()


APPEND = ("bash", {"command": "echo x >> out.txt", "description": "append a line"})


async def stalled_through_a_loop(
    monitor: MonitorProcess, server: OpencodeServer, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """An 8-append loop during which `monitor` is stopped (SIGSTOP), from its first append
    until the run is over, then resumed; the session."""
    client = server.client(http)
    session: dict[str, Any] = await client.create_session("appends")
    await client.prompt_async(session["id"], script([APPEND], 8, delay=0.3))
    out = server.project / "out.txt"

    async def written() -> bool:
        return out.exists() and len(out.read_text().splitlines()) >= 1

    await until(written, 30, interval=0.02, what="the first append")
    assert monitor.process is not None
    monitor.process.send_signal(signal.SIGSTOP)
    try:
        await client.wait_idle(session["id"], 90)
    finally:
        monitor.process.send_signal(signal.SIGCONT)
    return session


def refused_record() -> list[dict]:
    """The session after one monitor refused call 4: the call ended in error with its text."""
    calls = [
        ff.export_part("ses_1", f"prt_{n}", "completed", *BASH[1:], tool="bash") for n in (1, 2, 3)
    ]
    refused = ff.export_part("ses_1", "prt_4", "error", *BASH[1:], tool="bash")
    refused["state"]["error"] = (
        "The user rejected permission to use this specific tool call with the following "
        f"feedback: {MARK}this call was refused and did not run"
    )
    return [
        ff.user_message("ses_1"),
        *(ff.assistant_message("ses_1", c) for c in calls),
        ff.assistant_message("ses_1", refused),
    ]


def held_decision() -> Intervene:
    """The loop of `refused_record`, escalated to a hold: ours to carry out in full."""
    return Intervene(
        session_id="ses_1",
        directory="/w",
        finding=CallCycle(("bash",), 4),
        part_id="prt_4",
        call_index=6,
        prior_interventions=2,
        hold=True,
        escalated=True,
        feedback=MARK + "held",
        action=Action.STOP,
        plan=Plan.HOLD,
    )


class Untracked(Tracker):
    """A tracker that follows no session: the interventions of `Carrier` are of decisions
    made up by a test, whose run is over only where `run_over` says."""

    def __init__(self, run_over: Callable[[Intervene], bool] = lambda decision: False) -> None:
        super().__init__(Detection())
        self._over = run_over

    def run_over(self, decision: Intervene) -> bool:
        return self._over(decision)

    def expire(self, reply: Reply) -> Reply | None:
        return reply

    def forget(self, session_id: str) -> None:
        pass


class Carrier:
    """`Monitor`'s interventions of decisions a test hands it, carried out by `Interventions`
    against `api` as the watch's executor does: lines logged, `Do` and `Send` carried out."""

    def __init__(
        self,
        api: object,
        run_over: Callable[[Intervene], bool] = lambda decision: False,
        plugin_elsewhere: bool = False,
        **options: Any,
    ) -> None:
        self.monitor = Monitor(Untracked(run_over))
        self.monitor.plugin_elsewhere(plugin_elsewhere)
        self.actions = Interventions(
            api,  # type: ignore[arg-type]
            self.monitor,
            self.execute,
            on_fatal=lambda _: None,
            **options,
        )

    def execute(self, commands: Any) -> None:
        for command in commands:
            if isinstance(command, Log):
                getattr(structlog.get_logger("tests"), command.level)(
                    command.event, **command.fields
                )
            elif isinstance(command, Do):
                self.actions.begin(command)
            elif isinstance(command, Send):
                self.actions.send(command.reply)

    def submit(self, decision: Intervene) -> None:
        self.execute(self.monitor.act(decision))

    def blocked(self, decision: Intervene, call_id: str | None = None) -> None:
        self.execute(self.monitor.blocked(decision, call_id))

    def answer(self, reply: Reply) -> None:
        self.execute(self.monitor.answer(reply))

    async def drain(self, timeout: float) -> None:
        await self.actions.drain(timeout)


async def carried_out(fake: FakeOpencode, act: Callable[[Carrier], None]) -> list[dict]:
    """The log of `act` on a `Carrier` against the stand-in `fake`, once it is done."""
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            api = OpencodeAPI(http, str(server.make_url("")).rstrip("/"), FAST.retry, FAST.sleep)
            actions = Carrier(api)
            with capture_logs() as logs:
                act(actions)
                await actions.drain(5)
    finally:
        await server.close()
    return logs


class Engine:
    """A user's client of the new engine: sessions made and prompted through `/api`."""

    def __init__(self, server: OpencodeServer, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.http = http
        self.api = EngineAPI(http, server.url)
        self.where = {"location[directory]": server.directory}

    async def create_session(self) -> str:
        async with self.http.post(
            f"{self.server.url}/api/session", params=self.where, json={}
        ) as response:
            assert response.status == 200
            return str((await response.json())["data"]["id"])

    async def prompt(self, session_id: str, text: str) -> None:
        async with self.http.post(
            f"{self.server.url}/api/session/{session_id}/prompt",
            params=self.where,
            json={"prompt": {"text": text}},
        ) as response:
            assert response.status == 200

    async def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The session's record as 1.x messages (`core/export_v2.py`), oldest first."""
        return await self.api.messages(session_id, self.server.directory, route=2)

    async def wait_answered(
        self, session_id: str, timeout: float, user_messages: int = 1
    ) -> list[dict[str, Any]]:
        """The record once the session is no longer running and its last message is the
        final answer to its `user_messages`-th user message."""

        async def answered() -> list[dict[str, Any]] | None:
            if session_id in await self.api.busy_sessions(self.server.directory):
                return None
            messages = await self.messages(session_id)
            users = sum(m["info"]["role"] == "user" for m in messages)
            last = messages[-1]["info"] if messages else {}
            done = last.get("role") == "assistant" and last.get("finish") == "stop"
            return messages if users >= user_messages and done else None

        return await until(answered, timeout, interval=0.2, what=f"{session_id} to answer")


def alive(pid: int) -> bool:
    """Whether a process runs; a zombie does not (init in a container may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def read_pid_file(path: Path, timeout: float) -> int:
    def written() -> str:
        return path.read_text().strip() if path.exists() else ""

    return int(await until(written, timeout, what=f"a pid in {path}"))
