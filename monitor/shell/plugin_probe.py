"""`plugin status` asking the daemon as the installed plugin would: over its socket, or over
TCP signed with the token of its token file, a probe (`{"probe": true}`, judged as nothing)
carrying the plugin's version. What comes back says whether the daemon takes the plugin's
questions and of which release it is (monitor.core.plugin_protocol)."""

from __future__ import annotations

import hmac
import http.client
import json
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from monitor.core.plugin_protocol import (
    DECIDE_PATH,
    PROOF_HEADER,
    PROTOCOL,
    VERSION_HEADER,
    answer_proof,
    question_mac,
)

__all__ = ["Probed", "probe"]

# An answer to a probe is a few dozen bytes; a refusal a sentence.
MAX_ANSWER = 64 * 1024


@dataclass(frozen=True, slots=True)
class Probed:
    """What the daemon answered: its status, its version (None: it said none, a release from
    before versions), and why it refused (None when it answered)."""

    status: int
    monitor_version: str | None
    refused: str | None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def probe(
    where: str, token_file: str | None, plugin_version: str | None, timeout: float
) -> Probed | str:
    """Ask the daemon at `where` (a socket path or the plugin's URL); what it answered, or
    why there is no answer (OSError, an unproven answer) in words."""
    body = json.dumps(
        {"probe": True, "plugin_version": plugin_version, "protocol": PROTOCOL}
    ).encode()
    headers = {"Content-Type": "application/json", "Connection": "close"}
    token = None if where.startswith("/") or token_file is None else _token(token_file)
    nonce = secrets.token_hex(16)
    if token is not None:
        headers["Authorization"] = f"OLM-HMAC {nonce} {question_mac(token, nonce, body)}"
    connection: http.client.HTTPConnection
    if where.startswith("/"):
        connection = _UnixConnection(where, timeout)
    else:
        parts = urlsplit(where)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("POST", DECIDE_PATH, body, headers)
        response = connection.getresponse()
        answer = response.read(MAX_ANSWER)
    except (OSError, http.client.HTTPException) as exc:
        return f"no answer ({type(exc).__name__}: {exc})"
    finally:
        connection.close()
    version = response.getheader(VERSION_HEADER)
    monitor_version = None if version is None else version.split(";")[0].strip()
    if response.status != 200:
        return Probed(response.status, monitor_version, _error(answer))
    proof = response.getheader(PROOF_HEADER) or ""
    if token is not None and not hmac.compare_digest(proof, answer_proof(token, nonce, answer)):
        return "an answer not proven with the token: not the monitor's?"
    return Probed(200, monitor_version, None)


def _token(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except (OSError, ValueError):
        return None


def _error(answer: bytes) -> str:
    try:
        error = json.loads(answer).get("error")
    except (ValueError, AttributeError):
        error = None
    return str(error) if error is not None else answer[:200].decode("utf-8", "replace")
