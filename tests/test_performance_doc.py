"""docs/performance.md opens with the figures that hold now, each with its command (issue 45:
a reader looking for "how fast is it" read 1,100 lines of dated sections)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_SCREEN = 50  # lines


def test_the_figures_that_hold_now_are_on_the_first_screen_with_their_commands() -> None:
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## Where it stands")
    first_row = next(n for n in range(start, len(lines)) if lines[n].startswith("| "))
    last_row = next(n for n in range(first_row, len(lines)) if not lines[n].startswith("|")) - 1
    assert last_row < FIRST_SCREEN
    figures = lines[first_row + 2 : last_row + 1]  # under the header and its rule
    assert len(figures) >= 8
    for row in figures:
        modules = re.findall(r"`python -m (bench\.\w+)", row)
        assert modules, row  # each figure with the command that gives it
        for module in modules:
            assert (ROOT / Path(*module.split("."))).with_suffix(".py").is_file(), module
    # The dated history comes after them.
    assert lines.index("## Results") > last_row
