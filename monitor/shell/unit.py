"""`opencode-loop-monitor unit`: the systemd user unit, with ExecStart= for this install.

The unit shipped in systemd/user/ names /opt/opencode-loop-monitor, which the README's
install (a clone's `.venv`) does not produce, and `systemd-analyze verify` fails on it until
it is edited. This prints the same unit for the console script that runs, so it verifies as
printed. The shipped file is this text for the /opt path (tests/test_systemd_units.py).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from monitor.config import SERVER_PASSWORD_VAR, STATUS_ADDRESS, ListenAddress, Settings, public_url

__all__ = ["INSTALLED_BINARY", "notes", "render", "this_install"]

SCRIPT = "opencode-loop-monitor"
# Where the system units, and the shipped copy of this one, expect the console script.
INSTALLED_BINARY = f"/opt/{SCRIPT}/bin/{SCRIPT}"

TEMPLATE = """\
# opencode-loop-monitor beside your own `opencode serve`, as a unit of your systemd user
# manager: the recommended set-up on Linux. It runs as you, so the OpenCode plugin you
# installed (`opencode-loop-monitor plugin install`) reaches its owner-only socket.
# `opencode-loop-monitor unit` prints this unit with ExecStart= for its own install:
#   mkdir -p ~/.config/systemd/user
#   opencode-loop-monitor unit > ~/.config/systemd/user/opencode-loop-monitor.service
#   systemctl --user daemon-reload && systemctl --user enable --now opencode-loop-monitor
# Settings, a password, another URL: docs/operations.md, "Linux: a user unit".

[Unit]
Description=opencode loop monitor (aborts sessions that loop on tool calls)

[Service]
# READY=1 once the configuration is read and the event stream is open, as in the system unit.
Type=notify
NotifyAccess=main
# --metrics-addr: Prometheus /metrics and /status, where `opencode-loop-monitor status` asks.
# Without --url: OpenCode 2's background service, where it registers itself (followed when it
# restarts on another port), else http://127.0.0.1:4096, `opencode serve`'s default.
ExecStart={command} watch \\
{url}{password}    --metrics-addr {metrics} \\
    --log-format json
# Optional: OPENCODE_LOOP_MONITOR_<FLAG>= lines, OPENCODE_SERVER_PASSWORD= (your server's
# password; keep the file chmod 600) or OPENCODE_LOOP_MONITOR_PASSWORD_FILE=.
EnvironmentFile=-%h/.config/opencode-loop-monitor/monitor.env
# $XDG_RUNTIME_DIR/opencode-loop-monitor, made 0700 for the socket the plugin asks
# (plugin-PORT.sock): the folder `plugin install` in your shell points the plugin at.
# systemd removes it when the monitor stops, and the plugin then fails open.
RuntimeDirectory=opencode-loop-monitor
RuntimeDirectoryMode=0700
Environment=PYTHONUNBUFFERED=1
SyslogIdentifier=opencode-loop-monitor

WatchdogSec=30s
TimeoutStartSec=90s
TimeoutStopSec=15s
Restart=on-failure
RestartSec=5s
# 78 (EX_CONFIG): bad configuration or a rejected password. Restarting cannot fix that.
RestartPreventExitStatus=78
LimitNOFILE=8192
# A user manager cannot build the system unit's sandbox (most of it needs privileges);
# these need none.
NoNewPrivileges=yes
UMask=0077

[Install]
WantedBy=default.target
"""


def _word(text: str) -> str:
    """`text` as one word of ExecStart=: systemd expands % specifiers and $ variables there,
    and splits at white space unless quoted."""
    text = text.replace("%", "%%").replace("$", "$$")
    if re.search(r"[\s\"'\\;]", text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def this_install() -> list[str]:
    """The command that runs this monitor: the console script beside this Python, or the
    Python itself with `-m monitor` (a checkout run without installing)."""
    beside = Path(sys.executable).parent / SCRIPT
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-m", "monitor"]


def render(
    command: Sequence[str],
    url: str | None = None,
    password_file: Path | None = None,
    metrics: ListenAddress = STATUS_ADDRESS,
) -> str:
    """The unit of `command watch` of the server at `url` (None: the one the monitor finds,
    see the template)."""
    # A password in the URL stays out of a file others may read: monitor.env carries it,
    # or the file given, which the unit names.
    # systemd runs it from /: a relative path is made whole here.
    password = (
        ""
        if password_file is None
        else f"    --password-file {_word(os.path.abspath(password_file))} \\\n"
    )
    return TEMPLATE.format(
        command=" ".join(_word(word) for word in command),
        url="" if url is None else f"    --url {_word(public_url(url))} \\\n",
        password=password,
        metrics=_word(str(metrics)),
    )


def notes(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """What the printed unit would get wrong that it cannot say itself."""
    found = list(settings.warnings)  # a password file others can read, say
    if settings.password_file is None and environ.get(SERVER_PASSWORD_VAR):
        found.append(
            f"{SERVER_PASSWORD_VAR} is set in this shell, but the unit's service does not "
            f"inherit it: put {SERVER_PASSWORD_VAR}=... in "
            "~/.config/opencode-loop-monitor/monitor.env (chmod 600), or run `unit "
            "--password-file FILE`"
        )
    return found
