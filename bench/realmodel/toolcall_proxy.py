"""A lenient tool-call parser between OpenCode and llama-server (OpenAI-compatible, streaming).

Qwen2.5-Coder-0.5B-Instruct knows which tool to call but writes the call as bare JSON or in a
```json fence, never inside the <tool_call> tags its chat template asks for; llama-server (this
llama.cpp build) only turns tagged calls into `tool_calls`. Older llama.cpp and other local
runtimes accept such JSON; this proxy does the same and nothing more:

- text is streamed through live until a possible call starts ("{", "```" or "<tool_call>");
  from there it is held to the end of the step;
- at the end, every JSON object in the held text with a string "name" and an "arguments" (or
  "parameters") object becomes one entry of `tool_calls` (finish_reason "tool_calls"); held
  text without such an object is sent on as text;
- calls that llama-server parsed itself, reasoning, usage and requests without tools pass
  through unchanged.

The model's own words and choices are never changed or chosen: only the wire format. Every step
is logged (raw model text, parsed calls, llama-server timings) as JSON lines.

Run (bench/realmodel/run.py starts it with the model venv's Python, which has aiohttp):
  python toolcall_proxy.py LISTEN_PORT UPSTREAM_URL LOG_FILE
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

TRIGGERS = ("<tool_call>", "```", "{")


def find_calls(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    calls, i = [], 0
    while (i := text.find("{", i)) != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters"))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    args = None
            if isinstance(args, dict):
                calls.append({"name": obj["name"], "arguments": args})
                i = end
                continue
        i += 1  # not a call: look inside it too ({"tool_call": {...}})
    return calls


def verdict(held: str) -> str:
    """Whether held text starting at a trigger is a tool call: "call", "text" or "unsure"."""
    s = held.lstrip()
    if s.startswith("<tool_call>"):
        s = s[len("<tool_call>") :].lstrip()
    elif "<tool_call>".startswith(s):
        return "unsure"
    if s.startswith("```"):
        rest = s[3:]
        nl = rest.find("\n")
        if nl == -1:
            return "unsure" if len(rest) < 12 else "text"
        if rest[:nl].strip() not in ("", "json"):
            return "text"
        s = rest[nl + 1 :].lstrip()
    elif "```".startswith(s):
        return "unsure"
    if not s:
        return "unsure"
    if s[0] != "{":
        return "text"
    s = s[1:].lstrip()
    if not s or '"name"'.startswith(s):
        return "unsure"
    return "call" if s.startswith('"name"') else "text"


class Splitter:
    """Streams text live and holds from the start of a tool call to the end of the step."""

    def __init__(self) -> None:
        self.mode, self.held = "live", ""
        self.state: dict[str, Any] = {}

    def feed(self, piece: str) -> str:
        self.held += piece
        out = ""
        while True:
            if self.mode == "call":
                return out
            if self.mode == "live":
                now, self.held, found = split_live(self.held)
                out += now
                if not found:
                    return out
                self.mode = "check"
            v = verdict(self.held)
            if v == "call":
                self.mode = "call"
                return out
            if v == "unsure":
                return out
            out, self.held, self.mode = out + self.held[0], self.held[1:], "live"


def split_live(text: str) -> tuple[str, str, bool]:
    """(text to send now, text to keep, whether a possible call has started)."""
    idx = min((j for t in TRIGGERS if (j := text.find(t)) != -1), default=-1)
    if idx != -1:
        return text[:idx], text[idx:], True
    # Keep a tail that could be the start of a trigger split across chunks.
    for t in ("<tool_call>", "```"):
        for k in range(len(t) - 1, 0, -1):
            if text.endswith(t[:k]):
                return text[:-k], text[-k:], False
    return text, "", False


class Proxy:
    def __init__(self, upstream: str, log_path: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.log_path = log_path
        self.http: ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        self.http = ClientSession(timeout=ClientTimeout(total=None, sock_read=900))

    async def stop(self, app: web.Application) -> None:
        if self.http:
            await self.http.close()

    def log(self, record: dict[str, Any]) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert self.http is not None
        t0 = time.time()
        tools = body.get("tools") or []
        if not body.get("stream") or not tools:
            async with self.http.post(f"{self.upstream}/v1/chat/completions", json=body) as up:
                resp = web.StreamResponse(
                    status=up.status,
                    headers={"Content-Type": up.headers.get("Content-Type", "application/json")},
                )
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        async def send(obj: Any) -> None:
            data = obj if obj == "[DONE]" else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        splitter = Splitter()
        base: dict[str, Any] = {}
        try:
            await self.stream(body, send, splitter, base, t0)
        finally:
            st = splitter.state
            self.log(
                {
                    "t": round(t0, 3),
                    "seconds": round(time.time() - t0, 2),
                    "messages": len(body.get("messages", [])),
                    "tools": len(tools),
                    "raw": st["raw"],
                    "native_tool_calls": st["native"],
                    "parsed_calls": st["calls"],
                    "finish": st["finish"],
                    "completed": st["completed"],
                    "usage": st["usage"],
                    "timings": st["timings"],
                }
            )
        await resp.write_eof()
        return resp

    async def stream(
        self, body: dict[str, Any], send: Any, splitter: Splitter, base: dict[str, Any], t0: float
    ) -> None:
        assert self.http is not None
        st = splitter.state = {
            "raw": "",
            "native": False,
            "calls": [],
            "finish": None,
            "completed": False,
            "usage": None,
            "timings": None,
        }
        async with self.http.post(f"{self.upstream}/v1/chat/completions", json=body) as up:
            if up.status != 200:
                text = await up.text()
                self.log({"t": t0, "error": up.status, "body": text[:500]})
                raise web.HTTPBadGateway(text=text)
            async for line in up.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                base.update(
                    {k: chunk[k] for k in ("id", "created", "model", "object") if k in chunk}
                )
                if chunk.get("usage"):
                    st["usage"] = chunk["usage"]
                if chunk.get("timings"):
                    st["timings"] = chunk["timings"]
                if not chunk.get("choices"):
                    continue
                choice = chunk["choices"][0]
                delta = choice.get("delta") or {}
                if choice.get("finish_reason"):
                    st["finish"] = choice["finish_reason"]
                if delta.get("tool_calls"):
                    st["native"] = True
                    await send(chunk)
                    continue
                if delta.get("reasoning_content"):
                    await send(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"reasoning_content": delta["reasoning_content"]},
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
                piece = delta.get("content") or ""
                if not piece:
                    continue
                st["raw"] += piece
                now = splitter.feed(piece)
                if now:
                    await send(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"role": "assistant", "content": now},
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )

        held = splitter.held
        calls = [] if st["native"] else find_calls(held) if splitter.mode == "call" else []
        st["calls"] = calls
        if calls:
            deltas = [
                {
                    "index": i,
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(calls)
            ]
            await send(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "tool_calls": deltas},
                            "finish_reason": None,
                        }
                    ],
                }
            )
        elif held:
            await send(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": held},
                            "finish_reason": None,
                        }
                    ],
                }
            )
        finish = "tool_calls" if calls else st["finish"] or "stop"
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if st["usage"]:
            await send({**base, "choices": [], "usage": st["usage"]})
        await send("[DONE]")
        st["completed"] = True


def main() -> None:
    port, upstream, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    proxy = Proxy(upstream, log_path)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_post("/v1/chat/completions", proxy.chat)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    main()
