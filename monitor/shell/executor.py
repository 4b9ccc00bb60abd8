"""Carries out `Monitor`'s commands, in order, as they are: an intervention's request, a
permission request answered, a metric counted, a line logged, a timer started, a person told.

It asks nothing and decides nothing: whether this monitor acts for a session is `Monitor`'s
word (`Monitor.role`, fed from the lock the shell holds), as is everything else."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from monitor.core.commands import Await, Command, Count, Do, Log, Send, Stop, Tell
from monitor.core.decisions import Deadline
from monitor.shell.actions import Interventions
from monitor.shell.metrics import Metrics
from monitor.shell.toast import Toasts
from monitor.shell.webhook import Webhook

__all__ = ["Executor"]

log = structlog.get_logger("monitor.shell.watch")


class Executor:
    """Counts and logs from the start; acts once `acting_through` has given it the
    interventions, the toasts and the timers (no decision comes before: the plugin's
    questions are not judged before the first connect's resync)."""

    def __init__(
        self,
        metrics: Metrics | None,
        webhook: Webhook | None,
        stop: Callable[[], None],
    ) -> None:
        self._interventions: Interventions | None = None
        self._toasts: Toasts | None = None
        self._wait: Callable[[Deadline], None] | None = None
        self._metrics = metrics
        self._webhook = webhook
        self._stop = stop

    def acting_through(
        self, interventions: Interventions, toasts: Toasts, wait: Callable[[Deadline], None]
    ) -> None:
        """What carries out interventions, toasts and waits, once watching has begun."""
        self._interventions = interventions
        self._toasts = toasts
        self._wait = wait

    def __call__(self, commands: Sequence[Command]) -> None:
        for command in commands:
            match command:
                case Count(metric, labels):
                    if self._metrics is not None:
                        getattr(self._metrics, metric)(*labels)
                case Log(level, event, fields):
                    getattr(log, level)(event, **fields)
                case Stop():
                    self._stop()
                case _:
                    self._act(command)

    def _act(self, command: Do | Send | Await | Tell) -> None:
        interventions, toasts, wait = self._interventions, self._toasts, self._wait
        assert interventions is not None and toasts is not None and wait is not None
        match command:
            case Do():
                interventions.begin(command)
            case Send(reply):
                interventions.send(reply)
            case Await(deadline):
                wait(deadline)
            case Tell(decision, outcome, notify):
                toasts.show(decision, outcome)  # returns at once: posting runs apart
                if notify and self._webhook is not None:
                    self._webhook.send(decision, outcome)
