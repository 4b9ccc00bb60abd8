"""Issue 47: every refusal's text describes the finding that made it, never an earlier one of
the session; and no text the model reads holds a name it could take for a tool to call.

Each path a refusal's text takes to the model (the plugin's block, a refused permission
request, a refused `doom_loop` request, a refusal waiting for the session's next call, the
posted feedback of a hold) is driven after an earlier, different loop of the same session;
every text is held to its own decision's finding and to none of the others', and the last
one to what the scenario's last call did; and, for any order of calls, bursts and run ends,
each block the plugin throws to the call it refused. The real model's case: after a loop of 4 calls
(bash, edit, read, write) was refused, a single `git pull` was refused "4 calls (bash, edit,
read, write) repeated 3 times"."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core import feedback
from monitor.core.decisions import Intervene, Outcome, Plan
from monitor.core.findings import CallCycle, FailureRun, LoopAgain, NoProgress, RunawayCall
from monitor.core.plugin_protocol import PluginCall
from monitor.core.tracker import Detection, Tracker
from tests.frames_factory import tool_part

S = "ses_1"
PULL = ("bash", {"command": "git pull", "description": "pull"})
CYCLE = [
    PULL,
    ("edit", {"filePath": "a.py", "oldString": "x", "newString": "y"}),
    ("read", {"filePath": "a.py"}),
    ("write", {"filePath": "b.py", "content": "z"}),
]
FIRST = "4 calls (bash, edit, read, write) repeated 3 times"

# What the model read, and the decision it was written for.
Said = tuple[Intervene, str]


class Session:
    """One session's calls, by the plugin's questions or by permission requests, and every
    text the model reads: each with its decision, carried out as the shell reports it."""

    def __init__(self, detection: Detection = Detection()) -> None:
        self.tracker = Tracker(detection, directory="/p")
        self.n = 0
        self.said: list[Said] = []
        self.decisions: list[Intervene] = []

    def _frames(self, n: int, tool: str, args: dict[str, Any], status: str) -> dict:
        output = "ok" if status == "completed" else None
        error = "exit 1" if status == "error" else None
        call, step = f"call_{n}", f"msg_{n}"
        return tool_part(S, f"prt_{n}", tool, status, args, output, error, call, step)

    def _feed(self, frame: dict) -> None:
        fed = self.tracker.feed(frame)
        for decision in fed.decisions:
            self.decisions.append(decision)
            if decision.plan is not Plan.DEFER and not decision.refused:
                self.said.append((decision, decision.feedback))  # posted after the abort
        for reply in fed.replies:
            if reply.loop is not None:
                self.decisions.append(reply.loop)
                self.tracker.outcome(reply.loop, Outcome.REJECTED)  # an abort stays under way
                assert reply.message is not None
                self.said.append((reply.loop, reply.message))
                if reply.loop.plan in (Plan.STOP, Plan.HOLD):
                    self.said.append((reply.loop, reply.loop.feedback))

    def asked(
        self, call: tuple[str, dict[str, Any]], status: str = "completed", same_step: bool = False
    ) -> Said | None:
        """A call the plugin asks about first (a model step of its own, or of the step of the
        call before); blocked, its end is the plugin's error. Returns the block's text."""
        self.n += 1
        tool, args = call
        step = f"msg_{self.n - 1 if same_step else self.n}"
        judged = self.tracker.judge(
            PluginCall(S, f"call_{self.n}", tool, args, "/p", message_id=step)
        )
        decision = judged.decision
        blocked = judged.verdict.verdict == "block"
        if decision is not None:
            self.decisions.append(decision)
            self.tracker.outcome(decision, Outcome.BLOCKED if blocked else Outcome.NUDGED)
        block = None
        if blocked:
            assert decision is not None and judged.verdict.feedback is not None
            block = decision, judged.verdict.feedback
            self.said.append(block)
            if decision.plan in (Plan.STOP, Plan.HOLD):
                self.said.append((decision, decision.feedback))
            status = "error"
        for state in ("running", status):
            self._feed(self._frames(self.n, tool, args, state))
        return block

    def permitted(self, call: tuple[str, dict[str, Any]], asks: bool = True) -> None:
        """A call on the stream that asks permission (`asks`), answered once unless refused;
        no plugin asks."""
        self.n += 1
        tool, args = call
        self._feed(self._frames(self.n, tool, args, "running"))
        if asks:
            before = len(self.said)
            self._feed(_permission(self.n, tool))
            if len(self.said) > before:
                self._feed(self._frames(self.n, tool, args, "error"))
                return
            self._feed(_replied(f"per_{self.n}"))
        self._feed(self._frames(self.n, tool, args, "completed"))

    def doom_loop(self, call: tuple[str, dict[str, Any]]) -> None:
        """OpenCode's own check asks about the last calls of this step, all `call`."""
        self._feed(_doom_loop(*call))


def _permission(n: int, tool: str) -> dict:
    return {
        "type": "permission.asked",
        "properties": {
            "id": f"per_{n}",
            "sessionID": S,
            "permission": tool,
            "patterns": ["*"],
            "metadata": {},
            "always": ["*"],
            "tool": {"messageID": f"msg_{n}", "callID": f"call_{n}"},
        },
    }


def _doom_loop(tool: str, args: dict[str, Any]) -> dict:
    return {
        "type": "permission.asked",
        "properties": {
            "id": "per_doom",
            "sessionID": S,
            "permission": "doom_loop",
            "patterns": [tool],
            "metadata": {"tool": tool, "input": args},
            "always": [tool],
            "tool": None,
        },
    }


def _replied(request: str) -> dict:
    return {
        "type": "permission.replied",
        "properties": {"sessionID": S, "requestID": request, "reply": "once"},
    }


def plugin_armed_call(session: Session) -> None:
    """The real model's case: the loop's 12th call refused, then its `git pull` alone."""
    for _ in range(3):
        for call in CYCLE:
            session.asked(call)
    session.asked(PULL)


def plugin_armed_call_held(session: Session) -> None:
    """As above, the `git pull` made until the ladder holds the session (posted feedback)."""
    plugin_armed_call(session)
    session.asked(PULL)


def plugin_burst_in_the_refused_step(session: Session) -> None:
    """The step whose call was refused asks for a `git pull` too: that refusal again
    (`Plan.DEFER`), in words for this call."""
    for _ in range(3):
        for call in CYCLE:
            session.asked(call)
    session.asked(PULL, same_step=True)
    assert session.decisions[-1].plan is Plan.DEFER


def permission_armed_call(session: Session) -> None:
    """No plugin; every call asks permission: the `git pull`'s request is refused."""
    for _ in range(3):
        for call in CYCLE:
            session.permitted(call)
    session.permitted(PULL)


def doom_loop_in_the_stopped_step(session: Session) -> None:
    """No plugin, no call asks: the loop is being aborted when the server's own check asks
    about the step's repeated `git pull`, one of that loop's calls (`Plan.DEFER`)."""
    for _ in range(3):
        for call in CYCLE:
            session.permitted(call, asks=False)
    session.doom_loop(PULL)
    assert session.decisions[-1].plan is Plan.DEFER


def failure_after_the_loop(session: Session) -> None:
    """A failure loop found after its call ran waits for the session's next call, which is
    refused with it (`plan.withhold`): the failure, not the loop refused before."""
    for _ in range(3):
        for call in CYCLE:
            session.asked(call)
    session.asked(("read", {"filePath": "c.py"}))  # a new step: the block is carried out
    for n in range(4):
        session.asked(("bash", {"command": f"make {n}"}), status="error")
    session.asked(("read", {"filePath": "d.py"}))


def failure_again(session: Session) -> None:
    """The stopped failure made again with other arguments, refused at the next call."""
    failure_after_the_loop(session)
    session.asked(("bash", {"command": "make 9"}), status="error")
    session.asked(("read", {"filePath": "e.py"}))


AGAIN = "bash with the same arguments again, a call of the loop interrupted before"

# Each path, the detection it needs, and what the last text must describe.
CASES: dict[str, tuple[Callable[[Session], None], Detection, str]] = {
    "plugin_armed_call": (plugin_armed_call, Detection(), AGAIN),
    "plugin_armed_call_held": (plugin_armed_call_held, Detection(max_interventions=2), AGAIN),
    "plugin_burst_in_the_refused_step": (plugin_burst_in_the_refused_step, Detection(), AGAIN),
    "permission_armed_call": (permission_armed_call, Detection(permissions="gate"), AGAIN),
    "doom_loop_in_the_stopped_step": (
        doom_loop_in_the_stopped_step,
        Detection(permissions="gate"),
        "1 call (bash) repeated 3 times",
    ),
    "failure_after_the_loop": (
        failure_after_the_loop,
        Detection(),
        "the same error 4 times in a row (bash)",
    ),
    "failure_again": (
        failure_again,
        Detection(),
        "the same error from bash again, the failure of the loop interrupted before",
    ),
}


def held_to_own(session: Session) -> None:
    """Every text the session's model read describes its own decision's finding, and no
    other finding of the session."""
    found = {decision.finding.describe() for decision in session.decisions}
    for decision, text in session.said:
        own = decision.finding.describe()
        assert own in text, (own, text)
        for other in found - {own}:
            assert other not in text, (other, text)


@pytest.mark.parametrize("name", CASES)
def test_every_refusal_text_describes_its_own_finding(name: str) -> None:
    scenario, detection, last = CASES[name]
    session = Session(detection)
    scenario(session)
    assert len(session.said) >= 2, "the scenario refuses twice"
    assert FIRST in {decision.finding.describe() for decision in session.decisions}
    held_to_own(session)
    decision, text = session.said[-1]
    assert decision.finding.describe() == last and last in text
    assert FIRST not in text


def test_a_call_of_an_armed_loop_is_that_loop_on_the_ladder_and_in_the_logs() -> None:
    """Its own words, but the loop's rule, shape and metric label: it continues that loop."""
    session = Session()
    plugin_armed_call(session)
    first, again = session.decisions[-2], session.decisions[-1]
    assert isinstance(again.finding, LoopAgain) and again.finding.loop == first.finding
    assert (again.rule, again.finding.shape()) == (first.rule, first.finding.shape())
    assert again.prior_interventions == first.prior_interventions + 1
    assert again.fields()["finding"] == AGAIN


# The calls a session may make in any order: the loop's four, and a failing `make` whose
# arguments change (its loop is a `failure`, found after it ran).
ALPHABET = [*CYCLE, ("bash", {"command": "make"})]
# A refusal for what the calls before it did (`plan.withhold`): it names their finding.
AFTER = feedback.MARK + "this call was refused and did not run, because of what your last"


def refused_tool(finding: object) -> str | None:
    """The tool of the call that a finding says is refused (None: it names no one call)."""
    if isinstance(finding, LoopAgain):
        return finding.tool
    if isinstance(finding, CallCycle):
        return finding.tools[-1]  # the call that would have completed the block
    return None


# A move: the loop's four calls in order, one call of the alphabet (in a step of its own, or in
# the step of the call before), or the run's end.
MOVES = st.one_of(
    st.just(("loop", 0)),
    st.tuples(st.sampled_from(["step", "burst"]), st.integers(0, len(ALPHABET) - 1)),
    st.just(("end", 0)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(MOVES, max_size=20))
def test_every_block_describes_the_call_it_refused(moves: list[tuple[str, int]]) -> None:
    """Any order of the loop's calls, failures, bursts and run ends: each text describes its
    own finding and no other, and a block's finding is of the call it refused (a `git pull`
    is never refused as a block that ends with `write`)."""
    session = Session()
    for move, index in moves:
        if move == "end":
            session.tracker.end_run(S)
            continue
        for tool, args in CYCLE if move == "loop" else [ALPHABET[index]]:
            failing = args.get("command") == "make"
            if failing:
                args = {"command": f"make {session.n}"}
            status = "error" if failing else "completed"
            block = session.asked((tool, args), status, same_step=move == "burst")
            if block is None:
                continue
            decision, text = block
            if not text.startswith(AFTER):
                assert refused_tool(decision.finding) in (tool, None), (tool, text)
            if decision.plan in (Plan.STOP, Plan.HOLD):
                session.tracker.end_run(S)  # aborted
    held_to_own(session)


# -- no name a model could take for a tool ------------------------------------------------------

# What a tool's name looks like to a model: one token of lower-case words joined by hyphens
# or underscores (`loop-guard`, `opencode-loop-monitor`, `read_file`). Plain words, numbers and
# a tool named as what was repeated ("1 call (bash)") are not.
TOOL_LIKE = re.compile(r"\b[a-z][a-z0-9]*(?:[-_][a-z0-9]+)+\b")

TEXTS_FOR = [
    CallCycle(("bash", "edit", "read", "write"), 3),
    LoopAgain("bash", CallCycle(("bash",), 4)),
    FailureRun("bash", 4),
    NoProgress("bash", 5, 4),
    RunawayCall("bash", seconds=60),
]


def every_text() -> list[str]:
    texts = [feedback.OWN_REFUSAL]
    for finding in TEXTS_FOR:
        for hold in (False, True):
            texts.append(feedback.feedback_text(finding, hold, 3, (Outcome.BLOCKED,)))
            texts.append(feedback.rejection_text(finding, hold, 3, (Outcome.BLOCKED,)))
        texts.append(feedback.refusal_after_text(finding, 2))
        texts.append(feedback.nudge_text(finding, 1))
    return texts


def test_the_tool_like_pattern_finds_what_models_called() -> None:
    """The names a real model called as tools, copied from the feedback (issue 47's study)."""
    said = "[opencode-loop-monitor] Loop guard: call loop-guard or read_file; 1 call (bash)"
    assert TOOL_LIKE.findall(said) == ["opencode-loop-monitor", "loop-guard", "read_file"]


def test_no_text_holds_a_name_a_model_could_take_for_a_tool() -> None:
    found = {name for text in every_text() for name in TOOL_LIKE.findall(text)}
    assert found == set()


def test_the_second_refusal_is_not_a_copy_of_the_first() -> None:
    """Tiers: the first refusal gives the finding's own step, the second a firmer one, which
    counts the session's interventions (the first step did not work)."""
    session = Session()
    plugin_armed_call(session)
    (first, first_text), (second, second_text) = session.said
    assert (first.prior_interventions, second.prior_interventions) == (0, 1)
    assert first_text == (
        feedback.MARK + "this call was refused and did not run: it would have completed a loop, "
        f"{FIRST} with the same arguments.\n\n" + feedback._CALL_STEP
    )
    assert second_text == (
        feedback.MARK + f"this call was refused and did not run: {AGAIN}.\n\nYour calls in this "
        "session have now been stopped 2 times. Do not call a tool now: reply to the person "
        "with what you have done so far and what is blocking you."
    )
