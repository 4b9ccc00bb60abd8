"""The corrective message the model reads after its looping run was stopped.

Written for the model, not for people: short, names the shape of the loop (never an argument
or an output, which could be large or secret), and asks for a different approach or a clear
statement of what blocks it.
"""

from __future__ import annotations

import unicodedata

from monitor.core.rules.cycle import Cycle

# How every feedback message starts: the monitor finds its own earlier interventions in a
# session's messages by it (escalation survives a restart of the monitor).
MARK = "Loop guard: "


# Longer than any real tool name (MCP tools are `server_tool`), short enough to carry no
# paragraph of instructions.
TOOL_NAME_MAX = 64


def clean_tool_name(name: str) -> str:
    """A tool name as the model may read it in our feedback.

    The name comes from the stream, and a tool (an MCP server's, say) can be called
    anything: control characters (newlines included) become spaces, runs of whitespace one
    space, and the name is cut to `TOOL_NAME_MAX` characters, so it stays one short token.
    """
    printable = "".join(" " if unicodedata.category(c).startswith("C") else c for c in name)
    words = " ".join(printable.split())
    return words if len(words) <= TOOL_NAME_MAX else words[: TOOL_NAME_MAX - 1] + "…"


def describe_cycle(cycle: Cycle, tools: tuple[str, ...]) -> str:
    """`3 calls (read, edit, bash) repeated 3 times`; `1 call (read) repeated 4 times`."""
    calls = "1 call" if cycle.length == 1 else f"{cycle.length} calls"
    names = ", ".join(clean_tool_name(tool) for tool in tools)
    return f"{calls} ({names}) repeated {cycle.repetitions} times"


def feedback_text(cycle: Cycle, tools: tuple[str, ...], hold: bool, interventions: int) -> str:
    """The feedback for one intervention; `interventions` counts this one too."""
    lines = [
        f"{MARK}a repeated tool-call cycle was detected and your run was stopped at this "
        f"call: {describe_cycle(cycle, tools)} with the same arguments.",
        "Do not retry the same sequence unchanged. Compare what you expected each earlier "
        "attempt to do with what it actually returned. Then either take a materially "
        "different action based on that new evidence, or explain briefly why you are blocked "
        "and what information you need.",
    ]
    if hold:
        lines.append(
            f"This session has now been stopped {interventions} times for looping, so it is "
            "on hold until a person replies. Do not call tools until then."
        )
    return "\n\n".join(lines)
