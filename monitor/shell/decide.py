"""The decision endpoint: where the OpenCode plugin asks whether a tool call may run.

`POST /v1/decide` (monitor.core.plugin_protocol) on a Unix socket only its owner can open
(mode 0600 in a 0700 folder), or on loopback TCP with a token from a file that signs each
question and proves each answer (monitor.core.plugin_protocol). Judging
is a synchronous call of the `judge` callback, so a request never waits on the event stream
and the stream never waits on a request.

On TCP any local user can connect, token or not, so the server has the limits of
monitor.shell.listener: at most MAX_CONNECTIONS open (far below the 1,024 descriptors of a
process started by hand, and the 8,192 the units set), a head within IDLE_S of the
connection's start or of the previous answer, a body within BODY_S, an idle connection
closed after IDLE_S; a refused request's connection is closed after the answer, so a
wrong token costs a new connection each time. A connection over the cap pushes out the
oldest one that has not made an authorised request, never the plugin's once it has. What
stays possible: a neighbour opening connections fast enough pushes out (or, with the
kernel's accept queue full, delays) the plugin's new ones, and its calls fail open (they run
unjudged; the stream still catches the loop); the owner-only Unix socket has no neighbour.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from aiohttp import web

from monitor.core.plugin_protocol import (
    ALLOW,
    MAX_BODY,
    PROOF_HEADER,
    Nonces,
    PluginCall,
    PluginVerdict,
    Probe,
    RequestRefused,
    Signature,
    Versions,
    answer_proof,
    check_head,
    check_signature,
    probe_answer,
    read_body,
    signed,
    too_large,
)
from monitor.errors import ConfigError
from monitor.shell.endpoint import PluginEndpoint, check_endpoint, clear_stale_socket
from monitor.shell.listener import Limits, Listening, listen_tcp, listen_unix, trust
from monitor.shell.plugin_file import say_version, shipped_version, stamp_version

__all__ = ["MAX_CONNECTIONS", "DecideServer", "Judge"]

log = structlog.get_logger("monitor.shell.decide")

# The verdict, or why the daemon cannot judge the call now (the plugin's own rule then does).
Judge = Callable[[PluginCall], PluginVerdict | RequestRefused]

# The plugin of one server opens a connection per call under way at once (Bun's fetch pool).
MAX_CONNECTIONS = 128
IDLE_S = 5.0
BODY_S = 5.0
# A request line and each header: the path and a bearer token are short.
MAX_LINE = 4096
# What is read and dropped of a body over MAX_BODY so that its client reads the 413: the
# biggest file a model writes in one call, with room to spare. Past it, the connection is
# reset (the call runs unjudged: the plugin's own rule decides).
DRAIN_MAX = 64 * MAX_BODY


class DecideServer:
    """Serves `POST /v1/decide`; `judge` answers, `on_asked` counts (both synchronous)."""

    def __init__(
        self,
        endpoint: PluginEndpoint,
        judge: Judge,
        on_asked: Callable[[PluginCall, PluginVerdict], None],
        on_refused: Callable[[RequestRefused], None],
        on_late: Callable[[PluginCall], None] = lambda call: None,
    ) -> None:
        self.endpoint = endpoint
        self._judge = judge
        self._on_asked = on_asked
        self._on_refused = on_refused
        self._on_late = on_late
        self._token: str | None = None
        self._nonces = Nonces()
        self._versions = Versions(shipped_version())
        self._unusable_said: set[str] = set()  # the fields `plugin.report_unusable` named
        self._runner: web.AppRunner | None = None
        self._listening: Listening | None = None
        self.port: int | None = None

    async def start(self) -> None:
        endpoint = self.endpoint
        # aiohttp refuses bodies over client_max_size itself; the handler turns that into
        # our JSON 413.
        app = web.Application(client_max_size=MAX_BODY)
        app.on_response_prepare.append(stamp_version)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        limits = Limits(MAX_CONNECTIONS, IDLE_S, MAX_LINE, self._over_the_cap)
        try:
            self._token = check_endpoint(endpoint)
            if endpoint.socket is not None:
                clear_stale_socket(endpoint.socket)
                self._listening = await listen_unix(runner, limits, endpoint.socket)
            else:
                assert endpoint.host is not None and endpoint.port is not None
                self._listening = await listen_tcp(runner, limits, endpoint.host, endpoint.port)
                self.port = self._listening.server.sockets[0].getsockname()[1]
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"plugin endpoint: cannot listen ({exc.strerror})") from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("plugin.listening", socket=str(endpoint.socket), port=self.port)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._listening is not None:
            self._listening.close()
        await runner.cleanup()
        if self.endpoint.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.endpoint.socket.unlink()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        refused = check_head(request.method, request.path, request.headers, self._token)
        if refused is None:
            if request.content_length is not None and request.content_length > MAX_BODY:
                return await self._too_large(request)
            try:
                async with asyncio.timeout(BODY_S):
                    body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return await self._too_large(request)
            except TimeoutError:
                refused = RequestRefused(408, f"request body not received within {BODY_S:g} s")
            else:
                signature = self._signature(request)
                parsed = self._authentic(signature, body) or read_body(body)
                if isinstance(parsed, Probe):
                    answer = web.json_response(probe_answer(self._versions.monitor_version))
                    return self._proven(answer, signature)
                if isinstance(parsed, PluginCall) and _gone(request):
                    # The plugin gave up waiting (we were stalled): the call ran, and
                    # judging it now would act on a run that went on without us.
                    self._on_late(parsed)
                    return self._proven(web.json_response(ALLOW.to_json()), signature)
                if isinstance(parsed, PluginCall):
                    self._say_unusable(parsed)
                    say_version(self._versions, parsed)
                    trust(request)
                    return self._proven(self._answer(parsed), signature)
                refused = parsed
        self._on_refused(refused)
        answer = web.json_response(refused.to_json(), status=refused.status)
        # Closed after the answer: a client that is refused cannot go on asking for free on
        # a kept-alive connection (another user's flood of wrong tokens, say).
        answer.force_close()
        return answer

    def _say_unusable(self, call: PluginCall) -> None:
        """Log once per field that a plugin sends one it cannot use (taken as unknown, the
        call judged all the same): a plugin of another version, or a bug of its, to be
        fixed there; every question would repeat it."""
        new = [name for name in call.unusable if name not in self._unusable_said]
        if new:
            self._unusable_said.update(new)
            log.warning("plugin.report_unusable", fields=new, session_id=call.session_id)

    def _signature(self, request: web.Request) -> Signature | None:
        if self._token is None:
            return None
        return signed(request.headers.get("Authorization", ""))

    def _authentic(self, signature: Signature | None, body: bytes) -> RequestRefused | None:
        """Why a signed question is not taken (its body is not the one signed, or it was
        asked before); None for one that is, and for a bearer token (checked with the head)."""
        if signature is None or self._token is None:
            return None
        refused = check_signature(signature, self._token, body)
        if refused is None and not self._nonces.fresh(signature.nonce):
            refused = RequestRefused(401, "question asked before (a replay)")
        return refused

    def _proven(self, answer: web.Response, signature: Signature | None) -> web.Response:
        """`answer`, with the proof that a holder of the token wrote it, for a signed question."""
        if signature is not None and self._token is not None and isinstance(answer.body, bytes):
            proof = answer_proof(self._token, signature.nonce, answer.body)
            answer.headers[PROOF_HEADER] = proof
        return answer

    async def _too_large(self, request: web.Request) -> web.StreamResponse:
        """The 413 for a body over MAX_BODY, sent at once, then the rest of the body read
        and dropped (at most DRAIN_MAX bytes, within BODY_S) before the close: closed with
        its body unread, the connection is reset, and a client that sends its whole body
        before reading (Bun's fetch, aiohttp's) loses the answer to the reset."""
        refused = too_large()
        self._on_refused(refused)
        answer = web.json_response(refused.to_json(), status=refused.status)
        answer.force_close()
        await answer.prepare(request)
        await answer.write_eof()
        left = DRAIN_MAX
        with contextlib.suppress(TimeoutError, ConnectionError, web.HTTPException):
            async with asyncio.timeout(BODY_S):
                while left > 0 and not request.content.at_eof():
                    chunk = await request.content.readany()
                    if not chunk:
                        break
                    left -= len(chunk)
        return answer

    def _over_the_cap(self) -> None:
        self._on_refused(RequestRefused(503, f"over {MAX_CONNECTIONS} connections"))

    def _answer(self, call: PluginCall) -> web.Response:
        try:
            verdict = self._judge(call)
            if isinstance(verdict, RequestRefused):
                self._on_refused(verdict)
                return web.json_response(verdict.to_json(), status=verdict.status)
        except Exception:
            # A bug of ours must not stop the server's calls: the plugin lets this one run.
            log.exception("plugin.judge_failed", session_id=call.session_id, tool=call.tool)
            refused = RequestRefused(500, "the monitor failed to judge this call")
            return web.json_response(refused.to_json(), status=500)
        self._on_asked(call, verdict)
        return web.json_response(verdict.to_json())


def _gone(request: web.Request) -> bool:
    """Whether the client closed its connection before we answered: the plugin waits at
    most its WAIT_MS, then lets the call run and drops the request."""
    transport = request.transport
    return transport is None or transport.is_closing()
