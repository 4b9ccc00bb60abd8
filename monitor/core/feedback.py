"""The corrective message the model reads after its looping run was stopped.

Written for the model, not for people: short, names the shape of the loop (never an argument
or an output, which could be large or secret), and asks for a different approach or a clear
statement of what blocks it.
"""

from __future__ import annotations

from collections.abc import Sequence

from monitor.core.decisions import Outcome
from monitor.core.findings import (
    TOOL_NAME_MAX,
    BudgetSpent,
    EndlessWait,
    FailureRun,
    Finding,
    LoopAgain,
    NoProgress,
    Revisit,
    RunawayCall,
    SearchCircles,
    TextPassage,
    TextSteps,
    TreeShape,
    clean_tool_name,
)

__all__ = [
    "HOLD_NOTE",
    "MARK",
    "MARKS",
    "OWN_REFUSAL",
    "OWN_REFUSALS",
    "TOOL_NAME_MAX",
    "clean_tool_name",
    "earlier_by_name",
    "feedback_text",
    "is_hold_feedback",
    "nudge_text",
    "refusal_after_text",
    "rejection_text",
]

# How every text the guard gives the model starts: the monitor finds its own earlier
# interventions in a session's messages by it (escalation survives a restart of the monitor),
# and a person at the TUI reads that the message is automatic, not one they typed. Plain
# words: a small model took the earlier mark's names (`opencode-loop-monitor`, "Loop guard")
# for tools and called them (issue 47's study, 6 of the 8 calls that followed a refusal and
# differed from the looping one).
MARK = "Automatic notice: "
# What earlier versions started with: their interventions count too.
MARKS = (MARK, "[opencode-loop-monitor] Loop guard: ", "Loop guard: ")
# How the plugin's own rule refuses a call, when no monitor answered its question (the
# plugin's OWN_REFUSAL, monitor/plugin/loop-guard.ts): nobody's intervention yet, so the
# acting monitor takes it for its own (`Intervene.refused`) instead of deferring to it.
_OWN_WORDS = "this call was refused by the plugin and did not run"
OWN_REFUSAL = MARK + _OWN_WORDS
# The same, as every plugin so far wrote it.
OWN_REFUSALS = tuple(mark + _OWN_WORDS for mark in MARKS)
# How the feedback of a hold ends, in every version so far: a session whose last user message
# ends so is still held when the monitor reads it back (monitor/core/export.py).
HOLD_NOTE = "on hold until a person replies. Do not call tools until then."

# Each text says what was repeated and gives one next step the model can take. Measured on a
# small local model (docs/detection.md, "A real local model"): what it does after a refusal
# follows the first instruction it reads, so the step comes first and is concrete; a longer
# explanation of why was read past.
_CALL_STEP = (
    "Its result is already above and will not change. Reply to the person now with what you "
    "have found, without calling a tool."
)
_TEXT_STEP = (
    "Do not write it again. Reply to the person once with what you have established, or take "
    "a different next step."
)
_FAILURE_STEP = (
    "It fails the same way each time. Do not make it again: tell the person what fails and "
    "the error it gives, or try another way."
)
_NO_PROGRESS_STEP = (
    "Your changes do not change what that check reports: the file it imports or runs may not "
    "be the one you edit (another copy, a cached build, another path). Find that out before "
    "you edit again, or tell the person what the check reports and what you changed."
)
_REVISIT_STEP = (
    "Nothing has changed since you read it. Do not read it again: read something you have not "
    "read yet, or reply to the person with what you learned."
)
_CIRCLES_STEP = (
    "What you search for is not there in that form, and another wording will not find it. "
    "Tell the person what is absent, or check another way: list the folder, or read the file "
    "that should use it."
)
_RUNAWAY_STEP = (
    "That call would not have ended by itself. Do not start it again: run a command that ends "
    "(a bounded count, a timeout, `head`), and if you meant to wait for something, check it "
    "once and say what you are waiting for."
)
_BUDGET_STEP = (
    "Do not start new work. Write a short summary of what is done, what is left and what "
    "blocks it, so that a person can decide whether to give this task more."
)
_TREE_STEP = (
    "Do not start more subagents for this: a subagent that hands the same task to another "
    "subagent does not finish it. Do what is left yourself, or write a short summary of what "
    "the subagents found and what blocks the task."
)
# A second intervention in a session is not a copy of the first: the first step did not work.
_AGAIN_STEP = (
    "Your calls in this session have now been stopped {times}. Do not call a tool now: reply "
    "to the person with what you have done so far and what is blocking you."
)


def _found(finding: Finding) -> tuple[str, str]:
    """What the rule saw, in the words the model reads, and the step that goes with it."""
    if isinstance(finding, TextPassage | TextSteps):
        where = "your reasoning" if finding.kind == "reasoning" else "your answer"
        if isinstance(finding, TextSteps):
            what = f"{where} was the same at {finding.steps} successive steps of this run"
        else:
            what = f"in {where} you wrote {finding.describe()}"
        return f"your run was stopped because it was repeating itself: {what}.", _TEXT_STEP
    if isinstance(finding, NoProgress):
        return (
            f"your run was stopped because it is not making progress: {finding.describe()}."
        ), _NO_PROGRESS_STEP
    if isinstance(finding, Revisit):
        return (
            f"your run was stopped because it is going over the same ground: {finding.describe()}."
        ), _REVISIT_STEP
    if isinstance(finding, SearchCircles):
        return (
            f"your run was stopped because it is searching in circles: {finding.describe()}."
        ), _CIRCLES_STEP
    if isinstance(finding, RunawayCall):
        return (
            f"your run was stopped because a call ran away: {finding.describe()}."
        ), _RUNAWAY_STEP
    if isinstance(finding, BudgetSpent):
        return f"your run was stopped because {finding.describe()}.", _BUDGET_STEP
    if isinstance(finding, TreeShape):
        return (
            f"your run was stopped because your subagents ran away: {finding.describe()}."
        ), _TREE_STEP
    if isinstance(finding, LoopAgain):
        return (
            "your run was stopped at this call, because it started a loop stopped before "
            f"again: {finding.describe()}."
        ), _CALL_STEP
    if isinstance(finding, FailureRun):
        return (
            "your run was stopped at this call, because it kept failing: "
            f"{finding.describe()}, whatever the arguments."
        ), _FAILURE_STEP
    if isinstance(finding, EndlessWait):
        return (
            "your run was stopped at this call, because it kept waiting: "
            f"{finding.describe()}, with the same arguments."
        ), _CALL_STEP
    return (
        "your run was stopped at this call, because it kept making the same calls: "
        f"{finding.describe()} with the same arguments."
    ), _CALL_STEP


def feedback_text(
    finding: Finding, hold: bool, interventions: int, earlier: Sequence[Outcome] = ()
) -> str:
    """The feedback for one intervention; `interventions` counts this one too, `earlier` says
    how those before it ended, as far as this monitor saw."""
    found, advice = _found(finding)
    return _message(found, advice, hold, interventions, earlier)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


# How an earlier intervention ended, in the words of a hold's count: a refused call is not
# a stopped run, and a person told "stopped 3 times" after two refusals is misled.
_KINDS: tuple[tuple[frozenset[Outcome], str, str], ...] = (
    (frozenset({Outcome.BLOCKED, Outcome.REJECTED}), "call refused", "calls refused"),
    (frozenset({Outcome.ABORTED}), "run stopped", "runs stopped"),
    (frozenset({Outcome.HELD}), "hold", "holds"),
    (frozenset({Outcome.NUDGED}), "warning", "warnings"),
)


def _count(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def earlier_by_name(interventions: int, earlier: Sequence[Outcome]) -> list[str]:
    """The session's interventions before this one, counted by what they were:
    `["2 calls refused", "1 run stopped"]`; `interventions` counts this one too."""
    parts = []
    named = 0
    for outcomes, one, many in _KINDS:
        count = sum(outcome in outcomes for outcome in earlier)
        if count:
            parts.append(_count(count, one, many))
            named += count
    # Interventions of an earlier monitor process (counted from the session's record) or
    # whose outcome is not in yet.
    rest = interventions - 1 - named
    if rest > 0:
        parts.append(_count(rest, "other intervention", "other interventions"))
    return parts


def _hold_line(interventions: int, earlier: Sequence[Outcome]) -> str:
    """Why the session waits: how often it looped, the earlier times by what they were."""
    parts = earlier_by_name(interventions, earlier)
    before = f"before this one: {', '.join(parts)}; " if parts else ""
    return (
        f"This session has now looped {_times(interventions)} ({before}this run is stopped), "
        "so it is " + HOLD_NOTE
    )


def _message(
    finding: str, advice: str, hold: bool, interventions: int, earlier: Sequence[Outcome] = ()
) -> str:
    """Every text: the mark and what was found, then the step to take: the finding's own the
    first time, a firmer one after (the first did not work), and on hold why it waits."""
    if hold:
        step = f"{advice}\n\n{_hold_line(interventions, earlier)}"
    elif interventions > 1:
        step = _AGAIN_STEP.format(times=_times(interventions))
    else:
        step = advice
    return f"{MARK}{finding}\n\n{step}"


def is_hold_feedback(text: str) -> bool:
    """Whether `text` is the monitor's feedback of a hold (stored with noReply)."""
    return text.startswith(MARKS) and text.endswith(HOLD_NOTE)


def rejection_text(
    finding: Finding, hold: bool, interventions: int, earlier: Sequence[Outcome] = ()
) -> str:
    """The message of a refused permission: the model reads it as the result of the call that
    completed the loop, which never ran; its run goes on. `interventions` counts this one,
    `earlier` as in `feedback_text`."""
    if isinstance(finding, LoopAgain):
        found = finding.describe()
    else:
        found = f"it would have completed a loop, {finding.describe()} with the same arguments"
    return _message(
        f"this call was refused and did not run: {found}.",
        _found(finding)[1],
        hold,
        interventions,
        earlier,
    )


def refusal_after_text(
    finding: Finding, interventions: int, earlier: Sequence[Outcome] = ()
) -> str:
    """The message of a call refused for what the calls before it did (a finding made after
    its own call ran: the same failure again, no progress, a spent budget): the model reads
    it as this call's result; its run goes on. As `rejection_text` otherwise."""
    return _message(
        "this call was refused and did not run, because of what your last calls did: "
        f"{finding.describe()}.",
        _found(finding)[1],
        False,
        interventions,
        earlier,
    )


def nudge_text(finding: Finding, interventions: int) -> str:
    """The message of a nudge: posted while the run goes on (the call that completed the loop
    ran), read at the run's next step. `interventions` counts this one."""
    return _message(
        f"you are repeating yourself: {finding.describe()}. Your run goes on, but the next "
        "repetition will be refused.",
        _found(finding)[1],
        False,
        interventions,
    )
