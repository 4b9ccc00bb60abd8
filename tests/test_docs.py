"""The documents that dashboards and operators rely on agree with the code."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def logged_events() -> set[str]:
    pattern = re.compile(r'log\.(?:debug|info|warning|error)\(\s*"([a-z_.]+)"')
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
