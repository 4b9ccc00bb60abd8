"""What a failed connection most likely means, and what to do about it, in one line.

A monitor pointed at the wrong thing retries for ever, which is right for a server that is
restarting and useless for a typo. So the first time each kind of failure is seen, the stream
logs one line naming the likely cause and the fix (`stream.diagnosis`); the reconnect lines
that follow stay as short as before. Only the URL's host and port, status codes and the
operating system's or TLS library's own words go into a hint: never a password or a frame.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from monitor.config import SERVER_PASSWORD_VAR, SERVER_USERNAME_VAR

__all__ = [
    "Diagnosis",
    "diagnose_error",
    "diagnose_status",
    "directory_known",
    "refused_credentials",
]


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """`problem` is a stable code for log queries; `hint` is the sentence for a person."""

    problem: str
    hint: str


def _where(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname or "", port


def diagnose_error(exc: BaseException, url: str) -> Diagnosis | None:
    """A hint for a connection that failed before any answer came, or None."""
    scheme, host, port = _where(url)
    if isinstance(exc, aiohttp.ClientSSLError) or isinstance(exc, ssl.SSLError):
        plain = "http://" + url.split("://", 1)[1].split("/", 1)[0]
        return Diagnosis(
            "tls_failed",
            f"the TLS handshake with {host}:{port} failed; `opencode serve` speaks plain HTTP, "
            f"so unless a TLS proxy stands in front of it use --url {plain}",
        )
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return Diagnosis(
            "unknown_host", f"the host name {host} does not resolve: check the host in --url"
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Diagnosis(
            "cannot_connect",
            f"nothing accepts connections on {host}:{port}: start `opencode serve --port {port}`"
            f" there, or give --url the address `opencode serve` printed when it started (with"
            " OpenCode 2, run `opencode service start` and give no --url: its service is found)",
        )
    return None


# The routes the stream request adds to --url (`monitor.shell.api.stream_url`).
_STREAM_ROUTES = ("/global/event", "/api/event", "/event")


def _extra_path(url: str) -> str:
    """The path --url had before the stream's route was added to it ("" for none)."""
    path = urlsplit(url).path
    route = next((r for r in _STREAM_ROUTES if path.endswith(r)), "")
    return path[: len(path) - len(route)].rstrip("/")


def diagnose_status(status: int, content_type: str, url: str) -> Diagnosis:
    """A hint for a server that answered the stream request (at `url`) with something else."""
    scheme, host, port = _where(url)
    extra = _extra_path(url)
    if extra and status in (200, 404):
        # `--url http://127.0.0.1:4096/session`, copied from an API example: the server is
        # there, but the stream was asked for under a path it does not serve.
        base = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
        return Diagnosis(
            "extra_path",
            f"{host}:{port} answered {status} for the event stream under the path {extra} "
            f"that --url has: give --url the server's address alone, {base} "
            f"(a path only where a proxy serves OpenCode under it)",
        )
    if status == 404:
        return Diagnosis(
            "not_opencode",
            f"{host}:{port} has no OpenCode event stream (404): --url must point at "
            f"`opencode serve` (with its path prefix, if a proxy adds one), not another server",
        )
    if status == 200:
        return Diagnosis(
            "not_a_stream",
            f"{host}:{port} answered {content_type or 'no content type'} instead of an event "
            f"stream: --url points at another web server, or a proxy rewrites the answer",
        )
    return Diagnosis(
        "bad_status",
        f"{host}:{port} answered {status} to the event stream request: is it `opencode serve`?",
    )


def refused_credentials(status: int, password_sent: bool) -> str:
    """The configuration error for a 401 (or a proxy's 407), saying which case it is."""
    if status == 407:
        return "a proxy between us and the server wants credentials (407)"
    if password_sent:
        return (
            f"the server refused our credentials ({status}): check the password in "
            f"{SERVER_PASSWORD_VAR} or in the --password-file file, and the user name in "
            f"{SERVER_USERNAME_VAR} (default opencode)"
        )
    return (
        f"the server wants a password ({status}) and none was sent: set {SERVER_PASSWORD_VAR} "
        f"to the password `opencode serve` runs with, or give --password-file FILE"
    )


def directory_known(directory: str, known: list[str]) -> bool:
    """Whether `--directory` is one of the server's project directories or inside one.

    A session started in a subfolder of a project belongs to it, so a folder inside a known
    worktree counts as known; a relative path or a trailing slash never does, because the
    server compares directories as written.
    """
    if not directory.startswith("/") or (directory.endswith("/") and directory != "/"):
        return False
    return any(
        directory == where or directory.startswith(where.rstrip("/") + "/") for where in known
    )
