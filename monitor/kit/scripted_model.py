"""An OpenAI-compatible model that follows a script, for driving a real OpenCode server.

The script is the first user message of a conversation, a JSON object such as
``{"pattern": [["read", {"filePath": "README.md"}]], "calls": 8}`` (build it with
`script`). The model answers every step of that conversation from the script alone, so
one model serves any number of sessions and needs no per-test setup:

- ``pattern``: ``[tool, args]`` pairs; the i-th tool call is ``pattern[i % len(pattern)]``
  with call id ``call_{i}``, so ids repeat across sessions as they do with local models.
- ``calls``: how many tool calls to make before answering with text.
- ``parallel``: tool calls per model step (default 1); a step of several identical calls is
  what OpenCode's own `doom_loop` check reacts to.
- ``delay``: seconds to wait before each response, to simulate model latency.
- ``answer``: the text of the final answer.
- ``after_feedback``: what to do once a later user message (a monitor's feedback) arrived:
  ``"answer"`` replies with the answer text, ``"loop"`` runs the pattern again from its
  start, counting tool results after that last user message.
- ``heed``: a call refused in band (its result carries the monitor's feedback, `MARK`: the
  plugin's refusal, or a refused permission request) is heeded: the model answers with the
  answer text at its next step, in the same run. Without it, a refusal is one more tool
  result and the pattern goes on (what most tests of repeated refusals need).
- ``repeat``: the answer is its text this many times over (a model stuck repeating itself).
- ``reasoning``, ``reasoning_repeat``: reasoning streamed before the answer, as
  ``delta.reasoning_content`` (what ``@ai-sdk/openai-compatible`` makes reasoning parts of).
- ``say``, ``think``: text and reasoning streamed before each tool call, so every step of a
  run carries the same assistant text.
- ``chunk``, ``chunk_delay``: stream text and reasoning in deltas of ``chunk`` characters,
  ``chunk_delay`` seconds apart (0: each in one delta), as a model generating tokens does.
- ``compact_after``: the step that makes the n-th tool call reports a usage of
  `OVERFLOW_TOKENS`, past any context limit, so a server whose model config has a ``limit``
  compacts the session after that call (once per conversation). OpenCode then asks for a
  summary (a request with no tools) and goes on from it alone, without the prompt: the
  model's summary is the script itself, and it follows that on after the compaction, its
  ``calls`` counting those made before it.
- ``nest``: each call's arguments also carry ``"nested"``, a value nested this many levels
  deep (arrays around a 1), written as text: past the depth `json.loads` reads, as an MCP
  tool's arguments can be (issue 46).
- ``fill``: each string argument that reads ``FILL`` is written as this many characters (a
  call too large for the plugin to send the monitor, issue 43) while the script in the
  prompt stays small.

One script serves both server releases: a call is written in the words of either (1.x
``read {filePath}``, ``bash {command, description}``; 2.x ``read {path}``, ``shell {command}``)
and spoken in those of the server that asks, as its request's tool definitions show
(`OfferedTools`). A 1.x server offers ``bash`` and ``read {filePath}``, so a script written for
it goes out unchanged there; 2.2.5 offers ``shell`` and ``read {path}`` (its ``read`` refuses
``filePath``).

Requests that carry no script or no tools (OpenCode's title generation) get a short text.
Served for a person (`opencode-loop-monitor model`, `on_demand`), a prompt that is no script
loops when it asks for a loop in words, one behaviour per story docs/usage.md tells:
``loop`` reads README.md and lists the folder until stopped, then heeds the monitor (answers
its refusal in the same run, or its feedback after an abort); ``escalate`` ignores every
refusal and feedback and loops on, until the monitor holds the session. Any other prompt is
answered with a line saying so.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

from monitor.core.feedback import MARK

__all__ = [
    "DEFAULT_ANSWER",
    "ModelRequest",
    "OVERFLOW_TOKENS",
    "OfferedTools",
    "ON_DEMAND_ANSWER",
    "ParallelCalls",
    "ScriptedModel",
    "Text",
    "ToolCall",
    "UNSCRIPTED_ANSWER",
    "decide",
    "find_script",
    "on_demand_script",
    "script",
]

DEFAULT_ANSWER = "Understood. I will stop repeating and change approach."
# Prompt tokens reported by the step of `compact_after`: past any context limit a test sets.
OVERFLOW_TOKENS = 1_000_000
UNSCRIPTED_ANSWER = "Scripted session"
# The largest request body served: a conversation of a few `fill` calls.
MAX_REQUEST = 256 * 1024 * 1024
# What a prompt in words gets from a model served on demand: the demo's loop (read a file,
# list the folder, 12 calls) heeding the monitor, the same ignoring it, or this answer.
ON_DEMAND_PATTERN = (("read", {"filePath": "README.md"}), ("bash", {"command": "ls"}))
ON_DEMAND_ANSWER = (
    "I am the scripted model of opencode-loop-monitor: write `loop` and I loop (read "
    "README.md, run ls, again and again) until the monitor stops me, then answer it; "
    "`escalate` and I ignore every refusal and feedback and loop on, until the session is "
    "held."
)

AfterFeedback = Literal["answer", "loop"]


def script(
    pattern: Sequence[tuple[str, Mapping[str, Any]] | list[Any]],
    calls: int,
    *,
    delay: float = 0.0,
    answer: str = DEFAULT_ANSWER,
    after_feedback: AfterFeedback = "answer",
    repeat: int = 1,
    reasoning: str = "",
    reasoning_repeat: int = 1,
    say: str = "",
    think: str = "",
    chunk: int = 0,
    chunk_delay: float = 0.0,
    parallel: int = 1,
    compact_after: int = 0,
    heed: bool = False,
    nest: int = 0,
    fill: int = 0,
) -> str:
    """The prompt text that makes the scripted model follow this script."""
    body: dict[str, Any] = {
        "pattern": [[tool, dict(args)] for tool, args in pattern],
        "calls": calls,
    }
    if delay:
        body["delay"] = delay
    if answer != DEFAULT_ANSWER:
        body["answer"] = answer
    if after_feedback != "answer":
        body["after_feedback"] = after_feedback
    # Only what differs from the defaults, so older scripts read the same.
    optional = {
        "repeat": (repeat, 1),
        "reasoning": (reasoning, ""),
        "reasoning_repeat": (reasoning_repeat, 1),
        "say": (say, ""),
        "think": (think, ""),
        "chunk": (chunk, 0),
        "chunk_delay": (chunk_delay, 0.0),
        "parallel": (parallel, 1),
        "compact_after": (compact_after, 0),
        "heed": (heed, False),
        "nest": (nest, 0),
        "fill": (fill, 0),
    }
    body.update({key: value for key, (value, default) in optional.items() if value != default})
    return json.dumps(body)


@dataclass(frozen=True, slots=True)
class Script:
    pattern: tuple[tuple[str, dict[str, Any]], ...]
    calls: int
    delay: float = 0.0
    answer: str = DEFAULT_ANSWER
    after_feedback: AfterFeedback = "answer"
    repeat: int = 1
    reasoning: str = ""
    reasoning_repeat: int = 1
    say: str = ""
    think: str = ""
    chunk: int = 0
    chunk_delay: float = 0.0
    parallel: int = 1
    compact_after: int = 0
    heed: bool = False
    nest: int = 0
    fill: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        pattern = tuple((str(tool), dict(args)) for tool, args in data["pattern"])
        after_feedback = data.get("after_feedback", "answer")
        parallel = int(data.get("parallel", 1))
        if not pattern or after_feedback not in ("answer", "loop") or parallel < 1:
            raise ValueError(f"not a usable script: {data!r}")
        return cls(
            pattern=pattern,
            calls=int(data["calls"]),
            delay=float(data.get("delay", 0.0)),
            answer=str(data.get("answer", DEFAULT_ANSWER)),
            after_feedback=after_feedback,
            repeat=int(data.get("repeat", 1)),
            reasoning=str(data.get("reasoning", "")),
            reasoning_repeat=int(data.get("reasoning_repeat", 1)),
            say=str(data.get("say", "")),
            think=str(data.get("think", "")),
            chunk=int(data.get("chunk", 0)),
            chunk_delay=float(data.get("chunk_delay", 0.0)),
            parallel=parallel,
            compact_after=int(data.get("compact_after", 0)),
            heed=data.get("heed", False) is True,
            nest=int(data.get("nest", 0)),
            fill=int(data.get("fill", 0)),
        )


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    tool: str
    args: dict[str, Any]
    text: str = ""  # streamed before the call
    reasoning: str = ""
    nest: int = 0  # Script.nest
    fill: int = 0  # Script.fill

    def arguments(self) -> str:
        """The arguments as the model writes them: JSON text, with `nest` levels of nesting
        under "nested" (as text: `json.dumps` would recurse that deep), and each "FILL"
        written as `fill` characters."""
        text = json.dumps(self.args)
        if self.fill:
            text = text.replace('"FILL"', '"' + "x" * self.fill + '"')
        if not self.nest:
            return text
        nested = f'"nested": {"[" * self.nest}1{"]" * self.nest}'
        return f"{text[:-1]}, {nested}}}" if self.args else f"{{{nested}}}"


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class ParallelCalls:
    """Several tool calls in one model step."""

    calls: tuple[ToolCall, ...]


Reply = ToolCall | ParallelCalls | Text

# The same tool, and the same argument, under each release's name (1.x <-> 2.x).
TOOL_NAMES = {"bash": "shell", "shell": "bash"}
ARGUMENT_NAMES = {"filePath": "path", "path": "filePath"}


@dataclass(frozen=True, slots=True)
class OfferedTools:
    """The tools a chat completion request offers, each with the arguments it takes: which
    server asks, in the only words the model hears from it."""

    arguments: Mapping[str, frozenset[str]]

    @classmethod
    def of_request(cls, tools: Any) -> Self:
        """From the request's ``tools`` (``[{"type": "function", "function": {...}}]``)."""
        offered: dict[str, frozenset[str]] = {}
        for tool in tools if isinstance(tools, list) else []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                properties = (function.get("parameters") or {}).get("properties") or {}
                offered[function["name"]] = frozenset(properties)
        return cls(offered)

    def speak(self, reply: Reply) -> Reply:
        """The reply with each call in this server's words."""
        if isinstance(reply, ToolCall):
            return self._call(reply)
        if isinstance(reply, ParallelCalls):
            return ParallelCalls(tuple(self._call(call) for call in reply.calls))
        return reply

    def _call(self, call: ToolCall) -> ToolCall:
        # Only what the server does not offer is renamed: a script in this server's words
        # goes out as written, also an argument it gets wrong on purpose.
        name = call.tool
        if name not in self.arguments and TOOL_NAMES.get(name) in self.arguments:
            name = TOOL_NAMES[name]
        takes = self.arguments.get(name)
        if not takes:
            return call if name == call.tool else replace(call, tool=name)
        args: dict[str, Any] = {}
        for key, value in call.args.items():
            if key in takes:
                args[key] = value
            elif (other := ARGUMENT_NAMES.get(key)) in takes and other not in call.args:
                args[other] = value
            elif name == call.tool:
                args[key] = value
            # Else an argument only the other release's tool takes (bash's `description`):
            # 2.2.5's tools refuse any argument they do not know.
        return replace(call, tool=name, args=args)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request the model answered, for tests to inspect."""

    at: float  # time.monotonic() when the request arrived
    conversation: str  # the user message holding the script (also for titles), else the first
    last_user: str  # text of the last user message: differs once feedback was injected
    scripted: bool  # False for requests answered with the unscripted text (titles etc.)
    reply: Reply


def on_demand_script(text: str) -> Script | None:
    """The loop a prompt in words asks for (see the module's docstring), or None."""
    words = set(re.findall(r"[a-z]+", text.lower()))
    if "escalate" in words:
        return Script(ON_DEMAND_PATTERN, 12, delay=0.5, after_feedback="loop")
    if "loop" in words:
        return Script(ON_DEMAND_PATTERN, 12, delay=0.5, heed=True)
    return None


def find_script(text: str) -> Script | None:
    """The script inside a user message, which may be JSON-quoted or wrapped in other text."""
    decoded: Any = text
    # OpenCode clients may send the prompt JSON-quoted; peel off quoting layers first.
    while isinstance(decoded, str):
        try:
            decoded = json.loads(decoded)
        except ValueError:
            break
    if isinstance(decoded, dict):
        return _script_or_none(decoded)
    if isinstance(decoded, str):
        return _first_embedded_script(decoded)
    return None


def _first_embedded_script(text: str) -> Script | None:
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            candidate, _ = decoder.raw_decode(text, start)
        except ValueError:
            candidate = None
        if isinstance(candidate, dict) and (found := _script_or_none(candidate)):
            return found
        start = text.find("{", start + 1)
    return None


def _script_or_none(data: Mapping[str, Any]) -> Script | None:
    try:
        return Script.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None


def _message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _since_last_user(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    user_indexes = [i for i, message in enumerate(messages) if message.get("role") == "user"]
    return messages[user_indexes[-1] + 1 :] if user_indexes else messages


def calls_done(messages: Sequence[Mapping[str, Any]]) -> int:
    """How far this run of the pattern has got: each finished tool call comes back as one
    `tool` message, counted since the last user message."""
    return sum(1 for message in _since_last_user(messages) if message.get("role") == "tool")


def refused(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a call of this run was refused in band: its result carries the monitor's
    feedback (the plugin's refusal, or the reason a permission request was refused)."""
    return any(
        message.get("role") == "tool" and MARK in _message_text(message)
        for message in _since_last_user(messages)
    )


def decide(script_: Script, messages: Sequence[Mapping[str, Any]], before: int = 0) -> Reply:
    """The next step of a scripted conversation, from the messages sent so far (`before`:
    the calls made before a compaction, which the messages no longer hold)."""
    user_indexes = [i for i, message in enumerate(messages) if message.get("role") == "user"]
    feedback_arrived = len(user_indexes) > 1
    if feedback_arrived and script_.after_feedback == "answer":
        return Text(script_.answer)
    if script_.heed and refused(messages):
        return Text(script_.answer)
    done = before + calls_done(messages)
    if done >= script_.calls:
        return Text(script_.answer * script_.repeat, script_.reasoning * script_.reasoning_repeat)
    calls = tuple(
        ToolCall(
            f"call_{index}",
            *script_.pattern[index % len(script_.pattern)],
            script_.say,
            script_.think,
            script_.nest,
            script_.fill,
        )
        for index in range(done, min(done + script_.parallel, script_.calls))
    )
    return calls[0] if len(calls) == 1 else ParallelCalls(calls)


def _embedded_script(text: str) -> str | None:
    """The JSON text of the first script with `compact_after` inside `text`, as written."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            candidate, end = decoder.raw_decode(text, start)
        except ValueError:
            candidate = None
        if isinstance(candidate, dict):
            found = _script_or_none(candidate)
            if found is not None and found.compact_after:
                return text[start:end]
        start = text.find("{", start + 1)
    return None


@dataclass(frozen=True, slots=True)
class Compacted:
    """Where a conversation OpenCode compacted stands: its prompt (the summary, which is the
    script), the messages since the summary, and the calls made before the compaction."""

    prompt: str
    script: Script
    messages: Sequence[Mapping[str, Any]]
    before: int


def compacted(messages: Sequence[Mapping[str, Any]]) -> Compacted | None:
    """Where a conversation stands after a compaction: its summary (the first assistant
    message) is a script with `compact_after`, followed from the server's "continue" (the
    user message after it) on; a later user message that is a script of its own is a new
    task, followed from there with no calls before it."""
    summary = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if summary is None:
        return None
    text = _message_text(messages[summary])
    found = find_script(text) if _embedded_script(text) is not None else None
    if found is None:
        return None
    rest = messages[summary + 1 :]
    for index in range(len(rest) - 1, -1, -1):
        prompt = _message_text(rest[index]) if rest[index].get("role") == "user" else ""
        task = find_script(prompt) if prompt else None
        if task is not None:
            return Compacted(prompt, task, rest[index:], 0)
    # The user messages after the "continue" are feedback, as after a prompt.
    first_user = next((i for i, m in enumerate(rest) if m.get("role") == "user"), 0)
    return Compacted(text, found, rest[first_user:], found.compact_after)


def _chunk(
    completion_id: str,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None,
    usage: Mapping[str, int] | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = dict(usage)
    return f"data: {json.dumps(body)}\n\n".encode()


def _pieces(text: str, size: int) -> list[str]:
    if not text:
        return []
    if size <= 0:
        return [text]
    return [text[start : start + size] for start in range(0, len(text), size)]


def _stream_chunks(reply: Reply, model: str, size: int = 0, tokens: int = 0) -> list[bytes]:
    """The SSE frames of one streamed answer, ending with ``[DONE]``: reasoning, then text
    (each in pieces of `size` characters), then the tool call if any; `tokens`: the prompt
    tokens its usage reports (0: no usage)."""
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    # Parallel calls stream no text of their own: the first call's words go first.
    first = reply.calls[0] if isinstance(reply, ParallelCalls) else reply
    deltas: list[dict[str, Any]] = [
        {"reasoning_content": piece} for piece in _pieces(first.reasoning, size)
    ]
    deltas += [{"content": piece} for piece in _pieces(first.text, size)]
    if isinstance(reply, Text):
        finish_reason = "stop"
    else:
        # One chunk per call, as models stream them: OpenCode then takes each call in turn.
        calls = reply.calls if isinstance(reply, ParallelCalls) else (reply,)
        deltas += [
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.tool, "arguments": call.arguments()},
                    }
                ],
            }
            for index, call in enumerate(calls)
        ]
        finish_reason = "tool_calls"
    if not deltas:
        deltas.append({"content": ""})
    deltas[0] = {"role": "assistant", **deltas[0]}
    usage = {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
    return [
        *(_chunk(completion_id, model, delta, None) for delta in deltas),
        _chunk(completion_id, model, {}, finish_reason, usage if tokens else None),
        b"data: [DONE]\n\n",
    ]


@dataclass
class ScriptedModel:
    """The scripted model served on a free loopback port; use as an async context manager."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: a free one
    # Prompts in words loop when they ask to (`on_demand_script`); other prompts that are no
    # script get ON_DEMAND_ANSWER rather than nothing the person could act on.
    on_demand: bool = False
    # Told of every answer as it is given (`opencode-loop-monitor model` prints them).
    on_reply: Callable[[ModelRequest], None] | None = None
    requests: list[ModelRequest] = field(default_factory=list, init=False)
    _runner: web.AppRunner | None = field(default=None, init=False, repr=False)
    _port: int | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """Base URL for OpenAI-compatible clients, ending in ``/v1``."""
        if self._port is None:
            raise RuntimeError("scripted model is not running")
        return f"http://{self.host}:{self._port}/v1"

    def steps(self, prompt: str) -> list[ModelRequest]:
        """The scripted requests of every conversation this prompt started, oldest first."""
        return [r for r in self.requests if r.scripted and r.conversation == prompt]

    async def start(self) -> None:
        # A conversation holds every call made so far: a `fill` script's 5 MB calls go past
        # aiohttp's 1 MiB default, which answers 413 (OpenCode takes that for a context
        # overflow and compacts).
        app = web.Application(client_max_size=MAX_REQUEST)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()  # a port in use: nothing is left half started
            self._runner = None
            raise
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._port = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            # OpenCode streams every request, the title request included.
            raise web.HTTPBadRequest(text="the scripted model only answers stream: true")
        messages: list[dict[str, Any]] = body.get("messages", [])
        users = [_message_text(m) for m in messages if m.get("role") == "user"]
        script_ = self._script_of(users[0]) if users and body.get("tools") else None
        after = compacted(messages) if script_ is None and body.get("tools") else None
        tokens = 0
        summary = None if body.get("tools") else _embedded_script("\n".join(users))
        if script_ is not None:
            conversation, reply = users[0], decide(script_, messages)
            if script_.compact_after and _reaches(reply, calls_done(messages), script_):
                tokens = OVERFLOW_TOKENS
        elif after is not None:
            script_ = after.script
            conversation, reply = after.prompt, decide(script_, after.messages, after.before)
        elif summary is not None:
            # OpenCode's request for a summary: the script, so that the model follows it on.
            conversation, reply = summary, Text(summary)
        elif self.on_demand and users and body.get("tools"):
            conversation, reply = users[0], Text(ON_DEMAND_ANSWER)
        else:
            # Title generation offers no tools; its first user message is its own instruction
            # and the user's script follows it.
            conversation, reply = _first_script_text(users), Text(UNSCRIPTED_ANSWER)
        reply = OfferedTools.of_request(body.get("tools")).speak(reply)
        answered = ModelRequest(
            at=time.monotonic(),
            conversation=conversation,
            last_user=users[-1] if users else "",
            scripted=script_ is not None,
            reply=reply,
        )
        self.requests.append(answered)
        if self.on_reply is not None:
            self.on_reply(answered)
        if script_ is not None and script_.delay:
            await asyncio.sleep(script_.delay)
        size, gap = (script_.chunk, script_.chunk_delay) if script_ is not None else (0, 0.0)
        frames = _stream_chunks(reply, str(body.get("model", "looper")), size, tokens)
        return await _stream(request, frames, gap)

    def _script_of(self, prompt: str) -> Script | None:
        found = find_script(prompt)
        if found is None and self.on_demand:
            found = on_demand_script(prompt)
        return found


def _reaches(reply: Reply, done: int, script_: Script) -> bool:
    """Whether this step makes the `compact_after`-th call of a conversation not compacted."""
    made = (
        len(reply.calls) if isinstance(reply, ParallelCalls) else int(isinstance(reply, ToolCall))
    )
    return done < script_.compact_after <= done + made


def _first_script_text(users: Sequence[str]) -> str:
    """The user message that names an unscripted request's conversation."""
    for text in users:
        if find_script(text) is not None:
            return text
    return users[0] if users else ""


async def _stream(
    request: web.Request, frames: list[bytes], gap: float = 0.0
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await response.prepare(request)
        for index, frame in enumerate(frames):
            if gap and index:
                await asyncio.sleep(gap)
            await response.write(frame)
        await response.write_eof()
    except ConnectionResetError:
        pass  # OpenCode hung up: the session was aborted while the model "thought".
    return response
