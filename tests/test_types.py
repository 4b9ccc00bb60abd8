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
