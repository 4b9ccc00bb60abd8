"""The sd_notify client, checked against real AF_UNIX datagram sockets standing in for systemd."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from monitor.kit.poll import until
from monitor.shell import notify
from monitor.shell.notify import Notifier, encode, socket_address, watchdog_interval, watchdog_pings


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket in the file system and the NOTIFY_SOCKET value naming it."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        yield sock, str(path)


@pytest.fixture
def abstract_listener() -> Iterator[tuple[socket.socket, str]]:
    """The same in the abstract namespace, which systemd uses inside containers."""
    name = f"opencode-loop-monitor-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        yield sock, "@" + name


# What the test itself sends to the socket to learn that the reader has read everything
# sent before it; not a field systemd knows, and never kept among the arrivals.
MARKER = b"TEST_MARKER=1"


class Arrivals:
    """Datagrams with their arrival times, read by a thread.

    A thread, because the tests block the event loop on purpose and the clock must
    keep reading while they do.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.received: list[tuple[float, bytes]] = []
        self._sock = sock
        self._marked = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        self._sock.settimeout(0.01)
        while not self._stop.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            if data == MARKER:
                self._marked.set()
            else:
                self.received.append((time.monotonic(), data))

    async def read_all(self) -> None:
        """Wait until every datagram sent so far has been read: send a marker after them
        and wait for it (a datagram socket hands them over in the order they were sent)."""
        self._marked.clear()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(MARKER, self._sock.getsockname())
        await until(self._marked.is_set, 5, 0.01, "the reader to read the marker")

    def __enter__(self) -> Arrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def times(self) -> list[float]:
        return [at for at, _ in self.received]


# The pure part: what goes into a datagram, and where it goes.


@pytest.mark.parametrize(
    ("fields", "datagram"),
    [
        ({"READY": 1}, b"READY=1"),
        ({"READY": 1, "STATUS": "streaming"}, b"READY=1\nSTATUS=streaming"),
        ({"STATUS": "disconnected: timeout\nREADY=1"}, b"STATUS=disconnected: timeout READY=1"),
        ({"STATUS": "café"}, "STATUS=café".encode()),
    ],
)
def test_encode(fields: dict[str, str | int], datagram: bytes) -> None:
    assert encode(fields) == datagram


@pytest.mark.parametrize(
    ("notify_socket", "address"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@/org/freedesktop/systemd1/notify/123", "\0/org/freedesktop/systemd1/notify/123"),
        ("@", None),
        ("relative/notify", None),
        ("vsock:2:1234", None),
    ],
)
def test_socket_address(notify_socket: str, address: str | None) -> None:
    assert socket_address(notify_socket) == address


# Messages on a real socket.


@pytest.mark.parametrize(
    ("call", "datagram"),
    [
        (Notifier.ready, b"READY=1"),
        (Notifier.watchdog, b"WATCHDOG=1"),
        (Notifier.stopping, b"STOPPING=1"),
        (
            lambda n: n.status("streaming from http://127.0.0.1:4096"),
            b"STATUS=streaming from http://127.0.0.1:4096",
        ),
        (lambda n: n.send(READY=1, STATUS="streaming"), b"READY=1\nSTATUS=streaming"),
    ],
    ids=["ready", "watchdog", "stopping", "status", "send"],
)
def test_each_call_sends_one_datagram(
    listener: tuple[socket.socket, str], call: Callable[[Notifier], None], datagram: bytes
) -> None:
    sock, name = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})

    call(notifier)

    assert sock.recv(4096) == datagram
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)  # exactly one datagram per call
    assert notifier.failures == 0


def test_abstract_socket(abstract_listener: tuple[socket.socket, str]) -> None:
    sock, name = abstract_listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})

    notifier.ready()
    notifier.status("streaming")

    assert [sock.recv(4096), sock.recv(4096)] == [b"READY=1", b"STATUS=streaming"]


def test_reads_os_environ_by_default(
    listener: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, name = listener
    monkeypatch.setenv("NOTIFY_SOCKET", name)

    Notifier.from_environ().ready()

    assert sock.recv(4096) == b"READY=1"


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)

    def no_socket(*args: object) -> None:
        raise AssertionError("a no-op notifier opened a socket")

    monkeypatch.setattr(notify.socket, "socket", no_socket)
    notifier = Notifier.from_environ()

    notifier.ready()
    notifier.status("streaming")
    notifier.watchdog()
    notifier.stopping()

    assert notifier.address is None
    assert notifier.failures == 0


def test_vanished_socket_is_counted_not_raised(listener: tuple[socket.socket, str]) -> None:
    sock, name = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})
    sock.close()
    os.unlink(name)

    notifier.ready()
    notifier.watchdog()

    assert notifier.failures == 2


def test_unbound_abstract_socket_is_counted_not_raised() -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": f"@nobody-listens-{uuid.uuid4().hex}"})

    notifier.stopping()

    assert notifier.failures == 1


def test_full_queue_drops_messages_instead_of_blocking(listener: tuple[socket.socket, str]) -> None:
    # Nobody reads the listener, so its queue fills after a few datagrams; a blocking
    # send would then hang the event loop until systemd caught up.
    _, name = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})
    sender = threading.Thread(
        target=lambda: [notifier.watchdog() for _ in range(5_000)], daemon=True
    )

    sender.start()
    sender.join(timeout=10)

    assert not sender.is_alive(), "send blocked on a full queue"
    assert notifier.failures > 0


# The watchdog.


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "200000"}, 0.1),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "not-a-pid"}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_USEC": "-200000"}, None),
        ({"WATCHDOG_USEC": "20s"}, None),
        ({"WATCHDOG_USEC": "²"}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ) == interval


async def test_pings_arrive_at_half_the_watchdog_period(
    listener: tuple[socket.socket, str],
) -> None:
    sock, name = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})
    interval = watchdog_interval({"WATCHDOG_USEC": "200000"})
    assert interval == 0.1

    with Arrivals(sock) as arrivals:
        task = asyncio.create_task(watchdog_pings(notifier, interval))
        await asyncio.sleep(0.55)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await arrivals.read_all()  # the last ping too

    times = arrivals.times()
    # Pings at 0, 0.1, ... 0.5 s; a loaded CI machine may lose or bunch one.
    assert 4 <= len(times) <= 7, times
    assert {data for _, data in arrivals.received} == {b"WATCHDOG=1"}
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(0.05 <= gap <= 0.3 for gap in gaps), gaps


async def test_blocked_event_loop_stops_the_pings(listener: tuple[socket.socket, str]) -> None:
    # The point of pinging from the loop: when the loop hangs, systemd must notice.
    sock, name = listener
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": name})

    with Arrivals(sock) as arrivals:
        task = asyncio.create_task(watchdog_pings(notifier, 0.05))
        await until(lambda: arrivals.received, 5, 0.01, "a ping before the block")
        blocked_from = time.monotonic()
        time.sleep(0.5)  # blocking the loop is what is under test
        blocked_until = time.monotonic()
        # The positive sign that every ping of the block, had there been one, was read: a
        # ping read after it (the socket hands them over in order).
        await until(lambda: arrivals.times()[-1] >= blocked_until, 5, 0.01, "a later ping")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    times = arrivals.times()
    # Allow for a ping sent just before the block that the reader stamped a moment later.
    during = [at for at in times if blocked_from + 0.05 < at < blocked_until]
    assert during == [], f"{len(during)} pings while the loop was blocked"
    assert any(at < blocked_from for at in times), "no pings before the block"
    assert any(at >= blocked_until for at in times), "pings did not resume after the block"
