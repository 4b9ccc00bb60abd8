"""The plugin's question and the daemon's answer: `POST /v1/decide`, validated without I/O.

The OpenCode plugin (monitor/plugin/loop-guard.ts) asks from its `tool.execute.before` hook
whether a call may run. `check_head` and `read_body` turn what arrived (method, path, headers, then
body) into a `PluginCall` or a `RequestRefused` carrying the HTTP status and a message for the
plugin's log; nothing a client sends can make them raise. The shell (monitor/shell/decide.py)
moves the bytes.

Request body (JSON object): `session_id` (ses_...), `call_id` (the model's call id, not unique
across steps), `tool`, `args` (an object), `directory` (the server's project, absolute),
`fell_open` (calls the plugin let run unasked since its last answered request; optional),
`message_id` (the model step, an assistant message, the call is of, as the server's own
events told the plugin; optional: the stream may show the step after the question comes),
`args_cut: true` in place of `args` for a call whose arguments are too large to send (the
plugin's own rule judges it; the daemon learns that the session's plugin asks),
`plugin_version` and `protocol` (the release that wrote the plugin file and PROTOCOL as it
knew it; absent from plugins before issue 46: taken as an earlier release, and answered).
A 2.x call's `tool` and `args` are read under the 1.x name and keys the stream's events of
the same call are typed with (`profile.server_call`: `shell` is `bash`).
Reports never cost a decision: only a missing or malformed `session_id`, `tool` or `args`
refuses the question. Any other field that cannot be used (`call_id`, `directory`,
`message_id` or `fell_open` of the wrong type or out of range) is taken as unknown (None, a
count of 0) and named in `PluginCall.unusable`, which the shell logs once per field; fields
this version does not know are ignored (a newer plugin's). A number past what `int` parses
(over 4,300 digits) is read as a float, not refused.
Answer: `{"verdict": "allow"}` or `{"verdict": "block", "feedback": TEXT}`. Every answer,
a refusal too, says the daemon's own plugin version in VERSION_HEADER (`VERSION;
protocol=N`): a plugin of another release says so in the server's log. `{"probe": true}`
with `plugin_version` and `protocol` is answered `{"monitor_version", "protocol"}` and judges
nothing (`plugin status` asks it as the plugin would, to learn whether the daemon answers).

On loopback TCP, where any local user can listen on the port while the daemon is down, a
question is signed rather than carrying the token: `Authorization: OLM-HMAC NONCE MAC`, MAC
the HMAC-SHA256 (hex) with the shared token of `question NONCE\n` and the body, NONCE fresh
per question; the daemon proves its answer with PROOF_HEADER, the HMAC of `answer NONCE\n`
and the answer's body. An impostor learns neither the token nor how to prove an answer; the
plugin takes an answer without a valid proof for no answer. `Bearer TOKEN`, what plugins
before the signature sent, is refused with a message telling the user to run `plugin install`
again: a plugin file left behind by an upgrade must not keep sending the token in the clear.

Strings are taken as JSON gives them, lone surrogates (`"\\ud800"`, valid JSON, not UTF-8)
included: a call is judged on what it is, and the stream's update of the same call carries
the same text (digests hash it with `surrogatepass`, monitor.core.signature). The one
replacement is where text leaves the process: logs, metric labels and `/status` write it as
they write every name (monitor.core.findings.clean_tool_name: a lone surrogate, as any
control character, becomes a space).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from monitor.core.frames import loads
from monitor.core.ids import is_session_id
from monitor.core.profile import server_call

__all__ = [
    "ALLOW",
    "CLEAR_TOKEN",
    "DECIDE_PATH",
    "FellOpen",
    "MAX_BODY",
    "Nonces",
    "PROOF_HEADER",
    "PROTOCOL",
    "PluginCall",
    "PluginVerdict",
    "Probe",
    "RequestRefused",
    "Signature",
    "VERSION_HEADER",
    "VersionSkew",
    "Versions",
    "answer_proof",
    "block",
    "check_head",
    "check_signature",
    "plugin_release",
    "probe_answer",
    "question_mac",
    "read_body",
    "skew_advice",
    "signed",
    "too_large",
    "version_header",
]

VERSION = "v1"
# What the plugin and the daemon know of each other's questions and answers, beyond the path's
# VERSION (which every release so far takes): 1, the plugins before issue 46 (no version, the
# token in the clear over TCP, refused since); 2, those sending `plugin_version` and `protocol`.
PROTOCOL = 2
VERSION_HEADER = "X-Loop-Monitor-Version"
CLEAR_TOKEN = (
    "this plugin sends the token in the clear (a plugin file of an earlier release, left "
    "behind by an upgrade): run `opencode-loop-monitor plugin install` again and restart OpenCode"
)
DECIDE_PATH = f"/{VERSION}/decide"
# A `write` call carries the whole file it writes; 1 MiB holds any a model sends in one call,
# and bounds what one request can make the daemon read.
MAX_BODY = 1 << 20
MAX_ID = 256
MAX_DIRECTORY = 4096
# What the plugin counts between answered requests; more than this is not a count it made.
MAX_FELL_OPEN = 1_000_000

Verdict = Literal["allow", "block"]

SIGNED = "olm-hmac"
PROOF_HEADER = "X-Loop-Monitor-Proof"
# A nonce: the plugin's 32 hex digits, with room for another client's.
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_MAC = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class PluginCall:
    """One tool call about to run, as the plugin saw it in `tool.execute.before`."""

    session_id: str
    call_id: str | None  # None: unknown (not sent, or not a usable call id)
    tool: str
    args: Mapping[str, Any]
    directory: str | None  # None: unknown
    fell_open: int = 0
    # The optional fields sent but not usable, taken as unknown: a report, never a refusal.
    unusable: tuple[str, ...] = ()
    message_id: str | None = None  # None: unknown (not sent, or not usable)
    # The arguments were too large to send (`args_cut`; `args` is empty): the call is not
    # judged on them, the stream carries them (`ToolUpdates.judge`).
    cut: bool = False
    # The release that wrote the plugin file and its PROTOCOL; None: not sent (a plugin from
    # before issue 46) or not usable.
    plugin_version: str | None = None
    protocol: int | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    """`plugin status` asking, as the plugin would, whether the daemon answers it."""

    plugin_version: str | None
    protocol: int | None


@dataclass(frozen=True, slots=True)
class PluginVerdict:
    """Whether the call runs; `feedback` is what the plugin throws (the model reads it)."""

    verdict: Verdict
    feedback: str | None = None

    def to_json(self) -> dict[str, str]:
        if self.verdict == "block":
            return {"verdict": "block", "feedback": self.feedback or ""}
        return {"verdict": "allow"}


ALLOW = PluginVerdict("allow")


def block(feedback: str) -> PluginVerdict:
    return PluginVerdict("block", feedback)


@dataclass(frozen=True, slots=True)
class RequestRefused:
    """Why a request was not taken: the HTTP status and a message the plugin can log."""

    status: int
    message: str

    def to_json(self) -> dict[str, str]:
        return {"error": self.message}


def check_head(
    method: str, path: str, headers: Mapping[str, str], token: str | None
) -> RequestRefused | None:
    """Check what comes before the body, in the order a client can fix it: where, who, what
    shape. `headers` must be case-insensitive (as aiohttp's are); `token` is the bearer token
    a TCP listener requires (None on the owner-only Unix socket)."""
    if path != DECIDE_PATH:
        if path.startswith("/v") and path.endswith("/decide"):
            return RequestRefused(404, f"unsupported protocol version in {path}: use {DECIDE_PATH}")
        return RequestRefused(404, f"no such endpoint {path}: use POST {DECIDE_PATH}")
    if method != "POST":
        return RequestRefused(405, f"{DECIDE_PATH} takes POST, not {method}")
    if token is not None:
        refused = _authorization(headers.get("Authorization", ""), token)
        if refused is not None:
            return refused
    content_type = headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return RequestRefused(415, f"expected Content-Type application/json, got {content_type!r}")
    return None


def read_body(body: bytes) -> PluginCall | Probe | RequestRefused:
    """The call a request body names, or why it names none."""
    if len(body) > MAX_BODY:
        return too_large()
    try:
        # Nested deeper than `json.loads` recurses is read too (within MAX_BODY, which is
        # frames.MAX_DEEP_BYTES): odd, still JSON.
        data = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return RequestRefused(400, f"body is not JSON: {exc}")
    return _call(data)


def too_large() -> RequestRefused:
    """What a body over MAX_BODY is refused with (the shell stops reading there)."""
    return RequestRefused(413, f"request body over {MAX_BODY} bytes")


def _authorization(header: str, token: str) -> RequestRefused | None:
    """None for a signature well formed (checked with the body); else why not."""
    scheme, _, given = header.partition(" ")
    if scheme.lower() == SIGNED and signed(header) is not None:
        return None
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token):
        # Our own plugin, of a release before the signature: told what to do about it (the
        # plugin writes the refusal in the server's log).
        return RequestRefused(401, CLEAR_TOKEN)
    return RequestRefused(401, "missing or wrong bearer token or signature")


@dataclass(frozen=True, slots=True)
class Signature:
    """What an `OLM-HMAC` Authorization header carries."""

    nonce: str
    mac: str


def signed(header: str) -> Signature | None:
    """The signature in an Authorization header, or None (another scheme, or malformed)."""
    parts = header.split()
    if len(parts) != 3 or parts[0].lower() != SIGNED:
        return None
    nonce, mac = parts[1], parts[2].lower()
    if _NONCE.fullmatch(nonce) is None or _MAC.fullmatch(mac) is None:
        return None
    return Signature(nonce, mac)


def _mac(token: str, kind: bytes, nonce: str, body: bytes) -> str:
    message = kind + b" " + nonce.encode("ascii") + b"\n" + body
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).hexdigest()


def question_mac(token: str, nonce: str, body: bytes) -> str:
    """What a plugin signs its question with (loop-guard.ts makeAsker)."""
    return _mac(token, b"question", nonce, body)


def answer_proof(token: str, nonce: str, body: bytes) -> str:
    """What proves an answer to the question `nonce` comes from a holder of the token."""
    return _mac(token, b"answer", nonce, body)


def check_signature(signature: Signature, token: str, body: bytes) -> RequestRefused | None:
    """Whether the body is the one the token's holder signed."""
    if hmac.compare_digest(signature.mac, question_mac(token, signature.nonce, body)):
        return None
    return RequestRefused(401, "missing or wrong bearer token or signature")


class Nonces:
    """The nonces of recent signed questions: one asked again (another user who saw the
    question while it held the port, replaying it to the daemon) is refused. Bounded: a
    replay after `size` newer questions is a stale call judged once more, no secret lost."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: dict[str, None] = {}
        self._size = size

    def fresh(self, nonce: str) -> bool:
        """Whether `nonce` was not seen; it is remembered either way."""
        if nonce in self._seen:
            return False
        if len(self._seen) >= self._size:
            del self._seen[next(iter(self._seen))]
        self._seen[nonce] = None
        return True


def _call(data: object) -> PluginCall | Probe | RequestRefused:
    if not isinstance(data, dict):
        return RequestRefused(400, "body must be a JSON object")
    unusable: list[str] = []
    plugin_version, protocol = _release(data, unusable)
    if data.get("probe") is True:
        return Probe(plugin_version, protocol)
    session_id = data.get("session_id")
    if not isinstance(session_id, str) or not is_session_id(session_id):
        return RequestRefused(400, "session_id must be an OpenCode session id (ses_...)")
    tool = data.get("tool")
    if not isinstance(tool, str) or not _is_id(tool):
        return RequestRefused(400, f"tool must be a string of 1 to {MAX_ID} characters")
    cut = data.get("args_cut") is True
    args = {} if cut else data.get("args")
    if not isinstance(args, dict):
        return RequestRefused(400, "args must be a JSON object")
    # The call under the name and keys the stream's update of it has (`profile.server_call`:
    # 2.x's `shell` is `bash`, its `read {path}` 1.x's `read {filePath}`): one tool to every
    # rule and one signature, not "3 calls (read, shell, bash)" for a call asked and run.
    tool, named = server_call(tool, args)
    args = named if isinstance(named, dict) else args
    call_id = data.get("call_id")
    if not isinstance(call_id, str) or not _is_id(call_id):
        call_id = None
        unusable.append("call_id")
    directory = data.get("directory")
    if not (
        isinstance(directory, str) and directory.startswith("/") and len(directory) <= MAX_DIRECTORY
    ):
        directory = None
        unusable.append("directory")
    fell_open = data.get("fell_open", 0)
    if (
        not isinstance(fell_open, int)
        or isinstance(fell_open, bool)
        or not 0 <= fell_open <= MAX_FELL_OPEN
    ):
        # Only a report for the metrics: a count out of range (an older plugin's, which could
        # fall below zero) must not cost the call its judgement. Counted as nothing.
        fell_open = 0
        unusable.append("fell_open")
    message_id = data.get("message_id")
    if message_id is not None and not (isinstance(message_id, str) and _is_id(message_id)):
        message_id = None
        unusable.append("message_id")
    return PluginCall(
        session_id,
        call_id,
        tool,
        args,
        directory,
        fell_open,
        tuple(unusable),
        message_id,
        cut,
        plugin_version,
        protocol,
    )


def _release(data: dict[str, Any], unusable: list[str]) -> tuple[str | None, int | None]:
    """The plugin's `plugin_version` and `protocol`, each None when absent or not usable."""
    version = data.get("plugin_version")
    if version is not None and not (isinstance(version, str) and _is_id(version)):
        version = None
        unusable.append("plugin_version")
    protocol = data.get("protocol")
    if protocol is not None and (
        not isinstance(protocol, int) or isinstance(protocol, bool) or not 0 < protocol < 1 << 16
    ):
        protocol = None
        unusable.append("protocol")
    return version, protocol


def plugin_release(package_version: str, template: str) -> str:
    """The version of the plugin file a release ships: its package version and a digest of
    the file (monitor/plugin/loop-guard.ts as shipped). The package version alone can stay
    the same from one commit to the next; any change to the plugin changes the digest."""
    digest = hashlib.sha256(template.encode("utf-8")).hexdigest()[:8]
    return f"{package_version}+{digest}"


def probe_answer(monitor_version: str) -> dict[str, object]:
    """What a probe is answered: this daemon's plugin version and protocol."""
    return {"monitor_version": monitor_version, "protocol": PROTOCOL}


def version_header(monitor_version: str) -> str:
    """VERSION_HEADER's value on every answer (loop-guard.ts reads it)."""
    return f"{monitor_version}; protocol={PROTOCOL}"


def skew_advice(plugin_version: str | None, protocol: int | None, monitor_version: str) -> str:
    """What a person reads when the plugin file and the daemon are of different releases."""
    if plugin_version is None:
        plugin = "of an earlier release (it says no version)"
    else:
        plugin = f"version {plugin_version}"
    said = f"the installed plugin is {plugin}, this monitor {monitor_version}: "
    if protocol is not None and protocol > PROTOCOL:
        # The plugin knows more than this daemon: the daemon is the one left behind.
        return said + "restart the monitor with the release that installed the plugin"
    return said + "run `opencode-loop-monitor plugin install` and restart OpenCode"


@dataclass(frozen=True, slots=True)
class VersionSkew:
    """A plugin of another release asked: what `plugin.version_differs` logs."""

    directory: str | None
    plugin_version: str | None
    protocol: int | None
    advice: str


class Versions:
    """Which plugins of another release were said (logged) already: once per server
    directory and version, a bounded number (the oldest said forgotten first)."""

    def __init__(self, monitor_version: str, size: int = 64) -> None:
        self.monitor_version = monitor_version
        self._said: dict[tuple[str | None, str | None], None] = {}
        self._size = size

    def differs(self, call: PluginCall) -> VersionSkew | None:
        """The skew to say for this question, the first time for its directory; else None."""
        if call.plugin_version == self.monitor_version:
            return None
        key = (call.directory, call.plugin_version)
        if key in self._said:
            return None
        if len(self._said) >= self._size:
            del self._said[next(iter(self._said))]
        self._said[key] = None
        advice = skew_advice(call.plugin_version, call.protocol, self.monitor_version)
        return VersionSkew(call.directory, call.plugin_version, call.protocol, advice)


def _is_id(value: str) -> bool:
    return 0 < len(value) <= MAX_ID


class FellOpen:
    """Calls that fell open, counted once each although the plugin reports a running total.

    The plugin sends `fell_open`, the calls it let run unasked since its last answered
    request, with every request, and subtracts what it reported only when the answer reaches
    it. A request answered too late (the plugin gave up waiting) leaves its total with the
    plugin, to be reported again, one more, with the next: counted as sent, a stalled daemon
    read 900 for at most 48 calls. Per plugin (one per server directory), this keeps what
    was counted already and the plugin still holds.
    """

    def __init__(self, max_plugins: int = 1024) -> None:
        self._held: dict[str, int] = {}
        self._max = max_plugins

    def count(self, directory: str, reported: int, answered: bool) -> int:
        """New calls fallen open in `reported`; `answered`: the answer reaches the plugin
        (it then subtracts `reported`, and starts from nothing)."""
        held = self._held.pop(directory, 0)
        new = max(0, reported - held)
        if not answered:
            if len(self._held) >= self._max:
                del self._held[next(iter(self._held))]
            self._held[directory] = reported
        return new
