"""One acting monitor per server (monitor.shell.acting): which of several monitors acts, and
for which sessions. A lock belongs to an open file, so two `Role`s in one process see each
other as two processes would."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from monitor.shell import acting
from monitor.shell.acting import Role

URL = "http://127.0.0.1:4096"
SESSION = "ses_0123456789abcdefABCDEF"


def test_the_first_watch_acts_and_the_second_stands_by_until_the_first_stops(tmp_path: Path):
    first, second = Role(tmp_path, URL), Role(tmp_path, URL)
    assert first.try_acting() and first.acting
    assert not second.try_acting() and not second.acting
    assert second.holder() == os.getpid()  # what the acting one wrote
    assert first.attached() == second.attached() == frozenset()
    first.close()
    assert second.try_acting() and second.acting
    assert not first.try_acting()  # the order changed hands for good


def test_monitors_of_other_servers_do_not_see_each_other(tmp_path: Path):
    here, there = Role(tmp_path, URL), Role(tmp_path, "http://127.0.0.1:4097")
    assert here.try_acting() and there.try_acting()
    # A URL's path or trailing slash is the same server; the default port is its scheme's.
    assert not Role(tmp_path, URL + "/").try_acting()
    port_80 = Role(tmp_path, "http://127.0.0.1")  # kept: a Role let go releases its lock
    assert port_80.try_acting()
    assert not Role(tmp_path, "http://127.0.0.1:80/x").try_acting()


def test_attach_beside_a_daemon_stands_by_and_acts_once_the_daemon_is_gone(tmp_path: Path):
    daemon, attach = Role(tmp_path, URL), Role(tmp_path, URL, SESSION)
    assert daemon.try_acting()
    assert not attach.try_acting() and not attach.acting
    daemon.close()
    assert attach.try_acting() and attach.acting
    assert attach.attached() == frozenset()  # an attach leaves nothing: it follows its one


def test_a_daemon_started_beside_an_acting_attach_leaves_it_that_session(tmp_path: Path):
    attach = Role(tmp_path, URL, SESSION)
    assert attach.try_acting()
    daemon = Role(tmp_path, URL)
    assert daemon.try_acting()  # it acts for the server...
    assert daemon.attached() == {SESSION}  # ...but the attached session is the attach's
    attach.close()
    assert daemon.attached() == frozenset()  # the attach ended: the daemon's again
    assert list(tmp_path.glob("attach-*")) == []  # its file went with it


def test_a_daemon_taking_the_lock_as_an_attach_starts_leaves_it_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    attach, daemon = Role(tmp_path, URL, SESSION), Role(tmp_path, URL)
    locking = acting._try_lock

    def racing(path: str | Path, create: bool) -> object:
        if Path(path).name.startswith("attach-"):
            # A daemon starting just before the attach locks its session: the server's
            # lock is still the attach's.
            assert not daemon.try_acting()
        return locking(path, create)

    monkeypatch.setattr(acting, "_try_lock", racing)
    assert attach.try_acting()
    monkeypatch.undo()
    assert daemon.try_acting()  # the attach let the server's lock go
    assert daemon.attached() == {SESSION}


def test_a_daemon_asks_the_file_system_only_about_sessions_attached_when_it_took_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    attach = Role(tmp_path, URL, SESSION)
    assert attach.try_acting()
    daemon = Role(tmp_path, URL)
    assert daemon.try_acting()
    opened: list[str] = []
    real_open = os.open

    def counted(path: str, *args: int) -> int:
        opened.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", counted)
    assert daemon.attached() == {SESSION}
    assert [Path(path).name for path in opened] == [f"attach-loopback-4096-{SESSION}.lock"]


def test_two_attach_of_one_session_act_once(tmp_path: Path):
    first, second = Role(tmp_path, URL, SESSION), Role(tmp_path, URL, SESSION)
    assert first.try_acting() and not second.try_acting()
    other = Role(tmp_path, URL, "ses_other")
    assert other.try_acting()  # another session's attach acts for that one


def test_a_session_id_cannot_name_a_file_outside_the_folder(tmp_path: Path):
    attach = Role(tmp_path / "locks", URL, "../../etc/x")
    (tmp_path / "locks").mkdir()
    assert attach.try_acting()
    [made] = [p for p in (tmp_path / "locks").iterdir() if p.name.startswith("attach-")]
    assert made.name == "attach-loopback-4096-.._.._etc_x.lock"


# -- one server, whatever the spelling (issue 43) ---------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:4096",
        "http://127.0.0.1:4096/",
        "http://[::1]:4096",
        "http://127.0.0.2:4096",
        "http://LOCALHOST.:4096",
        "http://[::ffff:127.0.0.1]:4096",
        "https://0.0.0.0:4096",
    ],
)
def test_every_spelling_of_this_machines_server_is_one_key_per_port(url: str):
    assert acting.server_key(url) == acting.server_key(URL) == "loopback-4096"


def test_other_ports_and_other_hosts_are_other_servers():
    assert acting.server_key("http://localhost:4097") == "loopback-4097"
    assert acting.server_key("http://localhost") == "loopback-80"
    assert acting.server_key("https://[::1]") == "loopback-443"
    assert acting.server_key("http://10.0.0.5:4096") == "10.0.0.5-4096"
    assert acting.server_key("http://[2001:db8::1]:4096") == "2001_db8__1-4096"


def test_a_name_is_keyed_by_its_lowest_address_whatever_order_the_resolver_gives(
    monkeypatch: pytest.MonkeyPatch,
):
    answers = [["10.0.0.9", "10.0.0.5", "2001:db8::1"], ["2001:db8::1", "10.0.0.5", "10.0.0.9"]]

    def resolve(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        assert (host, port) == ("build.example", 4096)
        return [(0, 0, 0, "", (address, port)) for address in answers.pop()]

    monkeypatch.setattr(acting.socket, "getaddrinfo", resolve)
    keys = {acting.server_key("http://build.example:4096") for _ in range(2)}
    assert keys == {"10.0.0.5-4096"}


def test_a_name_that_resolves_to_loopback_is_this_machines_server(monkeypatch: pytest.MonkeyPatch):
    def resolve(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        return [(0, 0, 0, "", ("127.0.1.1", port))]  # Debian's /etc/hosts for the host's name

    monkeypatch.setattr(acting.socket, "getaddrinfo", resolve)
    assert acting.server_key("http://myhost:4096") == "loopback-4096"


def test_a_name_that_does_not_resolve_is_keyed_by_itself(monkeypatch: pytest.MonkeyPatch):
    def resolve(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        raise OSError("no such name")

    monkeypatch.setattr(acting.socket, "getaddrinfo", resolve)
    assert acting.server_key("http://gone.example:4096") == "gone.example-4096"


def test_two_spellings_of_one_server_give_one_acting_monitor(tmp_path: Path):
    first, second = Role(tmp_path, "http://localhost:4096"), Role(tmp_path, "http://127.0.0.1:4096")
    assert first.try_acting()
    assert not second.try_acting() and not second.acting
    third = Role(tmp_path, "http://[::1]:4096")
    assert not third.try_acting()
    first.close()
    assert second.try_acting() and not third.try_acting()


# -- the monitor the plugin asks is the one that acts (issue 43) ------------------------------


def test_a_watch_without_endpoint_started_second_stands_by_for_the_endpoint_one(tmp_path: Path):
    served, bare = Role(tmp_path, URL, endpoint=True), Role(tmp_path, URL)
    assert served.try_acting() and served.serves
    assert not bare.try_acting() and not bare.serves
    assert not bare.give_way()  # it does not act: nothing to give
    served.close()
    assert bare.try_acting()  # gone: the one without an endpoint takes over


def test_a_watch_without_endpoint_started_first_gives_the_role_to_the_endpoint_one(
    tmp_path: Path,
):
    bare, served = Role(tmp_path, URL), Role(tmp_path, URL, endpoint=True)
    assert bare.try_acting() and not bare.give_way()  # alone: it acts
    # The endpoint monitor holds the endpoint lock at once, and stands by for a poll.
    assert not served.try_acting() and served.serves and not served.acting
    assert bare.give_way() and not bare.acting  # its next poll
    assert served.holder() is None  # nobody acts for a moment: no pid to show
    assert not bare.try_acting()  # and it does not take it back
    assert served.try_acting() and served.acting  # the endpoint monitor's next poll
    assert bare.holder() == os.getpid()
    assert not bare.give_way()
    served.close()
    assert bare.try_acting()


def test_a_watch_without_endpoint_that_took_the_lock_as_the_endpoint_one_started_lets_it_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    bare, served = Role(tmp_path, URL), Role(tmp_path, URL, endpoint=True)
    locking = acting._try_lock

    def racing(path: str | Path, create: bool) -> object:
        taken = locking(path, create)
        if Path(path).name.startswith("acting-") and taken is not None:
            # The endpoint monitor starts between the bare one's check and its lock: it
            # finds the acting lock taken and stands by.
            assert not served.try_acting() and served.serves
        return taken

    monkeypatch.setattr(acting, "_try_lock", racing)
    assert not bare.try_acting() and not bare.acting  # checked again once it had the lock
    monkeypatch.undo()
    assert served.try_acting()


def test_an_endpoint_monitor_stopped_by_a_probe_takes_its_endpoint_lock_at_the_next_poll(
    tmp_path: Path,
):
    served = Role(tmp_path, URL, endpoint=True)
    endpoint_file = tmp_path / "endpoint-loopback-4096.lock"
    endpoint_file.touch()
    with endpoint_file.open() as probe:
        fcntl.flock(probe, fcntl.LOCK_SH)  # another monitor's probe, at that very moment
        assert served.try_acting() and not served.serves  # it acts, serving nothing yet
    assert served.try_acting() and served.serves


def test_probes_of_monitors_without_endpoint_do_not_take_each_other_for_one(tmp_path: Path):
    first, second = Role(tmp_path, URL), Role(tmp_path, URL)
    (tmp_path / "endpoint-loopback-4096.lock").touch()  # left by an endpoint monitor gone
    with (tmp_path / "endpoint-loopback-4096.lock").open() as probe:
        fcntl.flock(probe, fcntl.LOCK_SH)  # the standby's probe, at the acting one's poll
        assert first.try_acting() and not first.give_way()
    assert not second.try_acting()


def test_of_two_endpoint_monitors_the_one_with_the_endpoint_lock_acts(tmp_path: Path):
    first, second = Role(tmp_path, URL, endpoint=True), Role(tmp_path, URL, endpoint=True)
    assert first.try_acting() and first.serves
    assert not second.try_acting() and not second.serves
    first.close()
    assert second.try_acting() and second.serves


def test_attach_does_not_act_while_an_endpoint_monitor_stands_by(tmp_path: Path):
    bare, served = Role(tmp_path, URL), Role(tmp_path, URL, endpoint=True)
    attach = Role(tmp_path, URL, SESSION, endpoint=True)  # an attach serves no endpoint
    assert bare.try_acting() and not served.try_acting() and bare.give_way()
    assert not attach.try_acting() and not attach.serves
    assert served.try_acting()
