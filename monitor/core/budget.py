"""Budgets: what a run, or a session with its subagents, may spend in steps, tokens and cost.

Pure accounting, no I/O. Inputs the tracker passes from the stream:

- `session(session_id, parent_id)` from `session.created` / `session.updated` (`info.parentID`:
  a subagent's session points at its parent), so spend rolls up to the root of its tree;
- `message(session_id, message_id, tokens, cost)` from every `message.updated` of an assistant
  message (`info.tokens` input + output + reasoning + cache read + write, `info.cost`). The
  server sends the same message again as it grows, with running totals: only the growth since
  the previous update of that message is added. Each assistant message is one step (OpenCode
  writes one per model call);
- `end_run(session_id)` at `session.idle`: the run's spend starts over, the tree's does not.

A `Budget` field of None is no limit; a budget with every field None never fires, which is the
default (`docs/detection.md`, "Budgets": no default was measurable for tokens and cost, the
real corpus carries no `message.updated`). Each limit fires once, on the update that reaches
it. Memory per session: its parent id, the last message's id and totals, two `Spend`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["run", "tree"]
Measure = Literal["steps", "tokens", "cost"]


@dataclass(frozen=True, slots=True)
class Budget:
    steps: int | None = None
    tokens: int | None = None
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class BudgetReached:
    """`scope` (the run of `session_id`, or the tree under `root_id`) spent `spent` of
    `measure`, reaching its `limit`."""

    session_id: str
    root_id: str
    scope: Scope
    measure: Measure
    limit: float
    spent: float


class Spend:
    __slots__ = ("steps", "tokens", "cost", "fired")

    def __init__(self) -> None:
        self.steps = 0
        self.tokens = 0
        self.cost = 0.0
        self.fired: set[str] = set()


class _Account:
    __slots__ = ("parent", "message", "tokens", "cost", "run", "tree")

    def __init__(self) -> None:
        self.parent: str | None = None
        self.message: str | None = None
        self.tokens = 0
        self.cost = 0.0
        self.run = Spend()
        self.tree = Spend()  # used only on a root: the whole tree's spend


class BudgetBook:
    """Every session's spend; `message` says which budgets an update reached."""

    def __init__(self, run: Budget = Budget(), tree: Budget = Budget(), max_sessions: int = 10_000):
        self.run_budget = run
        self.tree_budget = tree
        self.max_sessions = max_sessions
        # Oldest first; the least recently touched account goes when it is full.
        self._accounts: dict[str, _Account] = {}

    def _touch(self, session_id: str) -> _Account:
        account = self._accounts.pop(session_id, None)
        if account is None:
            account = _Account()
            if len(self._accounts) >= self.max_sessions:
                del self._accounts[next(iter(self._accounts))]
        self._accounts[session_id] = account
        return account

    def session(self, session_id: str, parent_id: str | None) -> None:
        account = self._touch(session_id)
        if parent_id is not None and parent_id != session_id:
            account.parent = parent_id

    def root(self, session_id: str) -> str:
        """The top of the session's tree, as far as the parents are known (cycles cut)."""
        seen = {session_id}
        current = session_id
        while True:
            account = self._accounts.get(current)
            parent = None if account is None else account.parent
            if parent is None or parent in seen:
                return current
            seen.add(parent)
            current = parent

    def end_run(self, session_id: str) -> None:
        account = self._accounts.get(session_id)
        if account is not None:
            account.run = Spend()

    def message(
        self, session_id: str, message_id: str, tokens: int, cost: float
    ) -> list[BudgetReached]:
        account = self._touch(session_id)
        if message_id != account.message:
            account.message, account.tokens, account.cost = message_id, 0, 0.0
            steps = 1
        else:
            steps = 0
        grown_tokens = max(tokens - account.tokens, 0)
        grown_cost = max(cost - account.cost, 0.0)
        account.tokens, account.cost = max(tokens, account.tokens), max(cost, account.cost)
        root_id = self.root(session_id)
        root = self._touch(root_id)
        found: list[BudgetReached] = []
        scopes: tuple[tuple[Scope, Spend, Budget], ...] = (
            ("run", account.run, self.run_budget),
            ("tree", root.tree, self.tree_budget),
        )
        for scope, spend, budget in scopes:
            spend.steps += steps
            spend.tokens += grown_tokens
            spend.cost += grown_cost
            measures: tuple[tuple[Measure, float | None, float], ...] = (
                ("steps", budget.steps, spend.steps),
                ("tokens", budget.tokens, spend.tokens),
                ("cost", budget.cost, spend.cost),
            )
            for measure, limit, spent in measures:
                if limit is None or spent < limit or measure in spend.fired:
                    continue
                spend.fired.add(measure)
                found.append(BudgetReached(session_id, root_id, scope, measure, limit, spent))
        return found


def usage_of(info: object) -> tuple[str, str, int, float] | None:
    """(session id, message id, tokens, cost) of a `message.updated` `info`, or None when it
    is not an assistant message with usage (a user message, a malformed one)."""
    if not isinstance(info, dict) or info.get("role") != "assistant":
        return None
    session_id, message_id, tokens, cost = (
        info.get("sessionID"),
        info.get("id"),
        info.get("tokens"),
        info.get("cost", 0),
    )
    if not isinstance(session_id, str) or not isinstance(message_id, str):
        return None
    if not isinstance(tokens, dict) or not isinstance(cost, int | float) or isinstance(cost, bool):
        return None
    cache = tokens.get("cache")
    parts = [tokens.get(key) for key in ("input", "output", "reasoning")]
    if isinstance(cache, dict):
        parts += [cache.get("read"), cache.get("write")]
    total = sum(p for p in parts if isinstance(p, int) and not isinstance(p, bool))
    return session_id, message_id, total, float(cost)
