import sys

import pytest

from monitor.core.limits import MAX_PERIOD
from monitor.core.rules.cycle import Cycle, CycleRule
from monitor.core.session import Call, RecentMap, SessionRecord, call_digest
from monitor.core.tracker import Detection


class LoopGuard:
    """Sessions' histories in one bounded table, fed to the cycle rule, as the tracker does."""

    def __init__(self, max_history=32, max_sessions=10_000, max_period=4, repeats=3):
        self.rule = CycleRule(max_period, repeats, max_history, wait_calls=0)
        self._sessions = RecentMap(max_sessions)

    def record(self, session_id, tool, args):
        session = self._sessions.touch(session_id, SessionRecord)
        call = Call("p", tool, call_digest(tool, args), args)
        session.record(call.digest, tool, self.rule.history)
        finding = self.rule.call(session, call, recorded=True, finished=False)
        return None if finding is None else Cycle(*finding.shape()[:2])

    def tools(self, session_id, count):
        return self._sessions.get(session_id).last_tools(count)

    def history_length(self, session_id):
        return self._sessions.get(session_id).history_length()

    def clear(self, session_id):
        self._sessions.pop(session_id)

    def __contains__(self, session_id):
        return session_id in self._sessions

    def __len__(self):
        return len(self._sessions)


def calls_until_detection(guard, session, calls):
    for index, (tool, args) in enumerate(calls, start=1):
        cycle = guard.record(session, tool, args)
        if cycle is not None:
            return index, cycle
    return None


READ = ("read", {"filePath": "a.py"})
EDIT = ("edit", {"filePath": "b.py", "oldString": "x", "newString": "y"})
BASH = ("bash", {"command": "pytest"})
GLOB = ("glob", {"pattern": "*.py"})


def test_one_tool_allowed_three_times_blocked_on_the_fourth():
    guard = LoopGuard()
    assert [guard.record("s", *READ) for _ in range(3)] == [None, None, None]
    assert guard.record("s", *READ) == Cycle(1, 4)


@pytest.mark.parametrize(
    "pattern, fires_at",
    [([READ, EDIT], 6), ([READ, EDIT, BASH], 9), ([READ, EDIT, BASH, GLOB], 12)],
)
def test_multi_call_cycles_fire_after_three_full_repetitions(pattern, fires_at):
    guard = LoopGuard()
    assert calls_until_detection(guard, "s", pattern * 4) == (
        fires_at,
        Cycle(len(pattern), 3),
    )
    assert guard.tools("s", len(pattern)) == tuple(tool for tool, _ in pattern)


def test_changing_any_argument_prevents_detection():
    guard = LoopGuard()
    calls = [("read", {"filePath": "a.py", "offset": n}) for n in range(20)]
    assert calls_until_detection(guard, "s", calls) is None


def test_key_order_does_not_matter():
    guard = LoopGuard()
    one = {"filePath": "b.py", "oldString": "x", "newString": "y"}
    two = {"newString": "y", "oldString": "x", "filePath": "b.py"}
    calls = [("edit", one), ("edit", two), ("edit", one), ("edit", two)]
    assert calls_until_detection(guard, "s", calls) == (4, Cycle(1, 4))


def test_sessions_do_not_share_history():
    guard = LoopGuard()
    for _ in range(3):
        assert guard.record("s1", *READ) is None
        assert guard.record("s2", *READ) is None
    assert guard.record("s1", *READ) == Cycle(1, 4)
    assert guard.history_length("s2") == 3


def test_history_bounded_to_its_maximum():
    guard = LoopGuard(max_history=12)
    for n in range(100):
        guard.record("s", "read", {"n": n})
    assert guard.history_length("s") == 12
    # The tool names, only of the calls a cycle can have: a finding names its cycle's.
    assert guard.tools("s", 50) == ("read",) * MAX_PERIOD


def test_clearing_removes_state():
    guard = LoopGuard()
    for _ in range(3):
        guard.record("s", *READ)
    guard.clear("s")
    assert "s" not in guard and len(guard) == 0
    assert [guard.record("s", *READ) for _ in range(3)] == [None, None, None]
    guard.clear("never-seen")


def test_number_of_sessions_is_bounded_least_recent_dropped_first():
    guard = LoopGuard(max_sessions=2)
    guard.record("a", *READ)
    guard.record("b", *READ)
    guard.record("a", *READ)  # a is now the most recent
    guard.record("c", *READ)
    assert "b" not in guard
    assert guard.history_length("a") == 2 and guard.history_length("c") == 1


def test_history_keeps_digests_not_signatures():
    guard = LoopGuard()
    guard.record("s", "write", {"content": "x" * 100_000})
    history = guard._sessions.get("s")
    assert sys.getsizeof(history.digests) < 200


def test_history_must_hold_a_full_cycle():
    # The one check, made where the settings are (monitor/core/limits.py).
    with pytest.raises(ValueError, match="history"):
        Detection(history=8, max_period=4, repeats=3)


def test_recent_map_rejects_zero_capacity():
    with pytest.raises(ValueError):
        RecentMap(0)
