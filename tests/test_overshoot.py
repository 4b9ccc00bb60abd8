"""The overshoot count used by the real-server tests and the benchmark table."""

import pytest

from tests.overshoot import overshoot


def msg(role, *parts):
    return {"info": {"role": role}, "parts": [{"type": "tool", "id": p} for p in parts]}


def test_counts_tool_calls_after_the_part_within_its_run():
    messages = [
        msg("user"),
        msg("assistant", "a", "b"),
        msg("assistant", "c", "d"),
        msg("user"),
        msg("assistant", "e"),
    ]
    assert overshoot(messages, ["b"]) == 2  # c and d; e belongs to the next run
    assert overshoot(messages, ["d"]) == 0
    assert overshoot(messages, ["b", "e"]) == 2


def test_unknown_part_is_an_error():
    with pytest.raises(AssertionError):
        overshoot([msg("user")], ["zzz"])
