"""Telling a person: a JSON POST to `--notify-url` on every intervention and every hold.

A held session waits for someone, and nobody reads the journal all day; a chat webhook
reaches them. The body carries a `text` line (what Slack, Mattermost and ntfy's templates
show) and the same facts as fields for scripts: session, directory, rule, tools, outcome.
Never an argument, an output or the feedback text.

Delivery runs in tasks of its own, with a timeout and a few retries, on an HTTP session of
its own (the OpenCode password must never reach the webhook). A slow or failing webhook
therefore never delays an abort: `send` returns at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from monitor.core.decisions import Intervene, Outcome
from monitor.shell.backoff import Backoff

log = structlog.get_logger("monitor.shell.webhook")

_SAID: dict[str, str] = {
    "aborted": "was stopped; the model was told why and carries on",
    "held": "was stopped and put on hold: it waits for a person to read the feedback and go on",
    "abort_failed": "could not be stopped (the abort failed)",
    "dry_run": "was left running (dry run)",
}


@dataclass(frozen=True, slots=True)
class Delivery:
    attempts: int = 3
    timeout: float = 5.0
    backoff: Backoff = Backoff(initial=1.0, cap=5.0)


def notification(decision: Intervene, outcome: Outcome) -> dict[str, Any]:
    """The JSON body for one intervention (ids, names and counts only)."""
    length, repetitions, tools = decision.finding.shape()
    where = f" in {decision.directory}" if decision.directory else ""
    text = (
        f"opencode-loop-monitor: session {decision.session_id}{where} looped "
        f"({decision.finding.describe()}) and {_SAID.get(outcome, outcome)}"
    )
    return {
        "text": text,
        "event": "hold" if outcome == "held" else "intervention",
        "session_id": decision.session_id,
        "directory": decision.directory,
        "rule": str(decision.rule),
        "tools": list(tools),
        "cycle_length": length,
        "repetitions": repetitions,
        "interventions": decision.prior_interventions + 1,
        "outcome": str(outcome),
    }


class Webhook:
    """Posts notifications to `url` in the background; `close` waits for them briefly."""

    def __init__(
        self,
        url: str,
        delivery: Delivery = Delivery(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._url = url
        self._delivery = delivery
        self._sleep = sleep
        self._http: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def send(self, decision: Intervene, outcome: str) -> None:
        task = asyncio.create_task(self._post(notification(decision, outcome)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self, timeout: float) -> None:
        """Give posts under way up to `timeout` seconds, then drop them; close the session."""
        if self._pending:
            _, late = await asyncio.wait(set(self._pending), timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _post(self, body: dict[str, Any]) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        delivery = self._delivery
        for attempt in range(delivery.attempts):
            error = await self._post_once(self._http, body)
            if error is None:
                return
            permanent = error.startswith("4")  # the webhook refuses this body: retry is futile
            if permanent or attempt + 1 == delivery.attempts:
                # The URL is left out: a chat webhook's URL is its secret.
                log.warning(
                    "webhook.failed",
                    session_id=body["session_id"],
                    outcome=body["outcome"],
                    attempts=attempt + 1,
                    error=error,
                )
                return
            await self._sleep(delivery.backoff.delay(attempt))

    async def _post_once(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> str | None:
        """None when delivered, else what went wrong (a status or an error type)."""
        try:
            async with http.post(
                self._url, json=body, timeout=aiohttp.ClientTimeout(total=self._delivery.timeout)
            ) as response:
                if response.status < 300:
                    return None
                return str(response.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return type(exc).__name__
