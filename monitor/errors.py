"""The monitor's errors: one base, a local kind and a remote kind.

Callers catch what they mean: a `ConfigError` ends the process with EX_CONFIG (78, see
monitor/exits.py) and no retry, because retrying a wrong setting only fills the journal; a
`ServerError` is about the OpenCode server and is usually worth retrying.
"""

__all__ = ["ConfigError", "MonitorError", "ServerError", "SessionGone"]


class MonitorError(Exception):
    """Base of every error the monitor raises on purpose."""


class ConfigError(MonitorError):
    """A setting is wrong: bad value, unknown key, unreadable file, rejected credentials."""


class ServerError(MonitorError):
    """The OpenCode server failed or answered something we cannot use."""


class SessionGone(ServerError):
    """The server no longer knows the session (404): drop it, do not retry."""
