"""How many calls a session's history must hold for the rules to see what they count.

The one place the history's invariants are stated: `Detection` derives its history from
here when none is given and checks a given one here, and the config layer only says where
each value came from.
"""

from __future__ import annotations

from collections.abc import Callable

from monitor.errors import ConfigError

__all__ = [
    "DetectionError",
    "HISTORY_FLOOR",
    "MAX_PERIOD",
    "check_history",
    "check_tree",
    "derived_history",
]

# The history the defaults were measured with (docs/detection.md): a derived history is never
# shorter, so settings that fit in it see exactly what the measurements saw.
HISTORY_FLOOR = 32
# The longest cycle a setting may ask for: a session keeps the tool names of that many calls
# (a finding names its cycle's), not of its whole history.
MAX_PERIOD = 10
# The single-call rule acts on a call's 4th occurrence, whatever `repeats` says.
SINGLE_CALL_REPEATS = 4


class DetectionError(ConfigError, ValueError):
    """Detection settings that do not fit each other (a `ConfigError` wherever it is raised).

    `field` is the setting to change, `minimum` the least value that fits, `needs` the
    settings that set that minimum (each with its value), and `why` what the minimum is for.
    """

    def __init__(
        self, field: str, value: int, minimum: int, needs: tuple[tuple[str, int], ...], why: str
    ) -> None:
        self.field = field
        self.value = value
        self.minimum = minimum
        self.needs = needs
        self.why = why
        super().__init__(f"{field} must be at least {minimum}{self.formula()} {why}, not {value}")

    def formula(self, show: Callable[[str, int], str] = "{} {}".format) -> str:
        """How the minimum is made, e.g. " = max_period 10 * repeats 4"; `show` shows each
        setting and its value."""
        if not self.needs:
            return ""
        return " = " + " * ".join(show(name, need) for name, need in self.needs)


def history_needs(
    max_period: int, repeats: int, wait_calls: int
) -> list[tuple[int, tuple[tuple[str, int], ...], str]]:
    """Each lower bound on the history: (minimum, the settings that set it, what it is for)."""
    return [
        (
            max_period * repeats,
            (("max_period", max_period), ("repeats", repeats)),
            "so the longest loop fits",
        ),
        (wait_calls, (("wait_calls", wait_calls),), "so a waiting loop can be counted"),
        (SINGLE_CALL_REPEATS, (), "so a single call can be seen 4 times"),
    ]


def derived_history(max_period: int, repeats: int, wait_calls: int) -> int:
    """The history to use when none is set: what the rules need, at least `HISTORY_FLOOR`."""
    needs = history_needs(max_period, repeats, wait_calls)
    return max(HISTORY_FLOOR, *(minimum for minimum, _, _ in needs))


def check_history(history: int, max_period: int, repeats: int, wait_calls: int) -> None:
    """Raise DetectionError for the first need `history` does not meet."""
    for minimum, needs, why in history_needs(max_period, repeats, wait_calls):
        if history < minimum:
            raise DetectionError("history", history, minimum, needs, why)


def check_tree(depth: int, fanout: int) -> None:
    """Raise DetectionError for a limit of the `tree` rule below 0 (0 turns it off)."""
    for field, value in (("tree_depth", depth), ("tree_fanout", fanout)):
        if value < 0:
            raise DetectionError(field, value, 0, (), "(0: off)")
