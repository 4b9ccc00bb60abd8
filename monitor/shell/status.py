"""`opencode-loop-monitor status`: what a running monitor sees, read from its /status.

The monitor answers on its `--metrics-addr`; this command asks there, so it needs the same
address (flag, variable or file) and nothing else; without one it asks STATUS_ADDRESS
(127.0.0.1:9464), the address the services `unit` prints, the README's `watch` and the
playground serve on. A plain blocking request: one call, no event loop.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from monitor.config import STATUS_ADDRESS, ListenAddress, Settings
from monitor.core.plugin_protocol import skew_advice
from monitor.errors import ConfigError
from monitor.exits import EX_OK, EX_UNAVAILABLE

__all__ = ["render_status", "run_status"]

TIMEOUT_S = 5.0


def status_url(address: ListenAddress) -> str:
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"http://{host}:{address.port}/status"


def fetch_status(address: ListenAddress, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The monitor's /status; OSError when nothing usable answers."""
    with urllib.request.urlopen(status_url(address), timeout=timeout) as response:
        body = json.load(response)
    if not isinstance(body, dict):
        raise OSError("/status did not answer a JSON object")
    return body


def _ago(unix: float, now: float) -> str:
    return f"{max(now - unix, 0):.0f} s ago"


def _last_frame(unix: float | None, now: float) -> str:
    return "no frame yet" if unix is None else f"last frame {_ago(unix, now)}"


def _plugin_lines(plugins: dict[str, Any] | None, now: float) -> list[str]:
    """Whether OpenCode plugins ask (a monitor from before the plugin sends no block)."""
    if plugins is None:
        return []
    if plugins["endpoint"] is None:
        return ["plugins: endpoint off"]
    asking = plugins["directories"]
    calls = plugins.get("unasked_calls")
    if not asking and calls:
        # The trial's case: every call fell open and nobody read the server's log. The count
        # is the one `plugin.not_asking` gave, when it was said: more may have run since.
        return [
            f"plugins: none asked at {plugins['endpoint']}; {calls} tool calls had run unasked "
            "when that was noticed: the plugin is not installed where the server looks, or asks "
            "elsewhere (`opencode-loop-monitor plugin status`)"
        ]
    if not asking:
        return [f"plugins: none asked yet at {plugins['endpoint']}"]
    lines = [f"plugins asking at {plugins['endpoint']}:"]
    for entry in asking:
        lines.append(
            f"  {entry['directory']}: {entry['requests']} calls, {entry['blocked']} blocked, "
            f"{entry['fell_open']} fell open, last request {_ago(entry['last_request_unix'], now)}"
        )
        # A monitor from before versions says neither (issue 46).
        ours = plugins.get("version")
        if ours is not None and "plugin_version" in entry and entry["plugin_version"] != ours:
            lines.append(f"    {skew_advice(entry['plugin_version'], None, ours)}")
    return lines


def _role_lines(role: dict[str, Any] | None) -> list[str]:
    """Whether this monitor acts, or stands by for the one that does (a monitor from
    before roles says nothing)."""
    if role is None or role["state"] == "dry run":
        return []
    if role["state"] == "standby":
        pid = role.get("acting_pid")
        who = "another monitor" if pid is None else f"the monitor with pid {pid}"
        return [
            f"role: standby: {who} acts for this server; loops are logged here and left to "
            "it, and this one takes over when it stops"
        ]
    if role["state"] == "unguarded":
        return ["role: acting, without checking for another monitor (see monitor.unguarded)"]
    return ["role: acting"]


def _server_words(server: str | None) -> str:
    """Which server the stream is of, as `server.detected` says it (`opencode 2.2.5: 2.x
    API`), put so that the line reads "stream: connected to opencode 2.2.5 (2.x API), ...";
    nothing before the first connect, or from a monitor from before it said one."""
    if not server:
        return ""
    name, _, api = server.partition(": ")
    return f" to {name} ({api})" if api else f" to {name}"


def render_status(status: dict[str, Any], now: float) -> str:
    """The table for people; `--json` prints `status` as it came."""
    stream, totals = status["stream"], status["totals"]
    where = status["url"] + (f" (directory {status['directory']})" if status["directory"] else "")
    lines = [
        f"monitor {status['version']} watching {where}"
        + (", dry run: detects only" if status["dry_run"] else ""),
        f"stream: {stream['state']}{_server_words(stream.get('server'))}, "
        f"{stream['frames']} frames, "
        f"{_last_frame(stream['last_frame_unix'], now)}",
        # The gauges sessions_known, sessions_busy and sessions_held count the same.
        f"sessions known: {totals['sessions']} (busy {totals['busy']}, held {totals['held']}, "
        f"idle {totals['sessions'] - totals['busy'] - totals['held']}), "
        f"interventions: {totals['interventions']}",
        *_role_lines(status.get("role")),
        *_plugin_lines(status.get("plugins"), now),
    ]
    sessions = status["sessions"]
    if sessions:
        header = ("SESSION", "STATE", "CALLS", "INTERVENTIONS", "DIRECTORY")
        rows = [
            (
                entry["session_id"],
                entry["state"],
                str(entry["run_calls"]),
                str(entry["interventions"]),
                entry["directory"] or "-",
            )
            for entry in sessions
        ]
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(4)]
        lines.append("")
        for row in (header, *rows):
            cells = [
                row[i].ljust(widths[i]) if i < 2 else row[i].rjust(widths[i]) for i in range(4)
            ]
            lines.append("  ".join((*cells, row[4])))
    omitted = status.get("sessions_omitted", 0)
    if omitted:
        lines.append(f"... and {omitted} more (held first, then busy, then idle)")
    return "\n".join(lines) + "\n"


def run_status(settings: Settings, as_json: bool) -> int:
    address = settings.metrics_addr or STATUS_ADDRESS
    if address.port == 0:
        raise ConfigError(
            "metrics_addr: status asks the monitor on the address `watch --metrics-addr` "
            "serves; give the same HOST:PORT (not port 0)"
        )
    try:
        status = fetch_status(address)
    except (OSError, ValueError) as exc:  # URLError is an OSError; bad JSON a ValueError
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(
            f"opencode-loop-monitor: no monitor answers on {status_url(address)} ({reason}); "
            f"is `watch` running with --metrics-addr {address}?",
            file=sys.stderr,
        )
        return EX_UNAVAILABLE
    if as_json:
        print(json.dumps(status, indent=2))
    else:
        sys.stdout.write(render_status(status, time.time()))
    return EX_OK
