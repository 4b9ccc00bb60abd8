"""Plugin files of earlier releases, as `plugin install` of each wrote them (issue 46: the file
an upgrade leaves behind). Kept as text (`.ts.txt`): recordings of what shipped, not code of
ours; a test writes one where OpenCode or Bun loads it.

- 3872d79: the commit of issue 46's trial: signs over TCP, sends no version.
- db8faf3: before the signature (issue 33): sends the token in the clear over TCP.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from monitor.shell.endpoint import PluginEndpoint
from monitor.shell.plugin_install import render

FOLDER = Path(__file__).parent / "plugin" / "earlier"
ENDPOINT_LINE = "const ENDPOINT: Endpoint = "


def text(commit: str) -> str:
    return (FOLDER / f"loop-guard-{commit}.ts.txt").read_text(encoding="utf-8")


def written(commit: str) -> Callable[[PluginEndpoint], str]:
    """How `plugin install` of the release at `commit` wrote its file for an endpoint."""
    shipped = text(commit)

    def install(endpoint: PluginEndpoint) -> str:
        [line] = [
            line
            for line in render(endpoint).splitlines(keepends=True)
            if line.startswith(ENDPOINT_LINE)
        ]
        return "".join(
            line if old.startswith(ENDPOINT_LINE) else old
            for old in shipped.splitlines(keepends=True)
        )

    return install
