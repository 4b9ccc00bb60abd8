"""Rules `budget` and `tree`: what a run, or a session with its subagents, may spend in steps,
tokens and cost, and how deep and wide a tree of subagent sessions may grow.

Pure accounting, no I/O; the tracker feeds it from the stream:

- `session(session_id, parent_id)` from `session.created` / `session.updated`
  (`info.parentID`: a subagent's session points at its parent), so spend rolls up to the
  root of its tree;
- `message(usage)` from each `message.updated` that ends a step of an assistant message
  (`MessageUsage`: tokens, cost, running totals: only the growth since the previous such
  update of that message is added). Each assistant message is one step (OpenCode writes one
  per model call), counted when it ends: a step limit stops the run after that many steps;
- `end_run(session_id)` at `session.idle`: the run's spend starts over, the tree's does not.

A `Budget` field of None is no limit; a budget with every field None never fires, which is the
default (docs/detection.md, "Budgets": the real corpus carries no `message.updated`, so no
default for tokens and cost could be measured; a step limit is off too, see there). A run's
limit fires once per run, a tree's once, each on the update that reaches it: the decision
stops that session's run with feedback that asks for a summary of what is done and left
(one more step); with `on_loop = "hold"` the session then waits for a person.

Rule `tree` reads the same parents: when a session with a parent is first seen, its depth
(its ancestors: a child of the root is at depth 1) and its parent's children started in the
parent's current run (`end_run` of the parent starts that count over) are checked against
`depth` and `fanout` (0: off); see docs/detection.md, "Subagent trees". A tree is stopped once
while that intervention is under way: later trips in it are nothing until its root's run ends.

Memory: one account per session that sent usage or has a parent (its parent id, the last
message's id and totals, two spends of four numbers), at most `max_sessions`, the least
recently touched forgotten first (its tree's spend with it, if it was the root).
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor.core.events import MessageUsage
from monitor.core.findings import BudgetSpent, TreeShape

__all__ = ["Budget", "BudgetBook"]

MEASURES = ("steps", "tokens", "cost")


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits of one scope; None: no limit."""

    steps: int | None = None
    tokens: int | None = None
    cost: float | None = None

    def __bool__(self) -> bool:
        return any(limit is not None for limit in (self.steps, self.tokens, self.cost))

    def __str__(self) -> str:
        return self.describe() or "off"

    def describe(self) -> str:
        """As the setting is written: `steps=200,tokens=5000000,cost=10` (empty: none)."""
        return ",".join(
            f"{name}={limit:g}" if isinstance(limit, float) else f"{name}={limit}"
            for name, limit in zip(MEASURES, (self.steps, self.tokens, self.cost), strict=True)
            if limit is not None
        )


class _Spend:
    __slots__ = ("steps", "tokens", "cost", "fired")

    def __init__(self) -> None:
        self.steps = 0
        self.tokens = 0
        self.cost = 0.0
        self.fired = 0  # bit i: MEASURES[i] reached


class _Account:
    __slots__ = ("parent", "message", "tokens", "cost", "run", "tree", "children", "tripped")

    def __init__(self) -> None:
        self.parent: str | None = None
        self.message: str | None = None
        self.tokens = 0
        self.cost = 0.0
        self.run: _Spend | None = None
        self.tree: _Spend | None = None  # only on a root: the whole tree's spend
        self.children = 0  # children started in the current run (rule `tree`)
        self.tripped = False  # only on a root: its tree's shape is being stopped


class BudgetBook:
    """Every session's spend; `message` says what an update spent and which budget it reached."""

    def __init__(
        self,
        run: Budget = Budget(),
        tree: Budget = Budget(),
        max_sessions: int = 10_000,
        depth: int = 0,
        fanout: int = 0,
    ) -> None:
        self.run_budget = run
        self.tree_budget = tree
        self.depth = depth
        self.fanout = fanout
        self._limited = bool(run) or bool(tree)
        self.max_sessions = max_sessions
        # Oldest first; the least recently touched account goes when it is full.
        self._accounts: dict[str, _Account] = {}

    def _touch(self, session_id: str) -> _Account:
        accounts = self._accounts
        account = accounts.pop(session_id, None)
        if account is None:
            account = _Account()
            if len(accounts) >= self.max_sessions:
                del accounts[next(iter(accounts))]
        accounts[session_id] = account
        return account

    def session(self, session_id: str, parent_id: str | None) -> tuple[TreeShape, str] | None:
        """A session's parent, from each `session.created` / `session.updated`; the shape
        its tree took past `depth` or `fanout` if this is its first sighting with a parent,
        with the tree's root (rule `tree`, at most once per tree until its root's run ends)."""
        if parent_id is None or parent_id == session_id:
            return None
        account = self._touch(session_id)
        first = account.parent is None
        account.parent = parent_id
        if not first or not (self.depth or self.fanout):
            return None
        parent = self._accounts.get(parent_id) or self._touch(parent_id)
        parent.children += 1
        # From its parent up (the parent's account may have pushed the session's own out).
        chain = [parent_id, *self._ancestors(parent_id, {session_id, parent_id})]
        found = None
        if self.depth and len(chain) > self.depth:
            found = TreeShape("depth", len(chain), self.depth, session_id, parent_id)
        elif self.fanout and parent.children > self.fanout:
            found = TreeShape("fanout", parent.children, self.fanout, session_id, parent_id)
        if found is None:
            return None
        root = self._accounts.get(chain[-1]) or self._touch(chain[-1])
        if root.tripped:
            return None
        root.tripped = True
        return found, chain[-1]

    def _ancestors(self, session_id: str, seen: set[str]) -> list[str]:
        """The session's parent, its parent's, ... up to the root (cycles cut: none of
        `seen`)."""
        chain: list[str] = []
        current = session_id
        while True:
            account = self._accounts.get(current)
            parent = None if account is None else account.parent
            if parent is None or parent in seen:
                return chain
            chain.append(parent)
            seen.add(parent)
            current = parent

    def root(self, session_id: str) -> str:
        """The top of the session's tree, as far as the parents are known (cycles cut)."""
        chain = self._ancestors(session_id, {session_id})
        return chain[-1] if chain else session_id

    def end_run(self, session_id: str) -> None:
        account = self._accounts.get(session_id)
        if account is not None:
            account.run = None
            account.children = 0
            account.tripped = False

    def forget(self, session_id: str) -> None:
        self._accounts.pop(session_id, None)

    def message(self, usage: MessageUsage) -> tuple[int, float, BudgetSpent | None] | None:
        """Take one update of an assistant message: the tokens and cost it added, and the
        budget it reached (the run's first, when both are); None when it added nothing (the
        same message again, the same totals), the most frequent case."""
        account = self._touch(usage.session_id)
        steps = int(usage.message_id != account.message)
        if steps:
            account.message, account.tokens, account.cost = usage.message_id, 0, 0.0
        elif usage.tokens <= account.tokens and usage.cost <= account.cost:
            return None
        tokens = max(usage.tokens - account.tokens, 0)
        cost = max(usage.cost - account.cost, 0.0)
        account.tokens = max(usage.tokens, account.tokens)
        account.cost = max(usage.cost, account.cost)
        if not self._limited:
            return tokens, cost, None
        found = None
        if self.run_budget:
            if account.run is None:
                account.run = _Spend()
            found = _reached(account.run, self.run_budget, "run", steps, tokens, cost)
        if self.tree_budget:
            root = self._touch(self.root(usage.session_id))
            if root.tree is None:
                root.tree = _Spend()
            tree = _reached(root.tree, self.tree_budget, "tree", steps, tokens, cost)
            found = found or tree
        return tokens, cost, found


def _reached(
    spend: _Spend, budget: Budget, scope: str, steps: int, tokens: int, cost: float
) -> BudgetSpent | None:
    """Add to `spend`; the first limit of `budget` this reaches."""
    spend.steps += steps
    spend.tokens += tokens
    spend.cost += cost
    found = None
    limits = (budget.steps, budget.tokens, budget.cost)
    spents = (spend.steps, spend.tokens, spend.cost)
    for bit, (measure, limit, spent) in enumerate(zip(MEASURES, limits, spents, strict=True)):
        if limit is None or spent < limit or spend.fired & (1 << bit):
            continue
        spend.fired |= 1 << bit
        found = found or BudgetSpent(scope, measure, float(limit), float(spent))
    return found
