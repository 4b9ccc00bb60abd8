"""The monitor's errors, in one place: one base, a local kind and a remote kind (as h11's).

Callers catch what they mean:
- `LocalError`: something on our side is wrong, and retrying changes nothing.
  `ConfigError`, a setting (EX_CONFIG, 78: a service manager is told not to restart);
  `InputError`, a file given to a command (EX_USAGE, 2).
- `ServerError`: the OpenCode server failed or answered something we cannot use (the remote
  kind; EX_UNAVAILABLE, 69, where the command line ends). `ServerAway`: no answer at all,
  worth finishing once it is back; `Refused`: a 4xx with its status; `SessionGone`: a
  session's own route answered 404, so the session is deleted (a 404 of any other route is
  a `Refused` with status 404); `MalformedId`: an id not of OpenCode's shape, never sent.

Errors of one stage stay beside it and join the hierarchy: `FrameError` (core/frames.py), a
frame of the server's that is not usable JSON, is a `ServerError`; `DetectionError`
(core/limits.py) is a `ConfigError`; `RecordingError` (core/replay.py) and `LabelError`
(core/evaluate.py) are `InputError`s; the kit's `SandboxError` and `DemoError` are
`MonitorError`s (what the kit started failed, EX_FAILED, 1). Private classes that only steer
control flow inside one module (`_Unanswered` in shell/api.py, `_NoHeaders` in
shell/stream.py, ...) stay there.

The command line catches `MonitorError` where it ends (monitor/cli.py) and says it in one line
with the exit status of its kind (monitor/exits.py).
"""

__all__ = [
    "ConfigError",
    "CredentialsRefused",
    "InputError",
    "LocalError",
    "MalformedId",
    "MonitorError",
    "Refused",
    "ServerAway",
    "ServerError",
    "SessionGone",
]


class MonitorError(Exception):
    """Base of every error the monitor raises on purpose."""


class LocalError(MonitorError):
    """Wrong on our side: a setting or an input; no retry mends it."""


class ConfigError(LocalError):
    """A setting is wrong: bad value, unknown key, unreadable file, rejected credentials."""


class InputError(LocalError):
    """A file given to a command cannot be used: not a recording, a bad label."""


class CredentialsRefused(ConfigError):
    """A 401: our credentials are wrong. `reason` says which case and what to check, without
    the request it came on (`detect` says it as the stream does)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.reason = reason


class ServerError(MonitorError):
    """The OpenCode server failed or answered something we cannot use."""


class ServerAway(ServerError):
    """No answer from the server at all, after retries: it may be down or restarting. What
    was being done is worth finishing once it is back (`monitor.core.due`)."""


class Refused(ServerError):
    """The server refused the request (a 4xx other than 401, or the 404 of a route that is
    not a session's): `status` says which."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class SessionGone(ServerError):
    """A session's route answered 404: the server no longer knows the session; drop it, do
    not retry."""


class MalformedId(ServerError):
    """An id that is not of OpenCode's shape; no request was made with it."""
