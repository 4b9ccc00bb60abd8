"""Telling a person: a JSON POST to `--notify-url` on every intervention and every hold.

A held session waits for someone, and nobody reads the journal all day; a chat webhook
reaches them. The body carries a `text` line (what Slack, Mattermost and ntfy's templates
show) and the same facts as fields for scripts: session, directory, rule, tools, outcome.
Never an argument, an output or the feedback text.

Delivery runs in tasks of its own, with a timeout and a few retries, on an HTTP session of
its own (the OpenCode password must never reach the webhook). A slow or failing webhook
therefore never delays an abort: `send` returns at once.

At most once: a post is sent again only when it surely did not arrive (no connection) or the
receiver answered that it failed (5xx, 429); never after a timeout or a dropped connection.
Each body carries an `id`, the same for every copy (and for every monitor that notifies the
same intervention), for a receiver to deduplicate on. The timeout counts from the moment the
post has a connection, never the wait for one of the `connections` in the pool. Every
notification given up at shutdown is counted in one `webhook.dropped` line.

Names come from the stream: they are cleaned as the feedback cleans them, and the `text`
is escaped for chat (`<`, `>`, `&` as Slack wants them, `@` kept from starting a mention).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from monitor.core.decisions import Intervene, Outcome
from monitor.core.feedback import clean_tool_name
from monitor.shell.backoff import Backoff

__all__ = ["Delivery", "Webhook", "notification"]

log = structlog.get_logger("monitor.shell.webhook")

_SAID: dict[Outcome, str] = {
    Outcome.ABORTED: "was stopped; the model was told why and carries on",
    Outcome.HELD: (
        "was stopped and put on hold: it waits for a person to read the feedback and go on"
    ),
    Outcome.BLOCKED: (
        "its call was refused before it ran (by the plugin); the model was told why and carries on"
    ),
    Outcome.REJECTED: (
        "its call was refused before it ran (its permission request); the model was told why "
        "and carries on"
    ),
    Outcome.NUDGED: "the model was warned; its run goes on",
    Outcome.ABORT_FAILED: "could not be stopped (the abort failed)",
    Outcome.DRY_RUN: "was left running (dry run)",
}


DIRECTORY_MAX = 256
# Statuses that say the receiver did not take the post: sending it again is no duplicate.
_RETRIED = range(500, 600)
_TOO_MANY = 429


@dataclass(frozen=True, slots=True)
class Delivery:
    attempts: int = 3
    timeout: float = 5.0
    backoff: Backoff = Backoff(initial=1.0, cap=5.0)
    connections: int = 10


def for_chat(text: str) -> str:
    """`text` safe in a chat message: no `<!channel>`, `<url|link>` or `@here` from a name."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return escaped.replace("@", "@\u2060")  # a word joiner: `@channel` stays text


def notification_id(decision: Intervene, outcome: Outcome) -> str:
    """The same for every copy of one notification, in every monitor that sends it."""
    key = "\0".join((decision.session_id, decision.part_id, str(decision.call_index), outcome))
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:32]


def notification(decision: Intervene, outcome: Outcome) -> dict[str, Any]:
    """The JSON body for one intervention (ids, cleaned names and counts only)."""
    length, repetitions, names = decision.finding.shape()
    tools = [clean_tool_name(tool) for tool in names]
    directory = None
    if decision.directory is not None:
        directory = clean_tool_name(decision.directory, DIRECTORY_MAX)
    where = f" in {directory}" if directory else ""
    text = (
        f"opencode-loop-monitor: session {decision.session_id}{where} looped "
        f"({decision.finding.describe()}) and {_SAID.get(outcome, outcome)}"
    )
    return {
        "id": notification_id(decision, outcome),
        "text": for_chat(text),
        "event": "hold" if outcome == Outcome.HELD else "intervention",
        "session_id": decision.session_id,
        "directory": directory,
        "rule": str(decision.rule),
        "tools": tools,
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

    def send(self, decision: Intervene, outcome: Outcome) -> None:
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
            if late:
                # Some may have reached the receiver; none is tried again.
                log.warning("webhook.dropped", count=len(late), reason="shutdown")
        if self._http is not None:
            await self._http.close()

    async def _post(self, body: dict[str, Any]) -> None:
        delivery = self._delivery
        if self._http is None:
            connector = aiohttp.TCPConnector(limit=delivery.connections)
            self._http = aiohttp.ClientSession(connector=connector)
        for attempt in range(delivery.attempts):
            error, again = await self._post_once(self._http, body)
            if error is None:
                return
            if not again or attempt + 1 == delivery.attempts:
                # The URL is left out: a chat webhook's URL is its secret.
                log.warning(
                    "webhook.failed",
                    session_id=body["session_id"],
                    outcome=body["outcome"],
                    id=body["id"],
                    attempts=attempt + 1,
                    error=error,
                )
                return
            await self._sleep(delivery.backoff.delay(attempt))

    async def _post_once(
        self, http: aiohttp.ClientSession, body: dict[str, Any]
    ) -> tuple[str | None, bool]:
        """(None when delivered, else what went wrong; whether a second copy may go)."""
        timeout = self._delivery.timeout
        try:
            async with http.post(
                self._url,
                json=body,
                headers={"Idempotency-Key": body["id"]},
                allow_redirects=False,  # a redirect could carry the body anywhere
                # No total and no pool-wait limit: a post waiting for a connection was not
                # sent, and timing it out there would make a second copy of one that then goes.
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=None, sock_connect=timeout, sock_read=timeout
                ),
            ) as response:
                if response.status < 300:
                    return None, False
                status = response.status
                return str(status), status in _RETRIED or status == _TOO_MANY
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            return type(exc).__name__, True  # never connected: it surely did not arrive
        except (TimeoutError, aiohttp.ServerTimeoutError):
            return "timeout", False
        except aiohttp.ClientError as exc:
            return type(exc).__name__, False
