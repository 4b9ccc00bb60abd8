import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.rules.cycle import Cycle, detect_cycle, window_size


def first_detection(calls, **kw):
    """1-based index of the call at which a cycle is first detected, and the cycle."""
    for index in range(1, len(calls) + 1):
        cycle = detect_cycle(calls[:index], **kw)
        if cycle is not None:
            return index, cycle
    return None


@pytest.mark.parametrize(
    "calls, expected",
    [
        ("AAAAAAAA", (4, Cycle(1, 4))),
        ("ABABABAB", (6, Cycle(2, 3))),
        ("ABCABCABCABC", (9, Cycle(3, 3))),
        ("ABCDABCDABCDABCD", (12, Cycle(4, 3))),
        ("ABCABCAB", None),
        ("AAA", None),
        ("ABABA", None),
        ("ABCDEABCDEABCDE", None),  # period 5 is beyond max_period=4
        ("XYZAAAA", (7, Cycle(1, 4))),
        ("ABAB" + "CDCDCD", (10, Cycle(2, 3))),
    ],
)
def test_seed_cases(calls, expected):
    assert first_detection(list(calls)) == expected


def test_shortest_period_wins():
    assert detect_cycle(list("ABABABABABAB")) == Cycle(2, 6)


def test_repetitions_counted_within_the_window():
    assert detect_cycle(["A"] * 100) == Cycle(1, window_size(4, 3))
    assert window_size(4, 3) == 16
    assert detect_cycle(list("AB") * 50) == Cycle(2, 8)


def test_max_period_ten():
    block = list("ABCDEFGHIJ")
    assert first_detection(block * 3, max_period=10) == (30, Cycle(10, 3))
    assert detect_cycle(block * 3, max_period=9) is None


def test_repeats_and_min_calls_are_settings():
    assert first_detection(list("ABABABAB"), repeats=4) == (8, Cycle(2, 4))
    assert first_detection(list("AAAAAA"), min_calls=6) == (6, Cycle(1, 6))
    assert first_detection(list("AAAAAA"), repeats=2, min_calls=2) == (2, Cycle(1, 2))


class CountingList(list):
    def __init__(self, *args):
        super().__init__(*args)
        self.reads = set()

    def __getitem__(self, index):
        self.reads.add(index % len(self))
        return super().__getitem__(index)


def test_cost_does_not_grow_with_history():
    history = CountingList(["A"] * 10_000)
    detect_cycle(history, max_period=4, repeats=3)
    assert min(history.reads) >= 10_000 - window_size(4, 3)


def oracle(history, max_period, repeats, min_calls):
    """Brute force: rebuild each candidate tail by repeating its last block and compare."""
    window = max(max_period * repeats, 16)
    for length in range(1, max_period + 1):
        needed = max(length * repeats, min_calls)
        if needed > min(len(history), window):
            continue
        tail = history[-needed:]
        block = tail[-length:]
        rebuilt = (block * (needed // length + 1))[-needed:]
        if tail == rebuilt:
            best = 0
            for size in range(needed, min(len(history), window) + 1):
                candidate = history[-size:]
                if candidate == (block * (size // length + 1))[-size:]:
                    best = size
            return Cycle(length, best // length)
    return None


@settings(max_examples=600)
@given(
    st.lists(st.sampled_from("ABC"), max_size=40),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=2, max_value=4),
    st.integers(min_value=1, max_value=6),
)
def test_agrees_with_brute_force_oracle(history, max_period, repeats, min_calls):
    assert detect_cycle(history, max_period, repeats, min_calls) == oracle(
        history, max_period, repeats, min_calls
    )


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from("AB"), min_size=1, max_size=6),
    st.integers(min_value=3, max_value=6),
    st.integers(min_value=1, max_value=10),
)
def test_agrees_with_oracle_on_periodic_histories(block, copies, max_period):
    history = block * copies
    assert detect_cycle(history, max_period) == oracle(history, max_period, 3, 4)
