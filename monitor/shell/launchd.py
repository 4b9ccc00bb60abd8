"""`opencode-loop-monitor unit --launchd`: the macOS LaunchAgent, for this install and home.

launchd expands no `~` or variables and gives an agent none of the shell's: the plist names
every path whole. Three things a copied plist got wrong, each settled here as it is printed:

- the command: this install's console script (as `unit`), and it must run where launchd
  runs it (macOS's own python3 is older than the 3.11 the monitor needs): `check_command`
  runs it as the agent would, with the agent's environment;
- the socket: the agent serves the plugin where the installed plugin asks, whatever folder
  the shell that ran `plugin install` derived (`$XDG_RUNTIME_DIR` set there, say), so the
  plist names it with --plugin-socket (or --plugin-addr and its token file);
- the password: never in the plist (a file others may read); --password-file FILE names a
  file, and a password only in this shell's environment is warned about, as the agent will
  not have it.
The shipped launchd/dev.opencode-loop-monitor.plist is this text for /opt and /Users/USER.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

from monitor.config import (
    SERVER_PASSWORD_VAR,
    STATUS_ADDRESS,
    ListenAddress,
    Settings,
    public_url,
)
from monitor.shell.endpoint import plugin_endpoint
from monitor.shell.plugin_install import (
    FILE_NAME,
    asked_at,
    installed_endpoint,
    plugins_dir,
    render,
)

__all__ = [
    "AGENT_PATH",
    "LABEL",
    "agent",
    "agent_environment",
    "check_command",
    "plugin_arguments",
    "render_agent",
]

LABEL = "dev.opencode-loop-monitor"
# Where launchd looks for a person's agents, under their home.
AGENT_PATH = f"Library/LaunchAgents/{LABEL}.plist"
LOG_PATH = "Library/Logs/opencode-loop-monitor.log"
# What launchd gives an agent: PATH without Homebrew's or a venv's folders, no XDG_*.
AGENT_PATH_VAR = "/usr/bin:/bin:/usr/sbin:/sbin"
# macOS's sockaddr_un holds 104 bytes with the final NUL (Linux's 108).
MAX_SOCKET_PATH = 103
CHECK_TIMEOUT_S = 30.0

TEMPLATE = """\
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!--
  opencode-loop-monitor beside your own `opencode serve`, as a launchd agent of the person who
  runs OpenCode: the recommended set-up on macOS, the counterpart of the systemd user unit.
  `opencode-loop-monitor unit` prints it, with its launchd flag, for its own install and your
  home, into ~/{agent_path}; then
    launchctl bootstrap gui/$(id -u) ~/{agent_path}
  Settings, a password, another URL: docs/operations.md, "macOS: a launchd agent".
-->
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{label}</string>
  <key>ProgramArguments</key>
  <array>
{arguments}
  </array>
  <key>EnvironmentVariables</key>
  <dict>
    <!-- A log file is not a terminal: Python would otherwise buffer log lines. -->
    <key>PYTHONUNBUFFERED</key>
    <string>1</string>
  </dict>
  <key>RunAtLoad</key>
  <true/>
  <!-- Restart after a crash, as Restart=on-failure does. launchd cannot leave out exit
       status 78 (a bad configuration) as RestartPreventExitStatus= does: the throttle
       keeps such restarts to one per 30 s, and the log says why. -->
  <key>KeepAlive</key>
  <dict>
    <key>SuccessfulExit</key>
    <false/>
  </dict>
  <key>ThrottleInterval</key>
  <integer>30</integer>
  <!-- SIGTERM to exit takes under 5 s; launchd waits this long before SIGKILL. -->
  <key>ExitTimeOut</key>
  <integer>15</integer>
  <key>ProcessType</key>
  <string>Background</string>
  <key>Umask</key>
  <integer>63</integer>
  <key>StandardOutPath</key>
  <string>{log}</string>
  <key>StandardErrorPath</key>
  <string>{log}</string>
</dict>
</plist>
"""

# Said beside the arguments in the plist, before the flag they explain.
_COMMENTS = {
    "--password-file": "The server's password: a file only you can read (chmod 600).",
    "--metrics-addr": "Prometheus /metrics and /status, where `opencode-loop-monitor status` asks.",
    "--plugin-socket": "Where the installed plugin asks for this server (`plugin install`).",
    "--plugin-addr": "Where the installed plugin asks, over loopback TCP with a token.",
}


def render_agent(
    command: Sequence[str],
    url: str | None,
    home: Path,
    plugin: Sequence[str],
    password_file: Path | None = None,
    metrics: ListenAddress = STATUS_ADDRESS,
) -> str:
    """The plist that runs `command watch` for the server at `url` (None: the one the
    monitor finds, OpenCode 2's registered service, else `opencode serve`'s default port),
    serving the plugin with the `plugin` arguments (`plugin_arguments`)."""
    password = [] if password_file is None else ["--password-file", str(password_file)]
    argv = [
        *command,
        "watch",
        *([] if url is None else ["--url", public_url(url)]),
        *password,
        "--metrics-addr",
        str(metrics),
        *plugin,
        "--log-format",
        "json",
    ]
    lines = []
    for word in argv:
        if word in _COMMENTS:
            # (Their texts hold no "--": an XML comment cannot.)
            lines.append(f"    <!-- {_COMMENTS[word]} -->")
        lines.append(f"    <string>{escape(word)}</string>")
    return TEMPLATE.format(
        label=LABEL,
        agent_path=AGENT_PATH,
        arguments="\n".join(lines),
        log=escape(str(home / LOG_PATH)),
    )


def plugin_arguments(address: Mapping[str, str | None], url: str) -> list[str]:
    """The flags that make the agent serve where an installed plugin, running in the server
    at `url`, asks (its address as `plugin_install.installed_endpoint` reads it)."""
    token_file = address.get("tokenFile")
    if token_file and not (address.get("socket") or address.get("socketDir")):
        parts = urlsplit(address.get("url") or "")
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        return ["--plugin-addr", f"{host}:{parts.port}", "--plugin-token-file", token_file]
    return ["--plugin-socket", asked_at(address, url)]


def agent_environment(home: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What launchd gives an agent of this person: HOME, USER, SHELL, TMPDIR, a short PATH."""
    given = {name: environ[name] for name in ("USER", "SHELL", "TMPDIR") if environ.get(name)}
    return {**given, "HOME": str(home), "PATH": AGENT_PATH_VAR, "PYTHONUNBUFFERED": "1"}


def check_command(command: Sequence[str], environment: Mapping[str, str]) -> str | None:
    """Why `command` would not run as the agent runs it, or None: started with `--version`
    in the agent's environment, as launchd would start it (an interpreter older than 3.11
    fails to import the monitor; a venv whose Python was removed fails to start)."""
    try:
        done = subprocess.run(
            [*command, "--version"],
            env=dict(environment),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = str(exc)
    else:
        if done.returncode == 0:
            return None
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        reason = last
    return (
        f"the agent's command does not run as launchd would run it ({reason}): the monitor "
        "needs Python 3.11 or later, and macOS's own python3 is older; make the virtual "
        'environment with a newer one (docs/operations.md, "macOS: a launchd agent") and '
        "run `unit --launchd` from it"
    )


def installed_address(environ: Mapping[str, str]) -> dict[str, str | None] | None:
    """Where the user-wide plugin asks, as `plugin install` wrote it; None when there is
    none of ours."""
    path = plugins_dir(None, environ) / FILE_NAME
    try:
        return installed_endpoint(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def agent(
    command: Sequence[str], settings: Settings, environ: Mapping[str, str]
) -> tuple[str, list[str]]:
    """The plist for `settings.url` and this person's home, and what it cannot say itself."""
    home = Path(environ.get("HOME") or Path.home())
    notes = list(settings.warnings)  # a password file others can read, say
    address = installed_address(environ)
    if address is None:
        endpoint = plugin_endpoint(settings, environ)  # what `plugin install` here writes
        assert endpoint is not None  # `unit` takes no plugin setting: the defaults serve one
        address = installed_endpoint(render(endpoint))
        assert address is not None
        notes.append(
            f"no plugin installed at {plugins_dir(None, environ) / FILE_NAME}: run "
            "`opencode-loop-monitor plugin install` (then restart OpenCode); it will ask "
            "where this agent serves"
        )
    plugin = plugin_arguments(address, settings.url)
    socket = plugin[1] if plugin[0] == "--plugin-socket" else None
    if socket is not None and len(os.fsencode(socket)) > MAX_SOCKET_PATH:
        notes.append(
            f"plugin socket {socket}: longer than the {MAX_SOCKET_PATH} bytes macOS allows a "
            "Unix socket's path; install the plugin with a shorter --plugin-socket"
        )
    password_file = settings.password_file
    if password_file is None and environ.get(SERVER_PASSWORD_VAR):
        notes.append(
            f"{SERVER_PASSWORD_VAR} is set in this shell, but launchd gives the agent none of "
            "its variables: write the password to a file only you can read (chmod 600) and "
            "run `unit --launchd --password-file FILE` (the plist names the file, never the "
            "password)"
        )
    elif password_file is not None:
        password_file = Path(os.path.abspath(password_file))  # launchd has no working folder
    broken = check_command(command, agent_environment(home, environ))
    if broken is not None:
        notes.append(broken)
    metrics = settings.metrics_addr or STATUS_ADDRESS
    # Given no --url, the agent's monitor finds its server itself, wherever it is then.
    url = None if settings.service is not None else settings.url
    text = render_agent(command, url, home, plugin, password_file, metrics)
    return text, notes
