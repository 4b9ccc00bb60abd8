"""Reading systemd unit files: what test_systemd_units and test_launchd compare."""

from __future__ import annotations

from pathlib import Path

UNITS = Path(__file__).parent.parent / "systemd"
SERVICE = UNITS / "opencode-loop-monitor.service"
TEMPLATE = UNITS / "opencode-loop-monitor@.service"
USER_UNIT = UNITS / "user" / "opencode-loop-monitor.service"
TCP_DROP_IN = UNITS / "plugin-over-tcp.conf"
AGENT = UNITS.parent / "launchd" / "dev.opencode-loop-monitor.plist"
INSTALLED_BINARY = "/opt/opencode-loop-monitor/bin/opencode-loop-monitor"

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(text: str) -> Unit:
    """Sections of a unit file as (key, value) pairs in order.

    Not configparser: systemd allows a key more than once (SystemCallFilter=, and an
    empty assignment that resets a list), continues lines with a trailing backslash
    and has no interpolation.
    """
    sections: Unit = {}
    current: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition("=")
        current.append((key.strip(), " ".join(value.split())))
    return sections


def values(unit: Unit, section: str, key: str) -> list[str]:
    return [value for k, value in unit[section] if k == key]


def value(unit: Unit, section: str, key: str) -> str:
    (only,) = values(unit, section, key)
    return only


def load(path: Path) -> Unit:
    return parse_unit(path.read_text())
