"""`opencode-loop-monitor demo`: the monitor stopping a real loop, with nothing to set up.

Everything runs in this one process but the server: a scripted model that loops
(`monitor.kit.scripted_model`), a real `opencode serve` isolated on loopback
(`monitor.kit.sandbox`), the monitor itself (`Watch`, in-process, with the user's detection
and action settings), and a `Printer` that tells a person what happens, from two sources:

- the server's own event stream: the tool calls, the abort, the feedback, the answer;
- the monitor's log records, taken from the structlog chain by a processor before they are
  written to a log file, so the monitor's logs never interleave with the story.

At the end the server's record of the session (its messages) says how many calls ran and
whether any started after the one that completed the loop.

With `--permissions approve` the server is configured to ask permission before every call
and the monitor answers: it approves every call but the one that completes the loop, which
it refuses before it runs; the model reads the refusal as that call's result and goes on.
With `plugin=True` the server asks nothing (OpenCode's default config) but has the monitor's
plugin installed: the plugin asks the monitor before every call and refuses the loop's call
in band, and the model goes on in the same run.

The same story runs on either OpenCode the kit knows (`EDITIONS`): 1.18.33 (`opencode-ai`, the
default) or 2.2.5 (`@opencode/cli`, `--opencode 2`). What differs is said once per release: the
server and its stream (`Frames1`, `Frames2` read each release's frames into the printer's
story) and its sessions (`Sessions1`, `Sessions2`: create, prompt, wait, the calls that ran).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import aiohttp

from monitor.config import Settings
from monitor.core.frames import FrameError, SSEChunkDecoder, decode_frame
from monitor.errors import MonitorError, ServerError
from monitor.exits import EX_FAILED, EX_OK
from monitor.kit.poll import until
from monitor.kit.sandbox import (
    NEVER_ASK,
    RELEASE_1,
    RELEASE_2,
    IsolatedServer,
    OpencodeServer,
    OpencodeServer2,
    ProjectClient,
    ProjectClient2,
    Release,
    SandboxError,
    find_or_install_opencode,
    free_loopback_port,
    tool_parts,
)
from monitor.kit.scripted_model import DEFAULT_ANSWER, ScriptedModel, script
from monitor.shell.endpoint import PluginEndpoint
from monitor.shell.logs import configure_logging
from monitor.shell.notify import Notifier
from monitor.shell.stream import READ_BUFSIZE, stream_timeout, stream_url
from monitor.shell.watch import Watch

__all__ = ["DRY_RUN_ANSWER", "EDITIONS", "Edition", "Printer", "run_demo", "watching_line"]

PREFIX = "opencode-loop-monitor demo"
LOG_NAME = "demo-monitor.log"

# The scripted agent: read the README, list the files, and again, for up to CALLS calls,
# heeding the monitor (the `model` command's `loop`): refused in band (the plugin, the
# permission gate), it answers in the same run; stopped, it answers the feedback.
CALLS = 30
# What the sandbox's config says when the monitor answers permission requests (1.x).
ASK_EVERY_CALL = {"*": "ask"}
# The same for a 2.x session, given as it is created (V2-REAL-NOTES.md section 5).
ASK_EVERY_CALL_2 = ({"action": "*", "resource": "*", "effect": "ask"},)
# A real model takes time to answer; without any, the race between the abort and the next
# call is not one a real loop runs.
MODEL_DELAY = 0.2
STORY = "read README.md, then run `ls`, again and again"
# In a dry run nobody tells the model anything: its last words must not answer feedback.
DRY_RUN_ANSWER = "That was the last call of my script."

REST_TIMEOUT = 30.0
HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
CONNECT_TIMEOUT = 30.0
RUN_TIMEOUT = 60.0
# How long a log record may trail the server event it is about (the abort call's answer).
RECORD_GRACE = 5.0
SUMMARY_WIDTH = 60
FEEDBACK_WIDTH = 200


@dataclass(frozen=True, slots=True)
class Edition:
    """An OpenCode release the demo shows the story on, and what npm's install of it takes."""

    release: Release
    size: str


# By the major version `demo --opencode` takes.
EDITIONS = {
    "1": Edition(RELEASE_1, "about 354 MB"),
    "2": Edition(RELEASE_2, "about 480 MB"),
}


class DemoError(MonitorError):
    """The demo could not show the monitor at work; the message says why."""


def run_demo(
    settings: Settings,
    cache_dir: Path,
    out: TextIO = sys.stdout,
    plugin: bool = False,
    opencode: str = "1",
) -> int:
    """The `demo` command: 0 when the loop was caught and handled, 1 when the demo failed;
    on the OpenCode of `EDITIONS[opencode]`."""
    edition = EDITIONS[opencode]
    release = edition.release
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        log_path = cache_dir / LOG_NAME
        _say(
            out,
            f"{PREFIX}: finding opencode {release.version} (if needed, npm installs "
            f"{release.spec} into {release.install_folder(cache_dir)}: {edition.size}, once)",
        )
        binary = find_or_install_opencode(cache_dir, release)
        _say(out, f"{PREFIX}: using {binary}")
        with log_path.open("w", encoding="utf-8") as log_file:
            printer = Printer(out, release)
            configure_logging(
                settings.log_format, settings.log_level, log_file, printer.monitor_record
            )
            summary = asyncio.run(_demo(settings, release, binary, printer, log_path, plugin))
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the context managers have stopped the server and the model.
        print(f"{PREFIX}: interrupted; everything it started is stopped", file=sys.stderr)
        raise
    except (SandboxError, DemoError, ServerError, OSError, aiohttp.ClientError) as error:
        # ServerError: a REST call failed; OSError includes TimeoutError: a session that did
        # not finish in time.
        reason = str(error) or type(error).__name__
        print(f"{PREFIX}: failed: {reason}", file=sys.stderr, flush=True)
        return EX_FAILED
    _say(out, f"{summary} Everything stopped.")
    return EX_OK


def _say(out: TextIO, line: str) -> None:
    print(line, file=out, flush=True)


def _clip(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _call_summary(tool: str, args: Mapping[str, Any], directory: str | None) -> str:
    """A few words on what a call does; the demo's own calls hold nothing secret. 1.x's
    `read {filePath}` and `bash`, 2.x's `read {path}` and `shell`."""
    if tool == "read":
        path = str(args.get("filePath", args.get("path", "")))
        if directory and path.startswith(directory.rstrip("/") + "/"):
            path = path[len(directory.rstrip("/")) + 1 :]
        return _clip(path, SUMMARY_WIDTH)
    if tool in ("bash", "shell"):
        return _clip(str(args.get("command", "")), SUMMARY_WIDTH)
    return ""


class Printer:
    """Turns server events and monitor log records into lines for a person, as they come.

    It also keeps what the demo waits on: the monitor's stream connection, its detection,
    the feedback and the model's answer. The server's frames are read by its release's
    reader (`Frames1`, `Frames2`), which tells the printer what happened in the story's
    words: a call, the run aborted or failed, the feedback, the model's answer.
    """

    def __init__(self, out: TextIO, release: Release = RELEASE_1) -> None:
        self.out = out
        self.session_id: str | None = None
        self.directory: str | None = None
        self.server_connected = asyncio.Event()
        self.monitor_connected = asyncio.Event()
        self.detected = asyncio.Event()
        self.feedback_done = asyncio.Event()
        self.answered = asyncio.Event()
        self.detection: dict[str, Any] | None = None
        self.feedback_error: str | None = None
        # A call's key (the part id the monitor names it by) -> call number, in the order
        # they started.
        self.calls: dict[str, int] = {}
        self._frames: Frames = Frames2(self) if release == RELEASE_2 else Frames1(self)
        # The server reports the abort before the monitor logs its detection (the record
        # waits for the abort call's answer): the abort line waits for the detection line.
        self._abort_line: str | None = None
        # The plugin asks before the stream shows the call: a detection of a call not yet
        # shown waits for that call's line (number, line), so the refused call never reads
        # as if it ran after its refusal.
        self._detection_line: tuple[int, str] | None = None

    def say(self, line: str) -> None:
        self._flush()
        _say(self.out, line)

    def _flush(self) -> None:
        for waiting in (self._detection_line and self._detection_line[1], self._abort_line):
            if waiting is not None:
                _say(self.out, waiting)
        self._detection_line = self._abort_line = None

    def monitor_record(self, record: Mapping[str, Any]) -> None:
        event = record.get("event")
        if event == "stream.connected":
            self.monitor_connected.set()
        elif event == "stream.disconnected":
            self.say(f"monitor: lost the event stream ({record.get('reason')}), reconnecting")
        elif event == "intervention.outcome" and record.get("session_id") == self.session_id:
            self._detected(record)
        elif event == "feedback.sent" and record.get("session_id") == self.session_id:
            self.feedback_done.set()
        elif event == "feedback.failed" and record.get("session_id") == self.session_id:
            self.feedback_error = str(record.get("error"))
            self.say(f"monitor: could not send the feedback: {self.feedback_error}")
            self.feedback_done.set()

    def _detected(self, record: Mapping[str, Any]) -> None:
        if self.detection is None:
            self.detection = dict(record)
        call = self.calls.get(str(record.get("part_id")), record.get("call_index"))
        outcome = record.get("outcome")
        done = {
            "rejected": f"its permission refused ({record.get('reply_ms')} ms): it never ran",
            "blocked": "refused in band by the plugin: it never ran",
            "aborted": f"session aborted ({record.get('abort_ms')} ms)",
            "held": "session aborted and put on hold for a person",
            "dry_run": "dry run, so the session goes on",
            "abort_failed": f"the abort failed ({record.get('error')})",
        }.get(str(outcome), str(outcome))
        # The record says what was found as the finding describes itself.
        line = f"monitor: loop detected on call {call}: {record['finding']}; {done}"
        if isinstance(call, int) and call > len(self.calls):
            self._detection_line = (call, line)
        else:
            _say(self.out, line)
            self._flush()
        self.detected.set()

    def server_frame(self, frame: object) -> None:
        """One decoded frame of the server's event stream."""
        self._frames.read(frame)

    # What the readers tell, in the story's words.

    def call(self, key: str, tool: str, args: Mapping[str, Any]) -> None:
        """A call of the session runs (said once per `key`)."""
        if key in self.calls:
            return
        number = self.calls[key] = len(self.calls) + 1
        summary = _call_summary(tool, args, self.directory)
        line = f"  call {number:<2}  {tool:<5}  {summary}".rstrip()
        if self._detection_line is not None and self._detection_line[0] == number:
            _say(self.out, line)  # then its detection, which waited for it
            self._flush()
        else:
            self.say(line)

    def run_ended(self, line: str, aborted: bool) -> None:
        """The run was aborted (said after the detection that caused it) or failed."""
        if aborted and self.detection is None:
            self._abort_line = line
        else:
            self.say(line)

    def feedback(self, text: str) -> None:
        """A user message after the script: the only one is the monitor's feedback."""
        first = _clip(text.split("\n\n")[0], FEEDBACK_WIDTH)
        if (self.detection or {}).get("outcome") == "held":
            # Stored without a run: no model reads it until a person answers.
            self.say(f'monitor: feedback stored in the session for a person: "{first}"')
        else:
            self.say(f'monitor: feedback sent to the model: "{first}"')

    def answer(self, text: str) -> None:
        self.say(f'model: "{_clip(text, FEEDBACK_WIDTH)}"')
        self.answered.set()


class Frames(Protocol):
    def read(self, frame: object) -> None: ...


class Frames1:
    """1.x frames (`{type, properties}` of `/event`): calls are tool parts, the feedback a
    user message's text part, the answer an assistant's text part once it has ended."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self._roles: dict[str, str] = {}  # message id -> user or assistant
        self._first_user: str | None = None
        self._texts_shown: set[str] = set()

    def read(self, frame: object) -> None:
        printer = self.printer
        if not isinstance(frame, dict):
            return
        kind = frame.get("type")
        props = frame.get("properties")
        if not isinstance(props, dict):
            return
        if kind == "server.connected":
            printer.server_connected.set()
        elif props.get("sessionID") != printer.session_id or printer.session_id is None:
            return
        elif kind == "message.updated":
            self._message(props.get("info") or {})
        elif kind == "message.part.updated":
            self._part(props.get("part") or {})
        elif kind == "session.error":
            name = (props.get("error") or {}).get("name", "unknown error")
            aborted = name == "MessageAbortedError"
            verb = "run aborted" if aborted else "run failed"
            printer.run_ended(f"server: {verb} ({name})", aborted)

    def _message(self, info: Mapping[str, Any]) -> None:
        message_id, role = info.get("id"), info.get("role")
        if isinstance(message_id, str) and isinstance(role, str):
            self._roles[message_id] = role
            if role == "user" and self._first_user is None:
                self._first_user = message_id

    def _part(self, part: Mapping[str, Any]) -> None:
        if part.get("type") == "tool":
            state = part.get("state") or {}
            # A part is first sent as pending with empty input: show it once it runs.
            if state.get("status") != "pending":
                self.printer.call(
                    str(part.get("id")), str(part.get("tool")), state.get("input") or {}
                )
        elif part.get("type") == "text":
            self._text(part)

    def _text(self, part: Mapping[str, Any]) -> None:
        part_id, message_id = str(part.get("id")), part.get("messageID")
        role = self._roles.get(str(message_id))
        if part_id in self._texts_shown or message_id == self._first_user:
            return
        if role == "user":
            self._texts_shown.add(part_id)
            self.printer.feedback(str(part.get("text", "")))
        elif role == "assistant" and "end" in (part.get("time") or {}):
            self._texts_shown.add(part_id)
            self.printer.answer(str(part.get("text", "")))


class Frames2:
    """2.x frames (`{type, data}` of `/api/event`, V2-REAL-NOTES.md section 3): a call is
    named by `tool.input.started` and runs from `tool.called`, keyed as the monitor keys it
    (`assistantMessageID:id`); a user message is an inbox item (the first is the script);
    the answer is a text that ended; an interrupt ends the run."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self._tools: dict[str, str] = {}  # call key -> tool name
        self._users = 0

    def read(self, frame: object) -> None:
        printer = self.printer
        if not isinstance(frame, dict):
            return
        kind, data = frame.get("type"), frame.get("data")
        if not isinstance(data, dict):
            return
        if kind == "server.connected":
            printer.server_connected.set()
            return
        if printer.session_id is None or data.get("sessionID") != printer.session_id:
            return
        key = f"{data.get('assistantMessageID')}:{data.get('id')}"
        if kind == "session.tool.input.started":
            self._tools[key] = str(data.get("name"))
        elif kind == "session.tool.called":
            printer.call(key, self._tools.get(key, "?"), data.get("input") or {})
        elif kind == "session.inbox.enqueued":
            self._inbox(data.get("item") or {})
        elif kind == "session.text.ended":
            printer.answer(str(data.get("text", "")))
        elif kind == "session.execution.interrupted":
            printer.run_ended(f"server: run aborted ({kind})", aborted=True)
        elif kind in ("session.step.failed", "session.execution.failed"):
            error = data.get("error") or {}
            if error.get("type") != "aborted":  # an interrupt's, said by the line above
                printer.run_ended(f"server: run failed ({error.get('type', kind)})", False)

    def _inbox(self, item: Mapping[str, Any]) -> None:
        if item.get("type") != "user":
            return
        self._users += 1
        if self._users > 1:
            self.printer.feedback(str((item.get("payload") or {}).get("text", "")))


async def follow_events(
    http: aiohttp.ClientSession,
    url: str,
    printer: Printer,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Hand every frame of the server's event stream to the printer, until cancelled."""
    async with http.get(url, timeout=stream_timeout(), headers=headers) as response:
        if response.status != 200:
            raise DemoError(f"GET {url} answered {response.status}")
        decoder = SSEChunkDecoder()
        async for chunk in response.content.iter_any():
            for data in decoder.feed(chunk):
                try:
                    printer.server_frame(decode_frame(data))
                except FrameError:
                    continue
    raise DemoError("the server ended its event stream")


Record = list[dict[str, Any]]


class Sessions(Protocol):
    """What the story does with the server's sessions, in its release's routes."""

    async def create(self, title: str) -> str:
        """A new session of the project; its id."""
        ...

    async def prompt(self, session_id: str, text: str) -> None:
        """Post a user message; the model answers in the background."""
        ...

    async def run_ended(self, session_id: str, runs: int) -> Record:
        """The session's record once its `runs`-th run (1: the script's, 2: the one the
        feedback started) is over."""
        ...

    async def stored(self, session_id: str) -> Record:
        """The record of a held session, idle with the monitor's feedback stored for a
        person (no run took it)."""
        ...

    def calls(self, record: Record) -> list[tuple[str, str]]:
        """Each call that ran or was refused, in order: its key (the part id the monitor
        names it by) and its status (``completed``, ``error``, ...)."""
        ...


@dataclass(frozen=True, slots=True)
class Sessions1:
    client: ProjectClient

    async def create(self, title: str) -> str:
        return str((await self.client.create_session(title))["id"])

    async def prompt(self, session_id: str, text: str) -> None:
        await self.client.prompt_async(session_id, text)

    async def run_ended(self, session_id: str, runs: int) -> Record:
        # A run answers one user message: the second is the feedback.
        return await self.client.wait_idle(session_id, RUN_TIMEOUT, user_messages=runs)

    async def stored(self, session_id: str) -> Record:
        return await _wait_stored(self.client, session_id, user_messages=2)

    def calls(self, record: Record) -> list[tuple[str, str]]:
        return [(part["id"], part["state"]["status"]) for part in tool_parts(record)]


@dataclass(frozen=True, slots=True)
class Sessions2:
    client: ProjectClient2
    gated: bool  # whether every call asks permission (the monitor answers)

    async def create(self, title: str) -> str:
        rules = ASK_EVERY_CALL_2 if self.gated else None
        return str((await self.client.create_session(title, permissions=rules))["id"])

    async def prompt(self, session_id: str, text: str) -> None:
        await self.client.prompt(session_id, text)

    async def run_ended(self, session_id: str, runs: int) -> Record:
        return await self.client.wait_idle(session_id, RUN_TIMEOUT, runs=runs)

    async def stored(self, session_id: str) -> Record:
        # The hold's feedback went with `resume: false` (the monitor has said it was sent):
        # it waits in the session's inbox, and the interrupted run is the only one.
        return await self.client.wait_idle(session_id, RUN_TIMEOUT, runs=1)

    def calls(self, record: Record) -> list[tuple[str, str]]:
        return [
            (f"{item['id']}:{entry['id']}", entry["state"]["status"])
            for item in record
            if item.get("type") == "assistant"
            for entry in item.get("content", [])
            if entry.get("type") == "tool"
        ]


async def _demo(
    settings: Settings,
    release: Release,
    binary: Path,
    printer: Printer,
    log_path: Path,
    plugin: bool,
) -> str:
    if not plugin:
        return await _serve(settings, release, binary, printer, log_path, None)
    # Short: a Unix socket path holds at most 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="olm-demo-"))
    try:
        endpoint = PluginEndpoint(folder / "plugin.sock")
        settings = dataclasses.replace(settings, plugin_socket=str(endpoint.socket))
        return await _serve(settings, release, binary, printer, log_path, endpoint)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _server(
    settings: Settings,
    release: Release,
    binary: Path,
    model_url: str,
    port: int,
    plugin: PluginEndpoint | None,
) -> OpencodeServer | OpencodeServer2:
    if release == RELEASE_2:
        # Its permission rules go with each session (`Sessions2`).
        return OpencodeServer2(binary, model_url, port=port, plugin=plugin)
    permission = ASK_EVERY_CALL if _gated(settings) else NEVER_ASK
    return OpencodeServer(binary, model_url, port=port, permission=permission, plugin=plugin)


async def _serve(
    settings: Settings,
    release: Release,
    binary: Path,
    printer: Printer,
    log_path: Path,
    plugin: PluginEndpoint | None,
) -> str:
    async with ScriptedModel() as model:
        port = free_loopback_port()
        printer.say(
            f"{PREFIX}: starting opencode on http://127.0.0.1:{port}"
            " (isolated, with a scripted model: no network, no API key)"
        )
        async with _server(settings, release, binary, model.url, port, plugin) as server:
            printer.directory = server.directory
            try:
                return await _with_monitor(
                    _watched(settings, server), server, printer, log_path, plugin is not None
                )
            finally:
                printer.say("stopping the server, the model and the monitor")


def _watched(settings: Settings, server: IsolatedServer) -> Settings:
    """The user's detection and action settings, watching the sandbox's server and no other.

    No OpenCode 2 service a registration names (which a watch given no `--url` would follow)
    and no password of the user's: the sandbox's own, or none (1.x's has none). A 1.x monitor
    follows the project's `/event`; 2.x's one stream holds every project's.
    """
    password = server.env_extra.get("OPENCODE_SERVER_PASSWORD")
    directory = None if isinstance(server, OpencodeServer2) else server.directory
    return dataclasses.replace(
        settings,
        url=server.url,
        directory=directory,
        service=None,
        username="opencode",
        password=password,
    )


async def _with_monitor(
    settings: Settings,
    server: OpencodeServer | OpencodeServer2,
    printer: Printer,
    log_path: Path,
    plugin: bool,
) -> str:
    watch = Watch(settings, notifier=Notifier(None))
    timeout = aiohttp.ClientTimeout(total=REST_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, read_bufsize=READ_BUFSIZE) as http:
        sessions: Sessions
        if isinstance(server, OpencodeServer2):
            version = str(server.info.get("version", "(version unknown)"))
            url = f"{server.url}/api/event"
            sessions = Sessions2(server.client(http), _gated(settings))
        else:
            version = await _server_version(http, server.url)
            url = stream_url(server.url, server.directory)
            sessions = Sessions1(server.client(http))
        printer.say(f"  opencode {version} is up: pid {server.pid}, sandbox {server.root}")
        events = asyncio.create_task(follow_events(http, url, printer, server.headers))
        watching = asyncio.create_task(watch.run())
        story = asyncio.create_task(_story(sessions, settings, printer, log_path, plugin))
        tasks = {events, watching, story}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if story in done:
                return story.result()
            if events in done:
                events.result()  # raises why the stream ended
            watching.result()  # raises a fatal monitor error
            # The monitor stops early only on SIGINT or SIGTERM, which it caught for us.
            raise KeyboardInterrupt
        finally:
            watch.stop()
            for task in (events, story):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _server_version(http: aiohttp.ClientSession, url: str) -> str:
    try:
        async with http.get(f"{url}/global/health", timeout=HEALTH_TIMEOUT) as response:
            return str((await response.json())["version"])
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError):
        return "(version unknown)"


async def _story(
    sessions: Sessions, settings: Settings, printer: Printer, log_path: Path, plugin: bool
) -> str:
    """Start the looping session, follow it to its end, and sum it up."""
    try:
        await asyncio.wait_for(printer.server_connected.wait(), CONNECT_TIMEOUT)
        await asyncio.wait_for(printer.monitor_connected.wait(), CONNECT_TIMEOUT)
    except TimeoutError:
        raise DemoError("could not follow the server's event stream") from None
    printer.say(watching_line(settings, plugin, log_path))
    # Written in 1.x's words; the scripted model speaks 2.x's to a 2.x server.
    pattern = [
        ("read", {"filePath": f"{printer.directory}/README.md"}),
        ("bash", {"command": "ls", "description": "List the project's files"}),
    ]
    session_id = printer.session_id = await sessions.create("loop-monitor demo")
    printer.say(f"session {session_id}: the model is scripted to {STORY}")
    answer = DRY_RUN_ANSWER if settings.dry_run else DEFAULT_ANSWER
    loop = script(pattern, CALLS, delay=MODEL_DELAY, answer=answer, heed=True)
    await sessions.prompt(session_id, loop)

    first_run = asyncio.create_task(sessions.run_ended(session_id, 1))
    detected = asyncio.create_task(printer.detected.wait())
    try:
        await asyncio.wait({first_run, detected}, return_when=asyncio.FIRST_COMPLETED)
        if not detected.done():
            # The detection is logged once the abort call returned: it may trail the run's end.
            await asyncio.wait({detected}, timeout=RECORD_GRACE)
        if not detected.done():
            calls = len(sessions.calls(first_run.result()))  # raises if the run did not end
            raise DemoError(
                f"the monitor saw no loop in {calls} calls (with these detection settings "
                "the demo's 2-call cycle is not a loop)"
            )
        assert printer.detection is not None
        return await _after_detection(sessions, session_id, printer.detection, printer, first_run)
    finally:
        for task in (first_run, detected):
            task.cancel()


def _gated(settings: Settings) -> bool:
    """True when the server asks before every call and the monitor approves all but loops."""
    return settings.permissions == "approve" and not settings.dry_run


def watching_line(settings: Settings, plugin: bool, log_path: Path | str) -> str:
    """What the demo says of the monitor once it watches (README.md shows it)."""
    return (
        f"monitor: watching (cycles of up to {settings.max_period} calls, "
        f"{settings.repeats} repetitions; on a loop: {_on_loop(settings, plugin)}); "
        f"its log: {log_path}"
    )


def _on_loop(settings: Settings, plugin: bool) -> str:
    if settings.dry_run:
        return "log only (dry run)"
    if plugin:
        return "the plugin asks before every call; the loop's call is refused before it runs"
    if _gated(settings):
        return "approve every call but the loop's, refuse that one before it runs"
    if settings.on_loop == "hold":
        return "abort and hold"
    return "abort and tell the model"


async def _after_detection(
    sessions: Sessions,
    session_id: str,
    detection: Mapping[str, Any],
    printer: Printer,
    first_run: asyncio.Task[Record],
) -> str:
    outcome = detection["outcome"]
    if outcome == "abort_failed":
        raise DemoError(f"the monitor could not abort the session: {detection.get('error')}")
    if outcome == "dry_run":
        record = await first_run
    elif outcome in ("rejected", "blocked"):
        # No new message: the model read the refusal as the call's result and answers it.
        record = await first_run
        await _answered(printer)
    else:
        try:
            await asyncio.wait_for(printer.feedback_done.wait(), RUN_TIMEOUT)
        except TimeoutError:
            raise DemoError("the monitor never sent its feedback") from None
        if printer.feedback_error is not None:
            raise DemoError(f"the monitor could not send its feedback: {printer.feedback_error}")
        if outcome == "held":
            record = await sessions.stored(session_id)
        else:
            record = await sessions.run_ended(session_id, 2)
            await _answered(printer)
    return _summary(detection, sessions.calls(record))


async def _answered(printer: Printer) -> None:
    try:
        await asyncio.wait_for(printer.answered.wait(), RECORD_GRACE)
    except TimeoutError:
        raise DemoError("the model's answer never showed on the event stream") from None


async def _wait_stored(client: ProjectClient, session_id: str, user_messages: int) -> Record:
    """The messages once the session is idle with `user_messages` stored (a held session)."""

    async def stored() -> Record | None:
        if session_id in await client.status():
            return None
        messages = await client.messages(session_id)
        users = [m for m in messages if m["info"].get("role") == "user"]
        return messages if len(users) >= user_messages else None

    what = f"session {session_id} to store the feedback"
    return await until(stored, RUN_TIMEOUT, interval=0.1, what=what)


def _summary(detection: Mapping[str, Any], calls: list[tuple[str, str]]) -> str:
    """The story's last line, from the detection and the session's calls (key, status)."""
    keys = [key for key, _ in calls]
    if detection["outcome"] == "blocked":
        # Asked about before the stream showed it, the call is known by its place in the run.
        at = int(detection["call_index"])
    elif detection["part_id"] in keys:
        at = keys.index(detection["part_id"]) + 1
    else:
        raise DemoError("the call that completed the loop is not in the session")
    if not 0 < at <= len(calls):
        raise DemoError("the call that completed the loop is not in the session")
    ran = f"demo finished: {len(calls)} calls ran"
    if detection["outcome"] == "dry_run":
        return f"{ran}; the loop was detected on call {at} and left running (dry run)."
    if detection["outcome"] in ("rejected", "blocked"):
        stopped = calls[at - 1][1] == "error"
        made = f"demo finished: the model asked for {len(calls)} calls, {len(calls) - stopped} ran"
        return (
            f"{made}: call {at} completed the loop and was refused before it ran"
            f"{'' if stopped else ' (but the server ran it!)'}; the model went on."
        )
    after = len(calls) - at
    overshoot = "no call" if after == 0 else ("1 call" if after == 1 else f"{after} calls")
    return f"{ran}, the loop was stopped on call {at}, {overshoot} started after it."
