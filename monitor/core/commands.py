"""What `Monitor` tells the shell to do: frozen commands, carried out in the order given.

The shell runs each one as it is (an intervention's request, a permission request answered,
a metric counted, a line logged, a timer started) and feeds what came of it back to
`Monitor`; it never works out a plan, a rule, an outcome, an engine or whether it acts again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from monitor.core import intervention as life
from monitor.core.decisions import Deadline, Intervene, Outcome, Reply

__all__ = [
    "Await",
    "Command",
    "Count",
    "Do",
    "Log",
    "Send",
    "Stop",
    "Tell",
]


Metric = Literal["loop", "intervention", "plugin_asked", "plugin_refused", "malformed", "spent"]


@dataclass(frozen=True, slots=True)
class Count:
    """Add to a metric (`Metrics.<metric>(*labels)`)."""

    metric: Metric
    labels: tuple[str | int | float | None, ...] = ()


@dataclass(frozen=True, slots=True)
class Do:
    """Carry out intervention `number`'s `command` (`monitor.core.intervention`: read,
    abort, post, answer, wait), after the interventions of `session_id` begun before it, and
    feed what came of it to `Monitor.happened`, whose commands may hold the next `Do` of the
    same `number`. `said` (its `loop.detected`) is written once its first request
    (other than a read sent at once) is answered, or a moment after it begins, whichever
    comes first."""

    number: int
    session_id: str
    command: life.Command
    said: tuple[Log, ...] = ()


@dataclass(frozen=True, slots=True)
class Send:
    """Send an answer to a permission request that is no intervention of its own (an
    approval, or the refusal of a call of a loop another intervention stands for), at once,
    behind nothing."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Await:
    """Wait `deadline.wait` seconds, then feed `Monitor.overdue(deadline)`."""

    deadline: Deadline


@dataclass(frozen=True, slots=True)
class Log:
    """Write one log line: names, ids and counts only (never an argument or an output)."""

    level: Literal["debug", "info", "warning", "error"]
    event: str
    fields: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Tell:
    """Show how an intervention ended to the person (a toast in the TUI) and, with `notify`,
    send it to the webhook."""

    decision: Intervene
    outcome: Outcome
    notify: bool


@dataclass(frozen=True, slots=True)
class Stop:
    """Nothing is left to follow (the one session `attach` followed was deleted)."""


Command = Do | Send | Await | Count | Log | Tell | Stop
