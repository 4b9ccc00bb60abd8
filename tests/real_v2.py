"""What the real-server tests on OpenCode 2.2.5 share: the monitor's console script started
as a 2.x user starts it, and the server's record read as people read it."""

from __future__ import annotations

import subprocess
from typing import Any

from monitor.kit.sandbox import OpencodeServer2
from tests.monitor_process import CONSOLE_SCRIPT, MonitorProcess

__all__ = [
    "answers",
    "no_refused_request",
    "users",
    "users_shell",
    "watching",
    "watching_with_the_plugin",
]


def users(record: list[dict[str, Any]]) -> list[str]:
    return [item["text"] for item in record if item.get("type") == "user"]


def answers(record: list[dict[str, Any]]) -> list[str]:
    return [
        entry["text"]
        for item in record
        if item.get("type") == "assistant"
        for entry in item.get("content", [])
        if entry.get("type") == "text"
    ]


def no_refused_request(monitor: MonitorProcess) -> None:
    """No request of the monitor's was refused: each went in the server's own form."""
    for record in monitor.records():
        assert "(400)" not in str(record.get("error", "")), record


def users_shell(server: OpencodeServer2) -> dict[str, str]:
    """The variables of the person's shell who runs this server: its home, its XDG folders
    (`plugin install` writes there, the daemon's socket goes under its runtime folder)."""
    env = server.client_environment()
    return {key: value for key, value in env.items() if key == "HOME" or key.startswith("XDG_")}


async def watching(start_monitor: Any, server: OpencodeServer2, *flags: str) -> MonitorProcess:
    """`watch --url URL` as a user types it, the password in the server's variable."""
    env = {**users_shell(server), "OPENCODE_SERVER_PASSWORD": server.password}
    argv = ["watch", "--url", server.url, "--log-format", "json", *flags]
    monitor = start_monitor(*argv, env=env)
    await monitor.wait_event("stream.resynced")
    return monitor


async def watching_with_the_plugin(
    start_monitor: Any, server: OpencodeServer2, *flags: str
) -> MonitorProcess:
    """`plugin install` in the server's user's shell, then `watching`: the monitor has linked
    its socket to the server's pid (`plugin.linked`), where the plugin finds it."""
    installed = subprocess.run(
        [str(CONSOLE_SCRIPT), "plugin", "install"],
        env=users_shell(server),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    monitor = await watching(start_monitor, server, *flags)
    [linked] = monitor.events("plugin.linked")
    assert linked["server_pid"] == server.pid
    return monitor
