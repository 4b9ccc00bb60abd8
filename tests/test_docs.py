"""The documents that dashboards and operators rely on agree with the code."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def logged_events() -> set[str]:
    # A log call in the shell, or a line the core (an intervention, `Monitor`) asks the shell
    # to log.
    pattern = re.compile(
        r'(?:log\.(?:debug|info|warning|error)\(|(?:Logged|Log)\(\s*"(?:debug|info|warning|error)",)'
        r'\s*"([a-z_.]+)"'
    )
    return {
        name
        for path in (ROOT / "monitor").rglob("*.py")
        for name in pattern.findall(path.read_text(encoding="utf-8"))
    }


def test_every_logged_event_is_documented_and_nothing_else():
    documented = set(
        re.findall(r"^### `([a-z_.]+)`", (ROOT / "docs" / "logs.md").read_text(), re.M)
    )
    assert logged_events() == documented
    assert {"monitor.started", "loop.detected", "frame.malformed"} <= documented
