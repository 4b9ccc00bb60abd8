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
    "TOOL_NAME_MAX",
    "clean_tool_name",
    "earlier_by_name",
    "feedback_text",
    "is_hold_feedback",
    "nudge_text",
    "refusal_after_text",
    "rejection_text",
]

# How every feedback message starts: the monitor finds its own earlier interventions in a
# session's messages by it (escalation survives a restart of the monitor). It names the
# monitor, so a person at the TUI does not take the message for one they typed.
MARK = "[opencode-loop-monitor] Loop guard: "
# What earlier versions started with: their interventions count too.
MARKS = (MARK, "Loop guard: ")
# How the plugin's own rule refuses a call, when no monitor answered its question (the
# plugin's OWN_REFUSAL, monitor/plugin/loop-guard.ts): nobody's intervention yet, so the
# acting monitor takes it for its own (`Intervene.refused`) instead of deferring to it.
OWN_REFUSAL = MARK + "this call was refused by the plugin and did not run"
# How the feedback of a hold ends, in every version so far: a session whose last user message
# ends so is still held when the monitor reads it back (monitor/core/export.py).
HOLD_NOTE = "on hold until a person replies. Do not call tools until then."

_CALL_ADVICE = (
    "Do not retry the same sequence unchanged. Compare what you expected each earlier "
    "attempt to do with what it actually returned. Then either take a materially "
    "different action based on that new evidence, or explain briefly why you are blocked "
    "and what information you need."
)
_TEXT_ADVICE = (
    "Do not write it again. State once what you have established so far, then either "
    "take a different next step based on it, or explain briefly why you are blocked "
    "and what information you need."
)

_NO_PROGRESS_ADVICE = (
    "Your changes do not change what that check reports, so check that they reach what it "
    "runs: the file it imports or executes may not be the one you edit (another installed "
    "copy, a cached build, a different path), or the check may not exercise what you "
    "changed. Find that out before you edit again, or explain briefly why you are blocked."
)
_REVISIT_ADVICE = (
    "You are reading again what you have already read, and nothing has changed since. "
    "State once what you learned from it, then take a next step that brings something "
    "new (a different file, a search, an edit, a test), or explain briefly why you are "
    "blocked and what information you need."
)
_CIRCLES_ADVICE = (
    "What you are searching for is probably not there in the form you expect: another "
    "rewording of the search will not find it. State once what the searches established "
    "(what is absent), then check your assumption another way (list the directory, read "
    "the file that should use it, run the code), or explain briefly why you are blocked."
)
_RUNAWAY_ADVICE = (
    "That call would not have ended by itself. Do not start it again: run a command that "
    "ends (a bounded count, a timeout, `head`), and if you meant to wait for something, "
    "check it once and say what you are waiting for."
)
_BUDGET_ADVICE = (
    "Do not start new work. Write a short summary of what is done, what is left and what "
    "blocks it, so that a person can decide whether to give this task more."
)

_TREE_ADVICE = (
    "Do not start more subagents for this: a subagent that hands the same task to another "
    "subagent does not finish it. Do what is left yourself, or write a short summary of what "
    "the subagents found and what blocks the task."
)


def _found(finding: Finding) -> tuple[str, str]:
    """What the rule saw, in the words the model reads, and the advice that goes with it."""
    if isinstance(finding, TextPassage | TextSteps):
        where = "your reasoning" if finding.kind == "reasoning" else "your answer"
        if isinstance(finding, TextSteps):
            what = f"{where} was the same at {finding.steps} successive steps of this run"
        else:
            what = f"in {where} you wrote {finding.describe()}"
        return f"your run was stopped because it was repeating itself: {what}.", _TEXT_ADVICE
    if isinstance(finding, NoProgress):
        return (
            f"your run was stopped because it is not making progress: {finding.describe()}."
        ), _NO_PROGRESS_ADVICE
    if isinstance(finding, Revisit):
        return (
            f"your run was stopped because it is going over the same ground: {finding.describe()}."
        ), _REVISIT_ADVICE
    if isinstance(finding, SearchCircles):
        return (
            f"your run was stopped because it is searching in circles: {finding.describe()}."
        ), _CIRCLES_ADVICE
    if isinstance(finding, RunawayCall):
        return (
            f"your run was stopped because a call ran away: {finding.describe()}."
        ), _RUNAWAY_ADVICE
    if isinstance(finding, BudgetSpent):
        return f"your run was stopped because {finding.describe()}.", _BUDGET_ADVICE
    if isinstance(finding, TreeShape):
        return (
            f"your run was stopped because your subagents ran away: {finding.describe()}."
        ), _TREE_ADVICE
    if isinstance(finding, LoopAgain):
        return (
            "a loop interrupted before was started again and your run was stopped at this "
            f"call: {finding.describe()}."
        ), _CALL_ADVICE
    if isinstance(finding, FailureRun):
        return (
            "a repeated failure was detected and your run was stopped at this call: "
            f"{finding.describe()}, whatever the arguments."
        ), _CALL_ADVICE
    if isinstance(finding, EndlessWait):
        return (
            "a wait that does not end was detected and your run was stopped at this call: "
            f"{finding.describe()}, with the same arguments."
        ), _CALL_ADVICE
    return (
        "a repeated tool-call cycle was detected and your run was stopped at this "
        f"call: {finding.describe()} with the same arguments."
    ), _CALL_ADVICE


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
    """Every feedback: the mark and what was found, the advice, and on hold, why it waits."""
    lines = [MARK + finding, advice]
    if hold:
        lines.append(_hold_line(interventions, earlier))
    return "\n\n".join(lines)


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
        "Do not make the same call again. Compare what you expected the earlier calls to do "
        "with what they actually returned. Then either take a materially different action "
        "based on that evidence, or explain briefly why you are blocked and what information "
        "you need.",
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
