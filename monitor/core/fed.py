"""What the tracker returns: what one frame did (`Fed`), its answer to the plugin
(`Judged`), and one session as `status` shows it (`SessionView`)."""

from __future__ import annotations

from dataclasses import dataclass

from monitor.core.decisions import Deadline, Intervene, Reply
from monitor.core.events import KNOWN_EVENT_TYPES, MALFORMED, OTHER
from monitor.core.plugin_protocol import ALLOW, PluginVerdict

__all__ = ["QUIET", "Fed", "Judged", "SessionView"]


@dataclass(frozen=True, slots=True)
class Fed:
    """What one frame did: the decisions it led to, and what the shell counts and logs.

    `event_type` is a bounded label (a known type, "other" or "malformed"); `malformed` says
    why the frame could not be used; `deleted` is the session the frame deleted; `replies`
    are the permission requests to answer; `spent` what a `message.updated` added to its
    directory's spend (directory or None, tokens, cost in USD), for the metrics.
    """

    decisions: tuple[Intervene, ...] = ()
    event_type: str = OTHER
    malformed: str | None = None
    deleted: str | None = None
    replies: tuple[Reply, ...] = ()
    spent: tuple[str | None, int, float] | None = None
    deadlines: tuple[Deadline, ...] = ()  # calls that started running: their time bounds
    # Nothing in it for the shell to act on: the shared results below (`QUIET`), which
    # `Monitor.fed` passes over with one test.
    quiet: bool = False


# Most frames change nothing the shell must act on: one shared result per event type, so the
# hot path allocates nothing for them.
QUIET = {
    label: Fed(event_type=label, quiet=True) for label in (*KNOWN_EVENT_TYPES, OTHER, MALFORMED)
}


@dataclass(frozen=True, slots=True)
class Judged:
    """What the tracker says of a call the plugin asked about (`Tracker.judge`): the plugin's
    answer, and the decision behind a block or a nudge, for the shell to log and carry out
    (a `stop` or a hold also aborts the run; a `nudge` posts the feedback)."""

    verdict: PluginVerdict = ALLOW
    decision: Intervene | None = None


@dataclass(frozen=True, slots=True)
class SessionView:
    """One followed session as `Tracker.sessions_view` shows it (for `status`)."""

    session_id: str
    directory: str | None
    # Calls of a run under way are remembered; false once the run ended or an intervention
    # dropped them.
    busy: bool
    run_calls: int  # tool calls of the current run
    calls: int  # tool calls seen since the session was first seen
    interventions: int
    held: bool  # on hold, waiting for a person (`Tracker.outcome`)
