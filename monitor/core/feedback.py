"""The corrective message the model reads after its looping run was stopped.

Written for the model, not for people: short, names the shape of the loop (never an argument
or an output, which could be large or secret), and asks for a different approach or a clear
statement of what blocks it.
"""

from __future__ import annotations

import unicodedata

from monitor.core.rules.cycle import Cycle

# How every feedback message starts: the monitor finds its own earlier interventions in a
# session's messages by it (escalation survives a restart of the monitor). It names the
# monitor, so a person at the TUI does not take the message for one they typed.
MARK = "[opencode-loop-monitor] Loop guard: "
# What earlier versions started with: their interventions count too.
MARKS = (MARK, "Loop guard: ")


# Longer than any real tool name (MCP tools are `server_tool`), short enough to carry no
# paragraph of instructions.
TOOL_NAME_MAX = 64


def clean_tool_name(name: str, limit: int = TOOL_NAME_MAX) -> str:
    """A tool name as the model may read it in our feedback.

    The name comes from the stream, and a tool (an MCP server's, say) can be called
    anything: control characters (newlines, NUL, escape codes, bidi overrides, surrogates)
    become spaces, runs of whitespace one space, and the name is cut to `limit` characters,
    so it stays one short token. The shell cleans every name that leaves the process (logs,
    webhooks, /status) with it, with limits of its own for directories.
    """
    printable = "".join(" " if unicodedata.category(c).startswith("C") else c for c in name)
    words = " ".join(printable.split())
    return words if len(words) <= limit else words[: limit - 1] + "…"


def describe_cycle(cycle: Cycle, tools: tuple[str, ...]) -> str:
    """`3 calls (read, edit, bash) repeated 3 times`; `1 call (read) repeated 4 times`."""
    calls = "1 call" if cycle.length == 1 else f"{cycle.length} calls"
    names = ", ".join(clean_tool_name(tool) for tool in tools)
    return f"{calls} ({names}) repeated {cycle.repetitions} times"


def describe_failure(cycle: Cycle, tools: tuple[str, ...]) -> str:
    """`the same error 4 times in a row (bash)`."""
    names = ", ".join(clean_tool_name(tool) for tool in tools)
    return f"the same error {cycle.repetitions} times in a row ({names})"


def _finding(rule: str, cycle: Cycle, tools: tuple[str, ...]) -> str:
    """What the rule saw, in the words the model reads."""
    if rule == "failure":
        return (
            "a repeated failure was detected and your run was stopped at this call: "
            f"{describe_failure(cycle, tools)}, whatever the arguments."
        )
    if rule == "wait":
        return (
            "a wait that does not end was detected and your run was stopped at this call: "
            f"{describe_cycle(cycle, tools)} while waiting, with the same arguments."
        )
    return (
        "a repeated tool-call cycle was detected and your run was stopped at this "
        f"call: {describe_cycle(cycle, tools)} with the same arguments."
    )


def feedback_text(
    cycle: Cycle, tools: tuple[str, ...], hold: bool, interventions: int, rule: str = "cycle"
) -> str:
    """The feedback for one intervention; `interventions` counts this one too."""
    return _message(
        _finding(rule, cycle, tools),
        "Do not retry the same sequence unchanged. Compare what you expected each earlier "
        "attempt to do with what it actually returned. Then either take a materially "
        "different action based on that new evidence, or explain briefly why you are blocked "
        "and what information you need.",
        hold,
        interventions,
    )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _message(finding: str, advice: str, hold: bool, interventions: int) -> str:
    """Every feedback: the mark and what was found, the advice, and on hold, why it waits."""
    lines = [MARK + finding, advice]
    if hold:
        lines.append(
            f"This session has now been stopped {_times(interventions)} for looping, so it is "
            "on hold until a person replies. Do not call tools until then."
        )
    return "\n\n".join(lines)


def describe_repetition(units: int, repetitions: int) -> str:
    """`the same sentence 12 times`; `the same passage of 3 sentences 5 times`."""
    what = "sentence" if units == 1 else f"passage of {units} sentences"
    return f"the same {what} {repetitions} times"


def text_feedback_text(
    kind: str, units: int, repetitions: int, steps: bool, hold: bool, interventions: int
) -> str:
    """The feedback after a text loop: `kind` is "text" or "reasoning"; `steps` when the
    same whole text came at successive steps (`repetitions` of them) rather than inside one
    part. Names what happened without quoting it."""
    where = "your reasoning" if kind == "reasoning" else "your answer"
    if steps:
        what = f"{where} was the same at {repetitions} successive steps of this run"
    else:
        what = f"in {where} you wrote {describe_repetition(units, repetitions)} in a row"
    return _message(
        f"your run was stopped because it was repeating itself: {what}.",
        "Do not write it again. State once what you have established so far, then either "
        "take a different next step based on it, or explain briefly why you are blocked "
        "and what information you need.",
        hold,
        interventions,
    )


def rejection_text(cycle: Cycle, tools: tuple[str, ...], hold: bool, interventions: int) -> str:
    """The message of a refused permission: the model reads it as the result of the call that
    completed the loop, which never ran; its run goes on. `interventions` counts this one."""
    return _message(
        "this call was refused and did not run: it would have completed a loop, "
        f"{describe_cycle(cycle, tools)} with the same arguments.",
        "Do not make the same call again. Compare what you expected the earlier calls to do "
        "with what they actually returned. Then either take a materially different action "
        "based on that evidence, or explain briefly why you are blocked and what information "
        "you need.",
        hold,
        interventions,
    )
