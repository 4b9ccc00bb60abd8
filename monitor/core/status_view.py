"""The sessions part of the monitor's `/status` body: its totals, and the sessions it lists.

Bounded whatever the count: held sessions first, then busy ones, then idle ones, at most
`STATUS_SESSIONS_MAX` of them; the totals count them all. Directories are cleaned as every
label that leaves the process is (`clean_tool_name`).
"""

from __future__ import annotations

from collections.abc import Sequence

from monitor.core.fed import SessionView
from monitor.core.feedback import clean_tool_name

__all__ = ["DIRECTORY_MAX", "STATUS_SESSIONS_MAX", "sessions_status"]

# /status lists at most this many sessions (its totals count them all), so its body stays
# small and quick to build whatever the server runs.
STATUS_SESSIONS_MAX = 100
DIRECTORY_MAX = 256
_RANKS = ("held", "busy", "idle")


def sessions_status(views: Sequence[SessionView]) -> dict[str, object]:
    """`totals`, `sessions` and `sessions_omitted` of the `/status` body."""
    states = {
        view.session_id: "held" if view.held else ("busy" if view.busy else "idle")
        for view in views
    }
    shown = [
        view
        for rank in ("held", "busy", "idle")
        for view in views
        if states[view.session_id] == rank
    ][:STATUS_SESSIONS_MAX]
    sessions = [
        {
            "session_id": view.session_id,
            "directory": None
            if view.directory is None
            else clean_tool_name(view.directory, DIRECTORY_MAX),
            "state": states[view.session_id],
            "run_calls": view.run_calls,
            "interventions": view.interventions,
        }
        for view in shown
    ]
    return {
        "totals": {
            "sessions": len(views),
            "busy": sum(state == "busy" for state in states.values()),
            "held": sum(view.held for view in views),
            "interventions": sum(view.interventions for view in views),
        },
        "sessions": sessions,
        "sessions_omitted": len(views) - len(sessions),
    }
