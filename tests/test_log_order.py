"""When `loop.detected` is written: after the loop's read and abort are on their way (the
line costs the abort nothing), within `SAY_WITHIN_S` when the server is slow, and always
before the intervention's other lines."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from structlog.testing import capture_logs

from monitor.core.decisions import Intervene, Plan
from monitor.kit.poll import until
from monitor.shell.actions import SAY_WITHIN_S
from tests.harness import Carrier, held_decision


class RecordingAPI:
    """The executor's API, answering at once (or the read never): each call notes the log
    lines written before it."""

    def __init__(self, logs: list[dict[str, Any]], read_hangs: bool = False) -> None:
        self.logs = logs
        self.read_hangs = read_hangs
        self.calls: list[tuple[str, list[str]]] = []

    def _note(self, name: str) -> None:
        self.calls.append((name, [line["event"] for line in self.logs]))

    async def messages(self, *args: object, **kwargs: object) -> list[object]:
        self._note("messages")
        if self.read_hangs:
            await asyncio.Event().wait()
        return []

    async def abort(self, *args: object, **kwargs: object) -> None:
        self._note("abort")

    async def prompt(self, *args: object, **kwargs: object) -> None:
        self._note("prompt")


def loop() -> Intervene:
    return dataclasses.replace(held_decision(), plan=Plan.REFUSE, hold=False, escalated=False)


def interventions(api: RecordingAPI) -> Carrier:
    return Carrier(api, stagger=lambda: 0.0)


async def test_the_read_and_the_abort_go_out_before_the_line_that_says_why() -> None:
    with capture_logs() as logs:
        api = RecordingAPI(logs)
        actions = interventions(api)
        actions.submit(loop())
        await actions.drain(5)
    assert api.calls[:2] == [("messages", []), ("abort", [])]
    events = [line["event"] for line in logs]
    assert events.index("loop.detected") < events.index("intervention.outcome")
    assert events.count("loop.detected") == 1


async def test_a_read_the_server_does_not_answer_does_not_hide_the_line() -> None:
    loop_clock = asyncio.get_running_loop()
    with capture_logs() as logs:
        api = RecordingAPI(logs, read_hangs=True)
        actions = interventions(api)
        submitted = loop_clock.time()
        actions.submit(loop())
        await until(lambda: any(line["event"] == "loop.detected" for line in logs), 5, 0.005)
        said = loop_clock.time()
        assert api.calls == [("messages", [])]  # the read is on its way, unanswered
        assert said - submitted >= SAY_WITHIN_S * 0.9
        await actions.drain(0)
    assert [line["event"] for line in logs] == ["loop.detected", "intervention.outcome"]
    assert logs[-1]["outcome"] == "cancelled"
