"""The package is typed (`py.typed`, `Typing :: Typed`): mypy --strict, as pyproject.toml
configures it, finds nothing in it.

Run through pytest so that CI's one test command (README.md, .ci/run) checks types too; a
type error is a failing test like any other.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_package_type_checks_strict() -> None:
    result = mypy()
    assert (result.returncode, result.stderr) == (0, ""), result.stdout
    assert result.stdout.startswith("Success: no issues found in ")


def test_the_configuration_is_strict(tmp_path: Path) -> None:
    # An unannotated function passes plain mypy; only --strict (disallow_untyped_defs) stops it.
    probe = tmp_path / "probe.py"
    probe.write_text("def double(x):\n    return x * 2\n", encoding="utf-8")
    result = mypy("--cache-dir", str(tmp_path / "cache"), str(probe))
    assert result.returncode == 1
    assert "probe.py:1: error: Function is missing a type annotation  [no-untyped-def]" in (
        result.stdout
    )


def test_every_event_is_frozen_to_the_type_checker(tmp_path: Path) -> None:
    # At run time the events are plain slotted dataclasses (`events._event`: a frozen one's
    # `__init__` cost 8.5 % of the tracker's time); mypy, which CI runs on every change,
    # refuses an assignment to any of their fields, as it would on a frozen dataclass.
    import dataclasses

    from monitor.core import events

    classes = [
        value
        for value in vars(events).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__ == events.__name__
    ]
    assert len(classes) == 15
    probe = tmp_path / "probe.py"
    lines = ["from monitor.core import events"]
    for n, cls in enumerate(classes):
        field = dataclasses.fields(cls)[0].name
        lines += [
            f"def assign_{n}(event: events.{cls.__name__}) -> None:",
            f"    event.{field} = event.{field}",
        ]
    probe.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = mypy("--cache-dir", str(tmp_path / "cache"), str(probe))
    refused = [line for line in result.stdout.splitlines() if "is read-only" in line]
    assert len(refused) == len(classes), result.stdout
    # Still equal and hashed by their fields, as a frozen dataclass is.
    for cls in classes:
        assert cls.__hash__ is not None and "__slots__" in vars(cls)
    seen = events.SessionSeen("ses_1", "/w", busy=True)
    assert seen == events.SessionSeen("ses_1", "/w", busy=True)
    assert hash(seen) == hash(events.SessionSeen("ses_1", "/w", busy=True))
