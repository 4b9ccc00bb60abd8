"""Which model step a session is in, from the stream and from the plugin's questions that
overtake it (`SessionRecord.at_step`), and whether the standing intervention was decided on a
step the stream has not shown yet (`SessionRecord.ahead_of_stream`): a run end the stream
carries before that step is of a run before it (issue 43)."""

from __future__ import annotations

import pytest

from monitor.core.session import Acted, SessionRecord
from tests.test_wait_life import DECISION


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
