"""The history's invariants, stated once in the core: derived when unset, checked when set."""

import pytest

from monitor.core.limits import DetectionError
from monitor.core.tracker import SEED, Detection


@pytest.mark.parametrize(
    ("fields", "history"),
    [
        ({}, 32),
        ({"repeats": 4}, 40),
        ({"max_period": 10, "repeats": 5}, 50),
        ({"wait_calls": 45}, 45),
        ({"history": 12, "max_period": 4, "wait_calls": 12}, 12),  # given: kept as it is
    ],
)
def test_history_is_derived_unless_given(fields: dict[str, int], history: int) -> None:
    assert Detection(**fields).history == history


def test_seed_keeps_the_history_it_was_measured_with() -> None:
    assert SEED.history == 32


@pytest.mark.parametrize(
    ("fields", "message", "needs"),
    [
        (
            {"history": 8, "repeats": 4},
            "history must be at least 40 = max_period 10 * repeats 4 so the longest loop "
            "fits, not 8",
            (("max_period", 10), ("repeats", 4)),
        ),
        (
            {"history": 30, "wait_calls": 31},
            "history must be at least 31 = wait_calls 31 so a waiting loop can be counted, not 30",
            (("wait_calls", 31),),
        ),
        (
            {"history": 3, "max_period": 1, "wait_calls": 0},
            "history must be at least 4 so a single call can be seen 4 times, not 3",
            (),
        ),
    ],
)
def test_a_history_that_cannot_hold_the_rules_is_refused(
    fields: dict[str, int], message: str, needs: tuple[tuple[str, int], ...]
) -> None:
    with pytest.raises(DetectionError) as caught:
        Detection(**fields)
    assert str(caught.value) == message
    assert (caught.value.field, caught.value.needs) == ("history", needs)
    assert isinstance(caught.value, ValueError)
