"""One record per session, in one bounded table: every piece of a session's state in one place.

A `SessionRecord` holds:

- what is known of the session: its directory, its calls, its interventions, whether it is
  held (waiting for a person since a hold);
- the current run's history, what the cycle rules see: a 64-bit digest per call in an `array`
  and the interned tool names (never the arguments: edit and write calls can be many KB),
  at most `history` long; None while no run is under way;
- its calls in flight (`Call`, by part id): recorded, or asking permission, and not finished
  yet. The tracker and the permission gate share them, so a call has one identity;
- the rules' own running state (`rule_state`, by rule name), started over with every run;
- the permission gate's view: its requests, the permission each kind of call asked, and the
  requests that came before their call;
- a decision waiting before its hand-over, on its call or on the session
  (monitor/core/handover.py).

Memory is bounded whatever the server does: the table holds at most `max_sessions` records
and forgets the least recently active one first (one eviction policy for all of the above);
each table inside a record is bounded too. Everything inside a record is None until needed:
most sessions are idle most of the time and must cost little (under 2 KB, bench/memory.py).
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Callable, Iterator
from functools import lru_cache
from types import EllipsisType
from typing import Any, Generic, TypeVar

from monitor.core.calls import CallEvent, CallState, advance
from monitor.core.decisions import Intervene, Outcome, Plan
from monitor.core.findings import Finding
from monitor.core.handover import Awaiting
from monitor.core.limits import MAX_PERIOD
from monitor.core.patterns import TextPattern
from monitor.core.runs import RunState
from monitor.core.signature import canonical_signature, signature_digest

__all__ = [
    "Acted",
    "Call",
    "MAX_ASKS",
    "MAX_IN_FLIGHT",
    "MAX_REQUESTS",
    "PLUGIN_PART",
    "RecentMap",
    "Request",
    "SessionRecord",
    "bounded_put",
    "call_digest",
    "outcome_digest",
]

K = TypeVar("K")
V = TypeVar("V")

# Parts of one session that started but have not finished yet; a model step rarely runs more
# than a few calls at once, so this bound only matters for a server that never finishes any.
MAX_IN_FLIGHT = 64
# Steps a session has left that are still told from new ones (`SessionRecord.at_step`): a
# late update comes from the step just before, a few at most under load.
MAX_PAST_STEPS = 4
# Distinct kinds of call whose permission behaviour is remembered, and requests, per session.
MAX_ASKS = 256
MAX_REQUESTS = 256


class RecentMap(Generic[K, V]):
    """A dict that holds at most `capacity` keys and forgets the least recently used one.

    A plain dict keeps insertion order, so re-inserting a key on use is enough; it costs less
    memory per entry than OrderedDict, which matters at tens of thousands of sessions.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._items: dict[K, V] = {}

    def touch(self, key: K, make: Callable[[], V]) -> V:
        """Return the value of `key`, made with `make()` if absent, and mark it most recent."""
        items = self._items
        value = items.pop(key, None)
        if value is None:
            value = make()
            if len(items) >= self._capacity:
                del items[next(iter(items))]
        items[key] = value
        return value

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def items(self) -> list[tuple[K, V]]:
        """A copy, oldest first: the caller may touch or drop keys while it reads."""
        return list(self._items.items())

    def values(self) -> list[V]:
        return list(self._items.values())


def bounded_put(table: dict[K, V], key: K, value: V, limit: int) -> None:
    """Put `key` last in `table`, dropping the oldest entry when `table` is full."""
    table.pop(key, None)
    if len(table) >= limit:
        del table[next(iter(table))]
    table[key] = value


def call_digest(tool: str, args: Any) -> int:
    """A call's identity: the digest of its signature, after the tool profile dropped noise."""
    return signature_digest(canonical_signature(tool, args))


# Only the ends of a long output are hashed: the cost per call must not grow with the output,
# and what a check reports (a summary, an error) sits at either end.
_EDGE = 4096
# What differs between two runs of an unchanged thing, masked in every outcome: durations,
# addresses, long hex ids, temporary folders, and bash's own counter of the lines a
# long-lived shell read (SWE-agent's: `/bin/bash: line 212: javac: command not found` grows
# by one each run of the same failing command). Line numbers and counts are kept: a test run
# whose counts change did change. The lookahead first: every match starts with a digit, a
# hex letter or a slash, and checking that one character before trying the five ways halves
# the time of the whole pass (it runs over every finished call's output).
_VOLATILE = TextPattern(
    r"(?=[\d/a-f])(?:"
    r"\b\d+(?:\.\d+)?\s*(?:ms|s|sec|secs|seconds|minutes)\b"
    r"|\b0x[0-9a-f]+\b"
    r"|\b[0-9a-f]{12,}\b"
    r"|(?:/tmp|/var/tmp)/[^/\s]+"
    r"|(?<=bash: line )\d+)",
    re.IGNORECASE,
)


def outcome_digest(status: str, output: Any, error: Any, metadata: Any) -> int:
    """What a finished call answered, as one digest: its status, exit status and output (or
    error), volatile bits masked; equal for two runs that reported the same."""
    text = error if status == "error" else output
    if not isinstance(text, str):
        text = "" if text is None else repr(text)
    if len(text) > 2 * _EDGE:
        text = text[:_EDGE] + "\n...\n" + text[-_EDGE:]
    code = metadata.get("exit") if isinstance(metadata, dict) else None
    return _answer_digest(status, str(code), text)


# A loop's calls answer the same text again and again (a file read, the same error): its
# digest is remembered for the last few answers, as masking costs most of a finished call
# (a pass of `_VOLATILE` over the whole text). By the text's value, so the digest is the
# same whether it was remembered or not (the salted `hash()` of the text only finds the
# entry, it decides nothing); the texts are cut to their ends first.
@lru_cache(maxsize=64)
def _answer_digest(status: str, code: str, text: str) -> int:
    masked = _VOLATILE.of(text).sub("#", text)
    return signature_digest(f"{status}\x00{code}\x00{masked}")


class Call:
    """One tool call of a session, from its first update that counts to its final one.

    Its identity is made once: `digest` is the signature digest of its arguments after the
    tool profile (monitor/core/profile.py), the same for every rule and for the permission
    gate; `outcome` the digest of what it answered (`outcome_digest`) once it finished.
    """

    __slots__ = (
        "part_id",
        "tool",
        "digest",
        "status",
        "_outcome",
        "args",
        "recorded_as",
        "output",
        "error",
        "metadata",
        "state",
        "key",
        "asked",
        "request",
        "waiting",
        "call_id",
        "changes",
        "failure",
    )

    def __init__(
        self, part_id: str, tool: str, digest: int, args: Any, call_id: str | None = None
    ) -> None:
        self.part_id = part_id
        self.tool = tool
        self.digest = digest
        self.status = "running"
        self._outcome: int | None = None
        # What rules read of the arguments after the profile (`rules.facts.rule_args`: a
        # bash command, bounded); dropped with the call when it finishes.
        self.args = args
        # The digest the run's history holds for it: `digest`, or with `input+output`
        # matching, `digest` and `outcome` together.
        self.recorded_as = digest
        # What the finishing update brought, for the rules that read it (`failure`, `wait`).
        self.output: Any = None
        self.error: Any = None
        self.metadata: Any = None
        # Where it is in its life (monitor/core/calls.py); only `advance` changes it.
        self.state = CallState.NEW
        # The permission gate's data: the call's (message id, call id), by which requests
        # name it; whether it asked; its request while nobody has been told to answer it.
        self.key: tuple[str, str] | None = None
        self.asked = False
        self.request: str | None = None
        # The loop it completes, waiting for the plugin's question, its request or its end
        # (monitor/core/handover.py).
        self.waiting: Awaiting | None = None
        # The model's call id, by which the plugin names the call (not unique: local models
        # send `call_0` at every step); None once the plugin asked about it, which it does
        # once per call. A call the plugin asked about first is recorded under a part id of
        # ours until the stream carries it (`SessionRecord.claim`).
        self.call_id = call_id
        # What rules found of it once it finished, kept so that the rules (and the plan) that
        # ask each find it once: whether it changes files (`rules.facts.changes_files`), how
        # it failed (`rules.failure.failed_as`; `...` until asked, None: it did not fail).
        self.changes: bool | None = None
        self.failure: int | None | EllipsisType = ...

    def finished(self, status: str, output: Any, error: Any, metadata: Any) -> None:
        """Its final update came: keep what it brought (its outcome is digested from it)."""
        self.status = status
        self.output, self.error, self.metadata = output, error, metadata

    @property
    def outcome(self) -> int | None:
        """The digest of what it answered, None while it runs. Made when first asked (by
        `match = input+output` and the progress rules `no_progress`, `revisit` and
        `text_steps`), once: with those rules off, no output is digested."""
        if self._outcome is None and self.status != "running":
            self._outcome = outcome_digest(self.status, self.output, self.error, self.metadata)
        return self._outcome


# A call the plugin asks about before the stream carries it is recorded under a part id of
# ours, this and a number, until the stream's first update of it (OpenCode's are `prt_...`).
PLUGIN_PART = "plugin-"
# The states of a call on the stream that the plugin's question may still be about, and of
# one the plugin asked about that the stream may still carry (its loop may be acted on
# meanwhile).
_ASKABLE = (CallState.RUNNING, CallState.CANCELLED, CallState.STOPPED)
_CLAIMABLE = (CallState.ASKED, CallState.CANCELLED)


class Acted:
    """An intervention of the current run and the loop it acted on (its calls' digests)."""

    __slots__ = ("decision", "loop", "step", "done")

    def __init__(self, decision: Intervene, loop: frozenset[int], step: str | None) -> None:
        self.decision = decision
        self.loop = loop
        self.step = step  # the model step it was decided in
        # The shell reported how it ended (`Tracker.outcome`): until then it is under way.
        self.done = False

    def same(self, loop: frozenset[int], step: str | None) -> bool:
        """Whether a loop of these calls, found now, is this intervention again: the same
        calls, while it is being acted on (a monitor that stalled finds one loop many times
        before acting on the first; an abort is under way), or within the same model step (a
        burst; not after a nudge, which lets the step's calls run). Once carried out, the
        run went on regardless: its loop in a later step climbs."""
        if not loop <= self.loop:
            return False
        if not self.done:
            return True
        return self.decision.plan != Plan.NUDGE and step == self.step


class Request:
    """A permission request the gate saw, until it falls out of the session's table."""

    __slots__ = ("permission", "reply")

    def __init__(self, permission: str) -> None:
        self.permission = permission
        self.reply: str | None = None  # who answered first, as the stream told us


class SessionRecord:
    """Everything known about one session; see the module doc."""

    __slots__ = (
        "directory",
        "interventions",
        "outcomes",
        "held",
        "calls",
        "run_start",
        "intervened_part",
        "digests",
        "tools",
        "in_flight",
        "rule_state",
        "requests",
        "asks",
        "early",
        "plugin",
        "run",
        "runs",
        "step",
        "past_steps",
        "ahead",
        "summary",
        "compacted",
        "acted",
        "armed",
        "armed_runs",
        "armed_finding",
        "waiting",
        "stopping",
    )

    def __init__(self) -> None:
        self.directory: str | None = None
        self.interventions = 0
        # How this monitor saw each intervention end, in order (a hold counts them by name).
        self.outcomes: tuple[Outcome, ...] = ()
        # None: not held. Held since an intervention's outcome was `held`, until a person
        # writes: "" before any user message came since, then the id of the latest one, whose
        # text says whose it is (the monitor's own feedback comes as a user message too).
        self.held: str | None = None
        self.calls = 0
        # `calls` when the current run began, so a run read back again (`seed`) is not
        # counted twice.
        self.run_start = 0
        # The part that completed the last loop: a seed that replays the same run must not
        # act on it a second time (the feedback may not be stored yet when we read back).
        self.intervened_part: str | None = None
        # The run's history (None: no run under way), oldest first; the tool names of its
        # last MAX_PERIOD calls.
        self.digests: array[int] | None = None
        self.tools: tuple[str, ...] | None = None
        self.in_flight: dict[str, Call] | None = None
        self.rule_state: dict[str, Any] | None = None
        self.requests: dict[str, Request] | None = None
        # Per call digest, what its last call did: the permission it asked, or None when it
        # ran without asking.
        self.asks: dict[int, str | None] | None = None
        # Requests that came before their call's first update, by (message id, call id).
        self.early: dict[tuple[str, str], str] | None = None
        # A plugin asks before this session's calls run: a loop seen on the stream first
        # waits for its request (the plugin blocks it) instead of being aborted.
        self.plugin = False
        # Whether a run is under way (monitor/core/runs.py); only the tracker moves it.
        self.run = RunState.IDLE
        # Runs ended so far, as a decision's `run` names its own.
        self.runs = 0
        # The latest model step the stream or the plugin showed a call of (its assistant
        # message id), and the steps before it (`at_step`).
        self.step: str | None = None
        self.past_steps: tuple[str, ...] = ()
        # A step the plugin asked about and the stream has not shown yet: the stream lags,
        # and the ends of runs before that step may still be on their way (`ahead_of_stream`).
        self.ahead: str | None = None
        # The message of the latest compaction's summary (monitor/core/compaction.py), and
        # whether that summary is the newest step the session finished, no user message
        # since: the idle that follows ends the compaction, not a run.
        self.summary: str | None = None
        self.compacted = False
        # The intervention that stands for its loop in this run, if any.
        self.acted: Acted | None = None
        # The calls of the last loop stopped (their digests) and what was found then: a call
        # among them is that loop again, at once, until `armed_runs` more runs have ended
        # (the one stopped and the next).
        self.armed: frozenset[int] | None = None
        self.armed_runs = 0
        self.armed_finding: Finding | None = None
        # A refusal decided after its call ran (a failure loop, no progress, a budget), in a
        # session whose plugin asks, waiting for the session's next call: refused with it, in
        # band, instead of the run being aborted (`plan.withhold`, monitor/core/handover.py).
        self.waiting: Awaiting | None = None
        # The intervention whose abort stops this run (a stop or a hold, or a block that
        # nothing can refuse in band), from its decision until the run ends, unless its
        # outcome says the run was not stopped (`Tracker.outcome`): the calls' ends that come
        # meanwhile are the abort's doing (cancelled subagents, aborted tools), never a new
        # loop (`ToolUpdates._call`).
        self.stopping: Intervene | None = None

    # -- the run's history ------------------------------------------------------------------

    def record(self, digest: int, tool: str, limit: int) -> None:
        """Add a call to the run's history, keeping the newest `limit`."""
        digests = self.digests
        if digests is None:
            digests = self.digests = array("q")
        digests.append(digest)
        if len(digests) > limit:
            del digests[0]
        # A tuple made anew: a list of ten kept for appends holds six slots more, in each of
        # thousands of sessions. Interned so they share one string per tool name.
        self.tools = (*(self.tools or ())[1 - MAX_PERIOD :], sys.intern(tool))

    def block(self, count: int) -> tuple[int, ...]:
        """Digests of the run's last `count` calls, oldest first."""
        digests = self.digests
        return tuple(digests[-count:]) if digests is not None and count else ()

    def last_tools(self, count: int) -> tuple[str, ...]:
        """Tool names of the run's last `count` calls (at most MAX_PERIOD), oldest first."""
        tools = self.tools
        return tools[-count:] if tools is not None and count else ()

    @property
    def running(self) -> bool:
        """A run is under way (the server said busy and has not said idle since)."""
        return self.run is RunState.BUSY

    def history_length(self) -> int:
        return 0 if self.digests is None else len(self.digests)

    def at_step(self, message_id: str, asked: bool = False) -> None:
        """A call of the model step `message_id` (an assistant message) was seen: the session
        is in that step, unless it is one it has left. The plugin's questions come out of
        band and overtake the stream, which may carry an earlier step's last updates after
        the next step's questions (issue 43: the step's `doom_loop` request was then taken
        for a loop of another step, and counted again). `asked`: named by the plugin's
        question, not by the stream."""
        if not asked and message_id == self.ahead:
            self.ahead = None  # the stream caught up with the questions
        if message_id == self.step or message_id in self.past_steps:
            return
        if asked:
            self.ahead = message_id
        if self.step is not None:
            self.past_steps = (*self.past_steps[1 - MAX_PAST_STEPS :], self.step)
        self.step = message_id

    def ahead_of_stream(self) -> bool:
        """Whether the standing intervention was decided on a question about a step the
        stream has not shown yet: a run end the stream carries now is of a run before it,
        and leaves it standing (found by tests/test_model.py: a question that overtook a
        whole run's busy and idle was forgotten at that idle, and its loop, once the stream
        showed it, climbed the ladder to a hold)."""
        acted = self.acted
        return acted is not None and acted.step is not None and acted.step == self.ahead

    def restart(self) -> None:
        """The run's history and the rules' state start over (a loop was acted on, or the
        run is read back); its calls are left as they are."""
        self.digests = self.tools = None
        self.rule_state = None

    def end_calls(self) -> None:
        """The run is over: its calls still in flight are late from now on, and those late
        since the run before are dropped (they had a whole run to come); not the calls the
        plugin asked about ahead of the stream (`ahead`)."""
        in_flight = self.in_flight
        if in_flight is None:
            return
        for part_id, call in list(in_flight.items()):
            if self.ahead is not None and part_id.startswith(PLUGIN_PART):
                # Asked about in a step the stream has not shown yet: of a run after the one
                # ending (the server writes a call's part before its run's idle), its part
                # still to come and to claim it; refused in band, it is decided on no more.
                continue
            if call.state is CallState.LATE:
                del in_flight[part_id]
            else:
                advance(call, CallEvent.END)
                call.args = call.output = call.metadata = call.error = None
        if not in_flight:
            self.in_flight = None

    # -- calls in flight --------------------------------------------------------------------

    def call(self, part_id: str) -> Call | None:
        in_flight = self.in_flight
        return None if in_flight is None else in_flight.get(part_id)

    def start(self, call: Call) -> None:
        """Follow `call` until its final update."""
        in_flight = self.in_flight
        if in_flight is None:
            in_flight = self.in_flight = {}
        bounded_put(in_flight, call.part_id, call, MAX_IN_FLIGHT)

    def finish(self, part_id: str) -> None:
        in_flight = self.in_flight
        if in_flight is not None:
            in_flight.pop(part_id, None)
            if not in_flight:
                self.in_flight = None

    def claim(self, part_id: str, call_id: str, tool: str) -> Call | None:
        """The oldest call the plugin asked about that the stream has not carried yet, with
        this call id and tool: from now on it is part `part_id`."""
        in_flight = self.in_flight
        for old_id, call in (in_flight or {}).items():
            if (
                call.part_id.startswith(PLUGIN_PART)
                and call.state in _CLAIMABLE
                and call.call_id == call_id
                and call.tool == tool
            ):
                assert in_flight is not None
                del in_flight[old_id]
                call.part_id, call.call_id = part_id, None
                in_flight[part_id] = call
                return call
        return None

    def unasked(self, call_id: str, tool: str) -> Call | None:
        """The oldest call the stream carried with this call id and tool that the plugin has
        not asked about yet and that has not finished (a finished one, read back after a
        reconnect, is an earlier step's: the plugin asks before a call runs; a late one's run
        is over)."""
        for call in (self.in_flight or {}).values():
            if (
                call.call_id == call_id
                and call.tool == tool
                and call.state in _ASKABLE
                and not call.part_id.startswith(PLUGIN_PART)
            ):
                return call
        return None

    def arm(self, digests: tuple[int, ...], finding: Finding, runs: int) -> None:
        """Keep a stopped loop's calls until `runs` runs have ended (this one included)."""
        if digests and runs:
            self.armed, self.armed_runs, self.armed_finding = frozenset(digests), runs, finding

    def run_ended(self) -> None:
        """A run ended (the session went idle): one run less for the armed loop."""
        if self.armed_runs:
            self.armed_runs -= 1
            if not self.armed_runs:
                self.armed = self.armed_finding = None

    def by_key(self, key: tuple[str, str]) -> Call | None:
        """The call a permission request names."""
        for call in (self.in_flight or {}).values():
            if call.key == key:
                return call
        return None

    def state(self, rule: str, make: Callable[[], V]) -> V:
        """The running state of `rule` in this run, made with `make()` when it has none."""
        states = self.rule_state
        if states is None:
            states = self.rule_state = {}
        value: V | None = states.get(rule)
        if value is None:
            value = states[rule] = make()
        return value

    def peek(self, rule: str) -> Any:
        """The running state of `rule`, or None."""
        return None if self.rule_state is None else self.rule_state.get(rule)
