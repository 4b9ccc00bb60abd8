"""The plugin file this release ships (monitor/plugin/loop-guard.ts) and its version: what
`plugin install` writes into the file, what the daemon expects a plugin to send and says on
every answer, and the line it logs for a plugin of another release."""

from __future__ import annotations

import functools
from importlib import resources

import structlog
from aiohttp import web

from monitor import __version__
from monitor.core.plugin_protocol import (
    VERSION_HEADER,
    PluginCall,
    Versions,
    plugin_release,
    version_header,
)

__all__ = ["say_version", "shipped_version", "stamp_version", "template"]

log = structlog.get_logger("monitor.shell.decide")


def template() -> str:
    return (resources.files("monitor") / "plugin" / "loop-guard.ts").read_text(encoding="utf-8")


@functools.cache
def shipped_version() -> str:
    """This release's plugin version, read once: a daemon started before an upgrade keeps
    saying the version it runs, not the one now on disk."""
    return plugin_release(__version__, template())


async def stamp_version(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer of the endpoint, a refusal too, says this daemon's version: a plugin of
    another release says so in the server's log (loop-guard.ts)."""
    response.headers[VERSION_HEADER] = version_header(shipped_version())


def say_version(versions: Versions, call: PluginCall) -> None:
    """Log, once per server directory and version, that a plugin of another release asks:
    it is answered all the same, as well as this release can."""
    skew = versions.differs(call)
    if skew is not None:
        log.warning(
            "plugin.version_differs",
            directory=skew.directory,
            plugin_version=skew.plugin_version,
            plugin_protocol=skew.protocol,
            monitor_version=versions.monitor_version,
            advice=skew.advice,
            session_id=call.session_id,
        )
