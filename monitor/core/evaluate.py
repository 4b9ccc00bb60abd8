"""Evaluation: how the rules do on labelled traces, as a table per rule.

A labelled trace is a recording whose first line is an SSE comment that says what it is:
`: expect loop at N` (a loop the monitor should stop at the session's N-th recorded call) or
`: expect legit` (work nobody should stop). Positions count the calls the rules record:
transparent tools (todowrite) are not counted. Only the first decision in a trace counts: after
a stop the run would have gone differently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from monitor.core.findings import RULES
from monitor.errors import InputError

__all__ = [
    "Label",
    "LabelError",
    "Result",
    "all_right",
    "legit_firings",
    "parse_label",
    "set_table",
    "table",
    "trace_line",
]

_LABEL = re.compile(r"^:\s*expect\s+(?:(legit)|loop\s+at\s+(\d+))\s*$")


class LabelError(InputError, ValueError):
    """The trace has no usable label; the message is safe to print."""


@dataclass(frozen=True, slots=True)
class Label:
    """`loop_at` is the call at which the loop should be stopped; None for legit work."""

    loop_at: int | None


@dataclass(frozen=True, slots=True)
class Result:
    """One trace: its label and the first decision (rule and position), if any."""

    name: str
    label: Label
    rule: str | None = None
    position: int | None = None

    @property
    def verdict(self) -> str:
        """`caught`, `early`, `late`, `missed`, `false alarm` or `ok` (legit, untouched)."""
        expected = self.label.loop_at
        if expected is None:
            return "ok" if self.position is None else "false alarm"
        if self.position is None:
            return "missed"
        if self.position == expected:
            return "caught"
        return "early" if self.position < expected else "late"


def parse_label(first_line: str) -> Label:
    match = _LABEL.match(first_line.lstrip("\ufeff").strip())
    if match is None:
        raise LabelError(
            "no label: the first line must be `: expect loop at N` or `: expect legit`"
        )
    return Label(None if match.group(1) else int(match.group(2)))


def trace_line(result: Result) -> str:
    expected = "legit" if result.label.loop_at is None else f"loop at {result.label.loop_at}"
    found = "-" if result.position is None else f"{result.rule} at {result.position}"
    return f"{result.name:<48} {expected:<12} {found:<18} {result.verdict}"


def table(results: Sequence[Result]) -> list[str]:
    """Per rule: loops caught at the labelled call, caught early or late, false alarms."""
    rules = list(RULES) + sorted({r.rule for r in results if r.rule and r.rule not in RULES})
    header = f"{'rule':<12} {'caught':>6} {'early':>6} {'late':>6} {'false alarms':>13}  where"
    lines = [header]
    for rule in rules:
        mine = [r for r in results if r.rule == rule]
        counts = [sum(r.verdict == v for r in mine) for v in ("caught", "early", "late")]
        alarms = sum(r.verdict == "false alarm" for r in mine)
        where = ", ".join(str(r.position) for r in mine if r.label.loop_at is not None)
        lines.append(
            f"{rule:<12} {counts[0]:>6} {counts[1]:>6} {counts[2]:>6} {alarms:>13}  {where or '-'}"
        )
    loops = [r for r in results if r.label.loop_at is not None]
    legit = len(results) - len(loops)
    lines.append(
        f"total: {len(loops)} loops, {_count(loops, 'caught')} caught at the labelled call, "
        f"{_count(loops, 'early') + _count(loops, 'late')} early or late, "
        f"{_count(loops, 'missed')} missed; {legit} legit, "
        f"{_count(results, 'false alarm')} false alarms"
    )
    return lines


def all_right(results: Iterable[Result]) -> bool:
    return all(r.verdict in ("caught", "ok") for r in results)


def _count(results: Iterable[Result], verdict: str) -> int:
    return sum(r.verdict == verdict for r in results)


# --- sets of the shared corpus -------------------------------------------------------------

# Where a rule firing is a catch (known loops) and where it is a false alarm.
LOOP_SETS = ("known_loops",)
REPORTED_SETS = ("same_error",)
LEGIT_SETS = ("silent_success", "gemini_resolved")


def set_table(
    fired: Mapping[str, Mapping[str, Sequence[int]]],
    sets: Mapping[str, Sequence[str]],
    rules: Sequence[str],
    together: Sequence[str],
) -> list[str]:
    """Per rule: files it fires on in each set (`fired`: file -> rule -> positions), the
    median first position in the known loops, and the files it fires on in the legit sets.

    `together` are the rules meant to be on at once: one more row counts a file when any of
    them fires on it.
    """
    names = [*LOOP_SETS, *REPORTED_SETS, *LEGIT_SETS]
    header = f"{'rule':<16}" + "".join(f" {name:>15}" for name in names) + f" {'all':>9}  first"
    lines = [header, f"{'(files)':<16}" + "".join(f" {len(sets.get(n, ())):>15}" for n in names)]
    lines[-1] += f" {len(fired):>9}"
    rows = [(rule, (rule,)) for rule in rules] + [("together", tuple(together))]
    for title, members in rows:
        first = {
            file: min(p for rule in members for p in by_rule.get(rule, ()))
            for file, by_rule in fired.items()
            if any(by_rule.get(rule) for rule in members)
        }
        counts = [sum(f in first for f in sets.get(name, ())) for name in names]
        firsts = sorted(first[f] for f in sets.get("known_loops", ()) if f in first)
        median = str(firsts[len(firsts) // 2]) if firsts else "-"
        line = f"{title:<16}" + "".join(f" {c:>15}" for c in counts)
        lines.append(line + f" {len(first):>9}  {median}")
    return lines


def legit_firings(
    fired: Mapping[str, Mapping[str, Sequence[int]]],
    sets: Mapping[str, Sequence[str]],
    rules: Sequence[str],
) -> list[str]:
    """Every firing on a legit set, to be looked at: `set file rule at positions`."""
    lines = []
    for name in LEGIT_SETS:
        for file in sets.get(name, ()):
            for rule in rules:
                positions = fired.get(file, {}).get(rule)
                if positions:
                    at = ", ".join(map(str, positions))
                    lines.append(f"{name:<15} {file} {rule} at {at}")
    return lines
