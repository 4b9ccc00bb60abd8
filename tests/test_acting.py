"""One acting monitor per server (monitor.shell.acting): which of several monitors acts, and
for which sessions. A lock belongs to an open file, so two `Role`s in one process see each
other as two processes would."""

from __future__ import annotations

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
    assert first.acts_for(SESSION) and not second.acts_for(SESSION)
    first.close()
    assert second.try_acting() and second.acts_for(SESSION)
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
    assert not attach.try_acting() and not attach.acts_for(SESSION)
    daemon.close()
    assert attach.try_acting()
    assert attach.acts_for(SESSION) and not attach.acts_for("ses_other")


def test_a_daemon_started_beside_an_acting_attach_leaves_it_that_session(tmp_path: Path):
    attach = Role(tmp_path, URL, SESSION)
    assert attach.try_acting()
    daemon = Role(tmp_path, URL)
    assert daemon.try_acting()  # it acts for the server...
    assert not daemon.acts_for(SESSION)  # ...but the attached session is the attach's
    assert daemon.acts_for("ses_other")
    attach.close()
    assert daemon.acts_for(SESSION)  # the attach ended: the daemon's again
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
    assert not daemon.acts_for(SESSION) and daemon.acts_for("ses_other")


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
    assert daemon.acts_for("ses_other") and daemon.acts_for("ses_another")
    assert not daemon.acts_for(SESSION)
    assert [Path(path).name for path in opened] == [f"attach-127.0.0.1-4096-{SESSION}.lock"]


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
    assert made.name == "attach-127.0.0.1-4096-.._.._etc_x.lock"
