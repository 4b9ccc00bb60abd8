"""What a rule found: a small tagged union of frozen dataclasses, one per kind of loop.

Each finding carries only what means something for it (a cycle has its block of tools, a text
passage its number of sentences and the delta it was found on) and says what it is in one
way, `describe()`, which the feedback, the logs, the metrics, the webhook, replay, status and
the demo all use. `shape()` is what the logs and the metrics always carried of every loop
(`cycle_length`, `repetitions`, `tools`, see `fields`); for a kind without a block of calls it
says what comes closest (a text passage: its sentences, no tools). A new rule adds its class
here and to `Finding`.
"""

from __future__ import annotations

import dataclasses
import enum
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "BudgetSpent",
    "CallCycle",
    "DoomLoop",
    "EndlessWait",
    "FailureRun",
    "Finding",
    "LoopAgain",
    "NoProgress",
    "RULES",
    "Revisit",
    "Rule",
    "RunawayCall",
    "SearchCircles",
    "TOOL_NAME_MAX",
    "TextPassage",
    "TextSteps",
    "TreeShape",
    "clean_tool_name",
    "fields",
    "named",
]

# Longer than any real tool name (MCP tools are `server_tool`), short enough to carry no
# paragraph of instructions.
TOOL_NAME_MAX = 64


class Rule(enum.StrEnum):
    """Every rule's name, as decisions, logs, the metric label and `evaluate` carry it."""

    CYCLE = "cycle"
    FAILURE = "failure"
    WAIT = "wait"
    TEXT_REPEAT = "text_repeat"
    TEXT_STEPS = "text_steps"
    NO_PROGRESS = "no_progress"
    REVISIT = "revisit"
    CIRCLES = "circles"
    RUNAWAY = "runaway"
    BUDGET = "budget"
    TREE = "tree"
    # The server's own check, seen as its `doom_loop` permission request.
    DOOM_LOOP = "doom_loop"


RULES = tuple(Rule)


def clean_tool_name(name: str, limit: int = TOOL_NAME_MAX) -> str:
    """A tool name as a model or a person may read it in what we write.

    The name comes from the stream, and a tool (an MCP server's, say) can be called
    anything: control characters (newlines, NUL, escape codes, bidi overrides, surrogates)
    become spaces, runs of whitespace one space, and the name is cut to `limit` characters,
    so it stays one short token. The shell cleans every name that leaves the process (logs,
    webhooks, /status) with it, with limits of its own for directories.
    """
    if name.isascii() and name.isprintable():
        printable = name  # the usual name: no control character to replace (a check in C)
    else:
        printable = "".join(" " if unicodedata.category(c).startswith("C") else c for c in name)
    words = " ".join(printable.split())
    return words if len(words) <= limit else words[: limit - 1] + "…"


def _calls(tools: tuple[str, ...], repetitions: int) -> str:
    calls = "1 call" if len(tools) == 1 else f"{len(tools)} calls"
    names = ", ".join(clean_tool_name(tool) for tool in tools)
    return f"{calls} ({names}) repeated {repetitions} times"


class _Kind:
    """What a kind of finding allows the plan (`plan.decide`), said by the finding itself
    rather than by lists of kinds where it is used."""

    __slots__ = ()
    # It names calls (by digest) that are the loop: they are refused again, and the same
    # calls later are the same loop (`Acted.same`, the armed countdown).
    names_calls: ClassVar[bool] = False
    # A nudge is read at the model's next step: not by a call that never ends, a part that
    # repeats until its token limit, or a root waiting on its subagents' `task` call.
    reads_nudge: ClassVar[bool] = True
    # A next call of the session can be refused: not the root of a tree, whose only call
    # is the `task` that ends when its subagents do.
    refusable: ClassVar[bool] = True


def _where(kind: str) -> str:
    return "reasoning" if kind == "reasoning" else "answer"


@dataclass(frozen=True, slots=True)
class CallCycle(_Kind):
    """A block of calls (`tools`, oldest first) repeated `repetitions` times back to back,
    with the same arguments."""

    rule: ClassVar[Rule] = Rule.CYCLE
    names_calls: ClassVar[bool] = True
    tools: tuple[str, ...]
    repetitions: int

    def describe(self) -> str:
        """`3 calls (read, edit, bash) repeated 3 times`."""
        return _calls(self.tools, self.repetitions)

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return len(self.tools), self.repetitions, self.tools


@dataclass(frozen=True, slots=True)
class EndlessWait(_Kind):
    """A cycle holding a call that waits, run past its allowance (`wait_calls`)."""

    rule: ClassVar[Rule] = Rule.WAIT
    names_calls: ClassVar[bool] = True
    tools: tuple[str, ...]
    repetitions: int

    def describe(self) -> str:
        return _calls(self.tools, self.repetitions) + " while waiting"

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return len(self.tools), self.repetitions, self.tools


@dataclass(frozen=True, slots=True)
class FailureRun(_Kind):
    """The same failure of `tool`, `count` times in a row, whatever the arguments."""

    rule: ClassVar[Rule] = Rule.FAILURE
    names_calls: ClassVar[bool] = True
    tool: str
    count: int

    def describe(self) -> str:
        """`the same error 4 times in a row (bash)`."""
        return f"the same error {self.count} times in a row ({clean_tool_name(self.tool)})"

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, self.count, (self.tool,)


@dataclass(frozen=True, slots=True)
class TextPassage(_Kind):
    """Inside one streamed part of `kind` ("text" or "reasoning"), a passage of `units`
    sentences written `repetitions` times back to back, found on the part's `delta`-th delta."""

    rule: ClassVar[Rule] = Rule.TEXT_REPEAT
    reads_nudge: ClassVar[bool] = False
    kind: str
    units: int
    repetitions: int
    delta: int

    def describe(self) -> str:
        """`the same sentence 12 times in a row`; `the same passage of 3 sentences ...`."""
        what = "sentence" if self.units == 1 else f"passage of {self.units} sentences"
        return f"the same {what} {self.repetitions} times in a row"

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return self.units, self.repetitions, ()


@dataclass(frozen=True, slots=True)
class TextSteps(_Kind):
    """The same whole text of `kind` at `steps` successive steps of one run, with no call
    between them that got back something new."""

    rule: ClassVar[Rule] = Rule.TEXT_STEPS
    kind: str
    steps: int

    def describe(self) -> str:
        """`the same answer at 8 successive steps`."""
        return f"the same {_where(self.kind)} at {self.steps} successive steps"

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, self.steps, ()


@dataclass(frozen=True, slots=True)
class NoProgress(_Kind):
    """The same check (a call of `tool` that changes nothing) reported the same thing `runs`
    times, each run after calls that changed files (`changes` of them in all)."""

    rule: ClassVar[Rule] = Rule.NO_PROGRESS
    tool: str
    runs: int
    changes: int

    def describe(self) -> str:
        """`the same result from bash 5 times, with 4 changes in between`."""
        tool = clean_tool_name(self.tool)
        return (
            f"the same result from {tool} {self.runs} times, with {self.changes} changes in between"
        )

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, self.runs, (self.tool,)


@dataclass(frozen=True, slots=True)
class Revisit(_Kind):
    """`revisits` of the last `window` calls (of `tools`) brought back what the run had
    already seen, with no file changed since."""

    rule: ClassVar[Rule] = Rule.REVISIT
    revisits: int
    window: int
    tools: tuple[str, ...]

    def describe(self) -> str:
        """`12 of the last 16 calls (read) brought back what was already seen`."""
        names = ", ".join(clean_tool_name(tool) for tool in self.tools)
        return (
            f"{self.revisits} of the last {self.window} calls ({names}) brought back what "
            "was already seen"
        )

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return self.window, self.revisits, self.tools


@dataclass(frozen=True, slots=True)
class SearchCircles(_Kind):
    """`fruitless` of the last `window` calls were searches (of `tools`) that came back empty,
    failing or with what the run had already seen, with no file changed; or (`filtered`)
    `fruitless` searches through one filter each found nothing."""

    rule: ClassVar[Rule] = Rule.CIRCLES
    fruitless: int
    window: int
    tools: tuple[str, ...]
    filtered: bool = False

    def describe(self) -> str:
        """`10 of the last 12 calls (bash) were searches that found nothing new`; `6 searches (bash)
        through the same filter found nothing`."""
        names = ", ".join(clean_tool_name(tool) for tool in self.tools)
        if self.filtered:
            return f"{self.fruitless} searches ({names}) through the same filter found nothing"
        return (
            f"{self.fruitless} of the last {self.window} calls ({names}) were searches that "
            "found nothing new"
        )

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return self.window, self.fruitless, self.tools


@dataclass(frozen=True, slots=True)
class RunawayCall(_Kind):
    """One call of `tool` that does not end: still running `seconds` after it started, or
    (`seconds` 0) its streamed output ending in the same line `lines` times over at `updates`
    of its updates in a row."""

    rule: ClassVar[Rule] = Rule.RUNAWAY
    reads_nudge: ClassVar[bool] = False
    tool: str
    updates: int = 0
    lines: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        """`one bash call kept printing the same line without end (20 times at 20 updates in
        a row)`; `one bash call was still running after 150 s`."""
        tool = clean_tool_name(self.tool)
        if self.seconds:
            return f"one {tool} call was still running after {self.seconds:g} s"
        return (
            f"one {tool} call kept printing the same line without end "
            f"({self.lines} times at {self.updates} updates in a row)"
        )

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, self.updates, (self.tool,)


@dataclass(frozen=True, slots=True)
class BudgetSpent(_Kind):
    """A budget was reached: the `scope` ("run", or "tree": a session with its subagents)
    spent `spent` of `measure` ("steps", "tokens" or "cost" in USD), its limit `limit`."""

    rule: ClassVar[Rule] = Rule.BUDGET
    scope: str
    measure: str
    limit: float
    spent: float

    def describe(self) -> str:
        """`the run's budget of 200 steps was reached (200 steps spent)`."""
        whose = "the run's" if self.scope == "run" else "the session tree's"
        return (
            f"{whose} budget of {_amount(self.measure, self.limit)} was reached "
            f"({_amount(self.measure, self.spent)} spent)"
        )

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, 1, ()


def _amount(measure: str, value: float) -> str:
    if measure == "cost":
        return f"${value:,.2f}"
    return f"{int(value):,} {measure}"


@dataclass(frozen=True, slots=True)
class TreeShape(_Kind):
    """A session tree grew past its shape as `child`, a new subagent session, appeared:
    `measure` "depth", it is `count` levels below its root (a child of the root is at depth
    1); "fanout", it is the `count`-th child its parent `parent` started in one run. `limit`
    is the most allowed."""

    rule: ClassVar[Rule] = Rule.TREE
    reads_nudge: ClassVar[bool] = False
    refusable: ClassVar[bool] = False
    measure: str
    count: int
    limit: int
    child: str
    parent: str

    def describe(self) -> str:
        """`subagent session ses_x is at depth 4 (more than 3 levels of subagents)`;
        `session ses_p started 21 children in one run (more than 20), the last ses_x`."""
        child = clean_tool_name(self.child)
        if self.measure == "depth":
            return (
                f"subagent session {child} is at depth {self.count} "
                f"(more than {self.limit} levels of subagents)"
            )
        return (
            f"session {clean_tool_name(self.parent)} started {self.count} children in one run "
            f"(more than {self.limit} subagent sessions), the last {child}"
        )

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, self.count, ()


@dataclass(frozen=True, slots=True)
class DoomLoop(_Kind):
    """The server's `doom_loop` check: the last `calls` calls of one message, of `tool`, were
    identical, and it asked permission to go on."""

    rule: ClassVar[Rule] = Rule.DOOM_LOOP
    names_calls: ClassVar[bool] = True
    tool: str
    calls: int

    def describe(self) -> str:
        return _calls((self.tool,), self.calls)

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return 1, self.calls, (self.tool,)


@dataclass(frozen=True, slots=True)
class LoopAgain(_Kind):
    """A call of `tool` that is a call of `loop`, a loop stopped before and still armed
    (`SessionRecord.armed`): with the same arguments as one of its calls, or (`failed`)
    failing as it did. Its own finding, not `loop`'s: the text the model reads says what this
    call did (a single `git pull` is not "4 calls repeated 3 times", issue 47), while the
    rule, the logs' shape and the metric's label stay the loop's, which it continues."""

    names_calls: ClassVar[bool] = True
    tool: str
    loop: Finding
    failed: bool = False

    @property
    def rule(self) -> Rule:
        return self.loop.rule

    def describe(self) -> str:
        """`bash with the same arguments again, a call of the loop interrupted before`."""
        tool = clean_tool_name(self.tool)
        if self.failed:
            return f"the same error from {tool} again, the failure of the loop interrupted before"
        return f"{tool} with the same arguments again, a call of the loop interrupted before"

    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        return self.loop.shape()


Finding = (
    CallCycle
    | EndlessWait
    | FailureRun
    | TextPassage
    | TextSteps
    | NoProgress
    | Revisit
    | SearchCircles
    | RunawayCall
    | BudgetSpent
    | TreeShape
    | DoomLoop
    | LoopAgain
)


def fields(finding: Finding) -> dict[str, object]:
    """A finding's part of the `loop.detected` log record (docs/logs.md)."""
    length, repetitions, tools = finding.shape()
    return {
        "cycle_length": length,
        "repetitions": repetitions,
        "tools": list(tools),
        "finding": finding.describe(),
    }


def named(finding: Finding, names: Mapping[str, str]) -> Finding:
    """`finding` with its tools under other names (`names`, those not in it unchanged): the
    rules know a call by its 1.x name, and the texts the model reads name it as its server
    does (2.x's `shell` for `bash`, `profile.ENGINE_NAMES`)."""
    changes: dict[str, Any] = {}
    tool = getattr(finding, "tool", None)
    if isinstance(tool, str):
        changes["tool"] = names.get(tool, tool)
    tools = getattr(finding, "tools", None)
    if isinstance(tools, tuple):
        changes["tools"] = tuple(names.get(name, name) for name in tools)
    return dataclasses.replace(finding, **changes) if changes else finding
