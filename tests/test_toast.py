"""The toasts at the TUI: which outcomes are shown, what they say, and refusals paced per
session."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from monitor.core.decisions import Intervene, Outcome
from monitor.core.feedback import MARK
from monitor.core.findings import CallCycle
from monitor.core.server import ServerKind
from monitor.shell.api_v2 import EngineAPI
from monitor.shell.toast import REFUSAL_INTERVAL_S, Toasts, toast_body
from tests.harness import events


def decision(session_id: str = "ses_1") -> Intervene:
    return Intervene(
        session_id=session_id,
        directory="/w",
        finding=CallCycle(("read", "bash"), 3),
        part_id="prt_6",
        call_index=6,
        prior_interventions=0,
        hold=False,
        escalated=False,
        feedback=MARK + "x",
    )


@pytest.mark.parametrize(
    ("outcome", "said", "variant"),
    [
        (
            Outcome.BLOCKED,
            "its call was refused before it ran (by the plugin); the model was told why and "
            "carries on",
            "warning",
        ),
        (
            Outcome.REJECTED,
            "its call was refused before it ran (its permission request); the model was told "
            "why and carries on",
            "warning",
        ),
        (Outcome.ABORTED, "was stopped; the model was told why and carries on", "warning"),
        (
            Outcome.HELD,
            "was stopped and put on hold: it waits for a person to read the feedback and go on",
            "error",
        ),
    ],
)
def test_a_toast_names_the_session_the_calls_the_outcome_and_the_rule(outcome, said, variant):
    assert toast_body(decision(), outcome) == {
        "title": "opencode-loop-monitor",
        "message": "opencode-loop-monitor: session ses_1 in /w looped (2 calls (read, bash) "
        f"repeated 3 times) and {said} (rule: cycle, call 6)",
        "variant": variant,
    }


@pytest.mark.parametrize(
    "outcome",
    [Outcome.NUDGED, Outcome.ANSWERED, Outcome.DRY_RUN, Outcome.DEFERRED, Outcome.CANCELLED],
)
def test_what_asks_nothing_of_the_person_is_not_toasted(outcome):
    assert toast_body(decision(), outcome) is None


class Api:
    """Stands in for OpencodeAPI.show_toast: records the bodies, answers True."""

    shows_toasts = True

    def __init__(self) -> None:
        self.bodies: list[tuple[str | None, dict[str, Any]]] = []

    async def show_toast(self, directory: str | None, body: dict[str, Any]) -> bool:
        self.bodies.append((directory, body))
        return True


async def test_refusals_are_toasted_once_per_session_per_interval():
    api, now = Api(), [1000.0]
    toasts = Toasts(api, clock=lambda: now[0])  # type: ignore[arg-type]
    with capture_logs() as logs:
        toasts.show(decision("ses_1"), Outcome.BLOCKED)
        toasts.show(decision("ses_1"), Outcome.REJECTED)  # within the interval: skipped
        toasts.show(decision("ses_2"), Outcome.BLOCKED)  # another session: its own
        toasts.show(decision("ses_1"), Outcome.HELD)  # not a refusal: never paced
        now[0] += REFUSAL_INTERVAL_S - 0.1
        toasts.show(decision("ses_1"), Outcome.BLOCKED)  # still within
        now[0] += 0.1
        toasts.show(decision("ses_1"), Outcome.BLOCKED)  # the interval is over
        await asyncio.gather(*toasts._tasks)
    # Posted in the order shown (each its own task, started in turn).
    expected = [
        toast_body(decision("ses_1"), Outcome.BLOCKED),
        toast_body(decision("ses_2"), Outcome.BLOCKED),
        toast_body(decision("ses_1"), Outcome.HELD),
        toast_body(decision("ses_1"), Outcome.BLOCKED),
    ]
    assert api.bodies == [("/w", body) for body in expected]
    skipped = [(e["session_id"], e["outcome"]) for e in events(logs, "toast.skipped")]
    assert skipped == [("ses_1", "rejected"), ("ses_1", "blocked")]


def test_the_hold_toast_counts_earlier_interventions_by_name():
    # The trial's hold toast: the first thing the person saw; two of its three were refusals.
    held = dataclasses.replace(
        decision(),
        prior_interventions=2,
        hold=True,
        prior_outcomes=(Outcome.BLOCKED, Outcome.BLOCKED),
    )
    body = toast_body(held, Outcome.HELD)
    assert body is not None
    assert body["message"].endswith(
        "was stopped and put on hold: it waits for a person to read the feedback and go on "
        "(rule: cycle, call 6; before: 2 calls refused)"
    )


async def test_a_2x_server_is_sent_no_toast_it_has_no_route_for():
    # 2.2.5 has no TUI route: the toast went to its web app, answered 405, at every
    # intervention (seen on the real server: toast.failed "refused (405)").
    async with aiohttp.ClientSession() as http:
        api = EngineAPI(http, "http://127.0.0.1:9")  # never asked
        api.server = ServerKind(classic=False, engine=True, version="2.2.5", generation=2)
        toasts = Toasts(api)
        toasts.show(decision(), Outcome.HELD)
        assert toasts._tasks == set()
        # 1.x, 1.18.33 with its new engine too: the TUI's route is there.
        for kind in (ServerKind(True, False), ServerKind(True, True, "1.18.33")):
            api.server = kind
            assert api.shows_toasts
