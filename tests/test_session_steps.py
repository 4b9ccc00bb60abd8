"""Which model step a session is in, from the stream and from the plugin's questions that
overtake it (`SessionRecord.at_step`), and whether the standing intervention was decided on a
step the stream has not shown yet (`SessionRecord.ahead_of_stream`): a run end the stream
carries before that step is of a run before it (issue 43)."""

from __future__ import annotations

import pytest

from monitor.core.calls import CallEvent, advance
from monitor.core.decisions import Intervene
from monitor.core.findings import CallCycle
from monitor.core.session import PLUGIN_PART, Acted, Call, SessionRecord

DECISION = Intervene("ses_1", None, CallCycle(("read",), 4), "p4", 4, 0, False, False, "stop")


def _acted_at(session: SessionRecord, step: str) -> SessionRecord:
    session.acted = Acted(DECISION, frozenset({1}), step)
    return session


def test_a_question_about_a_step_not_shown_is_ahead_until_the_stream_shows_it():
    session = SessionRecord()
    session.at_step("s1")
    session.at_step("s2", asked=True)
    assert (session.step, session.ahead, session.past_steps) == ("s2", "s2", ("s1",))
    session.at_step("s2", asked=True)  # the step's next question
    assert session.ahead == "s2"
    session.at_step("s1")  # an earlier step's late update: neither moves
    assert (session.step, session.ahead) == ("s2", "s2")
    session.at_step("s2")
    assert (session.step, session.ahead) == ("s2", None)


def test_a_question_about_a_step_the_stream_showed_is_not_ahead():
    session = SessionRecord()
    session.at_step("s1")
    session.at_step("s1", asked=True)
    assert session.ahead is None


@pytest.mark.parametrize(
    ("steps", "acted_step", "ahead"),
    [
        ((("s1", True),), "s1", True),  # decided on the question, the stream behind
        ((("s1", True), ("s1", False)), "s1", False),  # the stream caught up
        ((("s1", False),), "s1", False),  # decided on the stream
        ((("s1", True), ("s2", True)), "s1", False),  # a later step asked since
    ],
)
def test_an_intervention_stands_past_a_run_end_only_while_its_step_is_ahead(
    steps, acted_step, ahead
):
    session = SessionRecord()
    for step, asked in steps:
        session.at_step(step, asked=asked)
    assert _acted_at(session, acted_step).ahead_of_stream() is ahead


def test_no_intervention_is_not_ahead():
    session = SessionRecord()
    session.at_step("s1", asked=True)
    assert session.ahead_of_stream() is False


@pytest.mark.parametrize(("asked_ahead", "state"), [(True, "asked"), (False, "late")])
def test_a_run_end_leaves_a_call_asked_ahead_of_the_stream_to_its_part(asked_ahead, state):
    """The server writes a call's part before its run's idle: a call the plugin asked about
    in a step the stream has not shown is of a later run than the one the stream ends."""
    session = SessionRecord()
    session.at_step("s1")
    if asked_ahead:
        session.at_step("s2", asked=True)
    asked = Call(f"{PLUGIN_PART}1", "bash", 7, None, call_id="call_0")
    advance(asked, CallEvent.ASK)
    session.start(asked)
    session.end_calls()
    assert asked.state == state
    assert session.claim("prt_9", "call_0", "bash") is (asked if asked_ahead else None)
