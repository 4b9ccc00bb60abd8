"""Repeated steps, narration aside: the same text *and* the same result, step after step.

`StepRepeats` (rules/text.py) counts steps whose whole text equals the previous one. Narration
trips it: a model that writes "Let me look at the next file." before each of fifteen different
reads repeats its text, not its work. Here a step is its text together with what its call got
back (the call's outcome digest; none for a step that ran no call), and only steps equal in
both count: the same words before reads of different files differ by their outcomes; the same
words before calls that all fail the same way, or the same text-only answer over and over, do
not.

Inputs, in order: `text(digest)` at the final update of each text part (`text_digest` of
rules/text.py; reasoning parts are a separate instance), `call(facts)` when the call of that
step finishes (`CallFacts.outcome`, monitor/core/rules/facts.py), `end()` when the run ends
(`session.idle`). No server progress signal is read. Memory: three ints; cost per step: one
comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor.core.rules.facts import CallFacts


@dataclass(frozen=True, slots=True)
class TextStepsFinding:
    """`steps` steps in a row wrote the same text and got back the same result."""

    steps: int


class EchoedSteps:
    """One session's run of one text kind; feed its texts and calls in order."""

    __slots__ = ("steps", "_pending", "_last", "count")

    def __init__(self, steps: int = 8) -> None:
        self.steps = steps
        self._pending: int | None = None  # the text of the step under way
        self._last: tuple[int, int | None] | None = None
        self.count = 0

    def text(self, digest: int | None) -> TextStepsFinding | None:
        """A text part ended; a step that wrote text but ran no call ends here."""
        found = None if self._pending is None else self._close(self._pending, None)
        self._pending = digest
        if digest is None:
            self._last, self.count = None, 0
        return found

    def call(self, facts: CallFacts) -> TextStepsFinding | None:
        """The step's call finished; a call with no text before it ends the run of repeats."""
        if self._pending is None:
            self._last, self.count = None, 0
            return None
        return self._close(self._pending, facts.outcome)

    def end(self) -> TextStepsFinding | None:
        """The run ended: a last text-only step counts."""
        found = None if self._pending is None else self._close(self._pending, None)
        self._last, self.count = None, 0
        return found

    def _close(self, text: int, outcome: int | None) -> TextStepsFinding | None:
        step = (text, outcome)
        self._pending = None
        self.count = self.count + 1 if step == self._last else 1
        self._last = step
        if self.count < self.steps:
            return None
        self.count, self._last = 0, None
        return TextStepsFinding(self.steps)
