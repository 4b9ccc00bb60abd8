"""No fixed sleep as proof of absence (issue 30).

A test that something did NOT happen first waits for a positive sign that the input was seen:
a log line the monitor writes after handling it, a request the stand-in received after it, a
later frame read (`tests.harness.seen_through`), a counter on /status or /metrics. A sleep
proves nothing on a slow machine: the test passes there whether or not the monitor would have
done it. This test reads every test module (AST and lines) for an `asyncio.sleep(...)` or
`time.sleep(...)` of at least 0.1 s (or of a duration not written out) that an assertion of
emptiness or absence (`== []`, `not in`, `is None`, `== 0`, ...) follows within a few lines
of code. A sleep in a `while` loop is a poll's interval: the loop ends on what it waits for.

A sleep that is itself the duration under test (pings counted over it, with a tolerant
bound) is no proof of absence; one that must stay before such an assertion goes in `ALLOWED`,
with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Lines of code (blank lines and comments not counted) after a sleep where an assertion of
# absence makes the sleep its proof: the brief's 3, and a margin for a line that only reads
# what is asserted next (`[request] = await pending(...)`).
WINDOW = 5
SHORTEST = 0.1  # seconds; a shorter sleep only yields to the loop or a thread
# (file under tests/, the sleep's line as written, stripped) -> why it may stay.
ALLOWED: dict[tuple[str, str], str] = {}

ABSENCE = re.compile(
    r"""==\s*(\[\]|\{\}|\(\)|set\(\)|0(?![.\d])|""|'')"""  # equal to nothing
    r"""|(\[\]|\{\}|\(\)|set\(\)|""|'')\s*=="""  # written the other way round
    r"""|\bnot\s+in\b|\bis\s+None\b|^assert\s+not\b"""
)


def _literal_seconds(node: ast.expr) -> float | None:
    """The duration when it is a number written out (or arithmetic of numbers only)."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp):
            left, right = _literal_seconds(node.left), _literal_seconds(node.right)
            if left is not None and right is not None:
                try:
                    return float(eval(compile(ast.Expression(node), "<sleep>", "eval")))  # noqa: S307
                except ArithmeticError:
                    return None
        return None
    return float(value) if isinstance(value, int | float) else None


def _fixed_sleeps(tree: ast.AST) -> list[tuple[int, int, float]]:
    """(first line, last line, seconds) of each `asyncio.sleep`/`time.sleep` call, but for
    those in a `while` loop: a poll's interval, the loop ends on a condition (the positive
    sign). A duration not written out (`4 * timing.retry.timeout`) may be long: infinity."""
    polls = {
        id(inner)
        for loop in ast.walk(tree)
        if isinstance(loop, ast.While)
        for inner in ast.walk(loop)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in polls:
            continue
        if not (isinstance(node, ast.Call) and node.args and not node.keywords):
            continue
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id in ("asyncio", "time")
        ):
            continue
        seconds = _literal_seconds(node.args[0])
        if seconds is None:
            seconds = float("inf")
        found.append((node.lineno, node.end_lineno or node.lineno, seconds))
    return found


def _asserts(tree: ast.AST) -> dict[int, ast.Assert]:
    """Each assert statement, by its first line."""
    return {node.lineno: node for node in ast.walk(tree) if isinstance(node, ast.Assert)}


def sleep_proofs(source: str) -> list[tuple[int, str, str]]:
    """(line, the sleep's line, the assertion) for every fixed sleep of at least `SHORTEST`
    seconds followed within `WINDOW` lines of code by an assertion of absence."""
    tree = ast.parse(source)
    lines = source.splitlines()
    asserts = _asserts(tree)
    found = []
    for first, last, seconds in sorted(_fixed_sleeps(tree)):
        if seconds < SHORTEST:
            continue
        code_lines = [
            number
            for number in range(last + 1, len(lines) + 1)
            if lines[number - 1].strip() and not lines[number - 1].strip().startswith("#")
        ][:WINDOW]
        for number in code_lines:
            node = asserts.get(number)
            if node is None:
                continue
            end = node.end_lineno or number
            text = " ".join(" ".join(lines[number - 1 : end]).split())  # one line
            if ABSENCE.search(text):
                found.append((first, lines[first - 1].strip(), text))
                break
    return found


def test_no_fixed_sleep_is_a_proof_of_absence() -> None:
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        for line, sleep, assertion in sleep_proofs(path.read_text(encoding="utf-8")):
            found[(name, sleep)] = f"{name}:{line}: {sleep} -> {assertion}"
    unexplained = [where for key, where in found.items() if key not in ALLOWED]
    assert not unexplained, (
        "a fixed sleep before an assertion of absence proves nothing on a slow machine; "
        "wait for a positive sign that the input was seen (or allow it in ALLOWED, with "
        "its reason):\n" + "\n".join(unexplained)
    )
    stale = [key for key in ALLOWED if key not in found]
    assert not stale, f"ALLOWED names sleeps that are no longer there: {stale}"


@pytest.mark.parametrize(
    "source",
    [
        "async def t():\n    await asyncio.sleep(0.5)\n    assert monitor.events('x') == []\n",
        "def t():\n    time.sleep(1)\n\n    # a comment\n    assert s not in status\n",
        "async def t():\n    await asyncio.sleep(4 * 0.5)\n    y = 1\n    assert x is None\n",
        "async def t():\n    await asyncio.sleep(1.5)\n    assert not approved\n",
        "async def t():\n    await asyncio.sleep(0.2)\n    assert (\n        a == 0\n    )\n",
        "async def t():\n    await asyncio.sleep(0.3)\n    assert [] == found\n",
        # A duration not written out may be long.
        "async def t():\n    await asyncio.sleep(4 * timeout)\n    assert x == []\n",
    ],
)
def test_a_sleep_before_an_assertion_of_absence_is_found(source: str) -> None:
    assert len(sleep_proofs(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        # Too short to be meant as a wait.
        "async def t():\n    await asyncio.sleep(0.05)\n    assert x == []\n",
        "async def t():\n    await asyncio.sleep(0)\n    assert x == []\n",
        # Presence, or a count, asserted.
        "async def t():\n    await asyncio.sleep(0.5)\n    assert len(x) == 10\n",
        "async def t():\n    await asyncio.sleep(0.5)\n    assert x == 0.5\n",
        "async def t():\n    await asyncio.sleep(0.5)\n    assert s in status\n",
        # Too far below.
        "async def t():\n    await asyncio.sleep(0.5)\n"
        + "    a = 1\n" * WINDOW
        + "    assert x == []\n",
        # A poll: the loop ends on the condition it waits for.
        "def t():\n    while not done():\n        time.sleep(0.2)\n    assert x not in y\n",
    ],
)
def test_other_sleeps_and_assertions_are_not_found(source: str) -> None:
    assert sleep_proofs(source) == []
