"""`plugin install|uninstall|status`: what is written where, never through a link, and the
exit status of `plugin status` for each state it can find."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.config import Settings, load_settings
from monitor.errors import ConfigError
from monitor.exits import (
    EX_NOT_INSTALLED,
    EX_OK,
    EX_OTHER_RELEASE,
    EX_OTHER_SERVER,
    EX_UNAVAILABLE,
)
from monitor.shell import plugin_install
from monitor.shell.endpoint import PluginEndpoint, link_server_pid, unlink_server_pid
from monitor.shell.plugin_install import (
    FILE_NAME,
    asked_at,
    install,
    installed_endpoint,
    status,
    uninstall,
)


@pytest.fixture
def home(folder: Path) -> Path:
    """The sockets below live in it: conftest's short `folder`."""
    return folder


def env(home: Path) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(home / "config"), "XDG_RUNTIME_DIR": str(home / "run")}


def settings(**flags: str) -> Settings:
    return load_settings(flags, {}, isatty=False)


def listening(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    return server


def address(path: Path) -> dict[str, str | None]:
    found = installed_endpoint(path.read_text(encoding="utf-8"))
    assert found is not None
    return found


def test_install_without_url_points_at_the_socket_folder(home: Path) -> None:
    said = install(settings(), None, env(home))
    path = home / "config" / "opencode" / "plugins" / FILE_NAME
    folder = home / "run" / "opencode-loop-monitor"
    assert address(path) == {
        "url": "http://localhost/v1/decide",
        "socket": str(folder / "plugin-4096.sock"),  # where a 2.x server (no URL known) asks
        "socketDir": str(folder),
        "tokenFile": None,
    }
    assert path.stat().st_mode & 0o777 == 0o644
    assert f"wrote {path}" in said and "plugin-PORT.sock" in said
    assert sorted(os.listdir(path.parent)) == [FILE_NAME]  # no temporary file left


def test_install_with_a_fixed_socket_or_tcp(home: Path) -> None:
    fixed = str(home / "sockets" / "x.sock")
    install(settings(plugin_socket=fixed), None, env(home))
    path = home / "config" / "opencode" / "plugins" / FILE_NAME
    assert (address(path)["socket"], address(path)["socketDir"]) == (fixed, None)
    token = home / "token"
    install(settings(plugin_addr="127.0.0.1:7001", plugin_token_file=str(token)), None, env(home))
    assert address(path) == {
        "url": "http://127.0.0.1:7001/v1/decide", "socket": None, "socketDir": None,
        "tokenFile": str(token),
    }  # fmt: skip
    assert token.stat().st_mode & 0o777 == 0o600


def test_install_refuses_a_socket_folder_another_user_can_write_to(home: Path) -> None:
    # Issue 33: in such a folder another user plants a socket, and the plugin asked it and
    # showed the model its answers. Refused here, at the daemon's start and by the plugin.
    path = home / "config" / "opencode" / "plugins" / FILE_NAME
    with pytest.raises(
        ConfigError,
        match=r"^plugin install: plugin_socket folder /tmp: others "
        r"can open it \(mode 1777\), and whoever can write there could put a "
        r"socket that the plugin would ask; use a folder",
    ):
        install(settings(plugin_socket="/tmp/x.sock"), None, env(home))
    shared = home / "run" / "opencode-loop-monitor"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="others can open it"):
        install(settings(), None, env(home))
    assert not path.exists()
    shared.chmod(0o700)
    install(settings(), None, env(home))
    assert path.exists()


def test_install_never_writes_through_a_link(home: Path) -> None:
    folder = home / "project" / ".opencode" / "plugins"
    folder.mkdir(parents=True)
    victim = home / "victim"
    victim.write_text("secret")
    # The old fixed temporary name, and the file's own name, both planted as links.
    (folder / f"{FILE_NAME}.tmp").symlink_to(victim)
    (folder / FILE_NAME).symlink_to(victim)
    install(settings(), home / "project", env(home))
    assert victim.read_text() == "secret"
    assert not (folder / FILE_NAME).is_symlink()
    assert "export default" in (folder / FILE_NAME).read_text()


def test_install_through_an_existing_temporary_name_fails_cleanly(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = home / "config" / "opencode" / "plugins"
    folder.mkdir(parents=True)
    victim = home / "victim"
    victim.write_text("secret")
    monkeypatch.setattr(plugin_install.secrets, "token_hex", lambda _: "guess")
    (folder / f".{FILE_NAME}.guess.tmp").symlink_to(victim)
    with pytest.raises(ConfigError, match="cannot write"):
        install(settings(), None, env(home))
    assert victim.read_text() == "secret"
    assert not (folder / FILE_NAME).exists()


def test_uninstall_project_removes_the_folders_it_made_and_nothing_else(home: Path) -> None:
    project = home / "project"
    project.mkdir()
    install(settings(), project, env(home))
    said = uninstall(project, env(home))
    assert sorted(os.listdir(project)) == []
    assert said.splitlines()[:3] == [
        f"removed {project / '.opencode' / 'plugins' / FILE_NAME}",
        f"removed {project / '.opencode' / 'plugins'}",
        f"removed {project / '.opencode'}",
    ]
    install(settings(), project, env(home))
    (project / ".opencode" / "opencode.json").write_text("{}")
    uninstall(project, env(home))
    assert sorted(os.listdir(project / ".opencode")) == ["opencode.json"]


def test_uninstall_leaves_a_link_and_a_file_not_ours(home: Path) -> None:
    folder = home / "config" / "opencode" / "plugins"
    folder.mkdir(parents=True)
    ours = home / "elsewhere.ts"
    install(settings(), None, env(home))
    (folder / FILE_NAME).rename(ours)
    (folder / FILE_NAME).symlink_to(ours)  # our text, but behind a link
    with pytest.raises(ConfigError, match="cannot read"):
        uninstall(None, env(home))
    assert (folder / FILE_NAME).is_symlink() and ours.exists()
    (folder / FILE_NAME).unlink()
    (folder / FILE_NAME).write_text("export default {}")
    with pytest.raises(ConfigError, match="not written by us"):
        uninstall(None, env(home))
    assert uninstall(home / "nowhere", env(home)).startswith("not installed")


def test_status_for_each_state(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin_install, "ANSWER_TIMEOUT_S", 0.2)
    environ = env(home)
    text, code = status(settings(), None, environ)
    assert code == EX_NOT_INSTALLED and text.startswith("not installed")
    install(settings(), None, environ)
    folder = home / "run" / "opencode-loop-monitor"
    text, code = status(settings(url="http://127.0.0.1:4321"), None, environ)
    assert code == EX_UNAVAILABLE
    assert f"it asks: {folder / 'plugin-4321.sock'}" in text and "nothing answers" in text
    with listening(folder / "plugin-4321.sock"):
        # Something takes connections there but answers no question (a monitor answering
        # is in tests/test_plugin_versions.py).
        text, code = status(settings(url="http://127.0.0.1:4321"), None, environ)
        assert code == EX_UNAVAILABLE
        assert "a monitor answers there, but not the plugin's question: no answer" in text
        # The monitor of another port answers its own server's plugin, not this one's.
        assert status(settings(url="http://127.0.0.1:4322"), None, environ).code == EX_UNAVAILABLE
    # A plugin pinned to one socket, answered there by a monitor that is not --url's.
    fixed = home / "fixed.sock"
    install(settings(plugin_socket=str(fixed)), None, environ)
    with listening(fixed):
        text, code = status(settings(), None, environ)
    assert code == EX_OTHER_SERVER and "it watches another server" in text


def test_the_cli_exits_with_the_status(home: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for name, value in env(home).items():
        monkeypatch.setenv(name, value)
    assert main(["plugin", "status"]) == EX_NOT_INSTALLED
    assert main(["plugin", "install"]) == EX_OK
    assert main(["plugin", "status"]) == EX_UNAVAILABLE
    out = capsys.readouterr().out
    assert "nothing answers there" in out


def test_a_file_of_the_previous_release_is_ours(home: Path) -> None:
    folder = home / "config" / "opencode" / "plugins"
    folder.mkdir(parents=True)
    (folder / FILE_NAME).write_text(
        "// Installed by `opencode-loop-monitor plugin install`, which writes ENDPOINT below.\n"
        "const ENDPOINT: { url: string; socket: string | null; tokenFile: string | null } = "
        '{"url": "http://localhost/v1/decide", "socket": "/s.sock", "tokenFile": null}\n'
    )
    text, code = status(settings(), None, env(home))
    assert code == EX_UNAVAILABLE and "it asks: /s.sock" in text
    assert uninstall(None, env(home)).startswith(f"removed {folder / FILE_NAME}")


def test_a_monitor_names_its_socket_after_its_servers_pid(folder: Path) -> None:
    # OpenCode 2 gives its plugin no URL; the plugin knows its server's pid (it runs in that
    # process), which /api/info tells the monitor: the link leads the plugin to it whatever
    # port the monitor was given (loop-guard.ts ownSocket).
    socket_path = folder / "plugin-14596.sock"
    socket_path.touch()
    ours = PluginEndpoint(socket_path, socket_dir=folder)
    (folder / "plugin-5000.sock").touch()
    os.symlink("plugin-5000.sock", folder / "server-77.sock")  # another live monitor's
    os.symlink("plugin-6000.sock", folder / "server-78.sock")  # its socket gone: of no use
    os.symlink("plugin-14596.sock", folder / "server-79.sock")  # an earlier run of ours
    link = link_server_pid(ours, 321)
    assert link == folder / "server-321.sock"
    assert os.readlink(link) == "plugin-14596.sock"  # relative: into its own private folder
    assert sorted(p.name for p in folder.iterdir() if p.is_symlink()) == [
        "server-321.sock", "server-77.sock",
    ]  # fmt: skip
    # Published again (a reconnect): replaced in place, nothing else left.
    assert link_server_pid(ours, 321) == link
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    # A plugin status given the pid asks where the plugin would.
    address = {"socketDir": str(folder), "socket": str(folder / "plugin-4096.sock")}
    assert asked_at(address, "http://127.0.0.1:4596", 321) == str(folder / "plugin-14596.sock")
    assert asked_at(address, "http://127.0.0.1:4596", 322) == str(folder / "plugin-4596.sock")
    assert asked_at(address, "http://127.0.0.1:4596") == str(folder / "plugin-4596.sock")
    # Withdrawn only while it is still ours.
    unlink_server_pid(ours, 77)
    assert (folder / "server-77.sock").is_symlink()
    unlink_server_pid(ours, 321)
    assert not link.exists() and not link.is_symlink()
    unlink_server_pid(ours, 321)  # twice: nothing to do


def test_no_pid_link_without_a_folder_of_sockets(folder: Path) -> None:
    fixed = PluginEndpoint(folder / "x.sock")
    tcp = PluginEndpoint(None, "127.0.0.1", 7001, folder / "token")
    assert link_server_pid(fixed, 1) is None and link_server_pid(tcp, 1) is None
    unlink_server_pid(fixed, 1)
    assert list(folder.iterdir()) == []


def test_status_says_a_file_that_asks_another_socket_under_opencode_2(home: Path) -> None:
    # V2-REAL-NOTES 7.4: a file from before the 2.x lookup asked plugin-4096.sock in every
    # OpenCode 2 server; a monitor answering at the server's port is no answer to it.
    environ = env(home)
    install(settings(), None, environ)
    path = home / "config" / "opencode" / "plugins" / FILE_NAME
    path.write_text(path.read_text().replace(plugin_install._OWN_SERVER, "null"))
    folder = home / "run" / "opencode-loop-monitor"
    with listening(folder / "plugin-4596.sock"):
        text, code = status(settings(url="http://127.0.0.1:4596"), None, environ)
    assert code == EX_OTHER_RELEASE and "a monitor answers" not in text
    assert f"in an OpenCode 2 server it asks {folder / 'plugin-4096.sock'}" in text
    assert "plugin install` again" in text
    # On the port install named, both generations ask the same socket: nothing to say.
    text, code = status(settings(url="http://127.0.0.1:4096"), None, environ)
    assert code == EX_UNAVAILABLE and "OpenCode 2" not in text
