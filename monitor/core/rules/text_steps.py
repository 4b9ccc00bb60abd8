"""Rule `text_steps`: the same whole text at successive steps, and nothing new between them.

A model that writes the same answer (or reasoning) at step after step is stuck; but a model
that writes "Let me look at the next file." before each of fifteen different reads repeats
its words, not its work (measured on the real corpus's model text: narration is common in
resolved runs). So a repeated text counts only while the calls between the texts keep
getting back the same thing: a call whose outcome differs from the previous call's starts
the count again, from the text before it. The same text before calls that all fail the same
way (every failure counts as the same outcome: whatever each error says, the model learns
nothing new from it), or the same text with no call between (a text-only step), keeps
counting; `steps` in a row are a loop, found at the text that completes them.

Signals read: each finished text or reasoning part's whole text (`text_digest`, white space
aside; a part with no letter or digit is no step), and each finished call's `Call.outcome`
and whether it failed (`failure.failed`).
No server progress signal. Memory: three ints per kind of text; cost per part: one hash of
its text, per call one comparison per kind.
"""

from __future__ import annotations

from monitor.core.events import TextPart
from monitor.core.findings import Finding, TextSteps
from monitor.core.rules.failure import failed
from monitor.core.rules.text import text_digest
from monitor.core.session import Call, SessionRecord

__all__ = ["StepsRule"]

NAME = "text_steps"
# Every failure is the same outcome here: a model that writes the same words before call
# after call that fails learns nothing new from them, whatever each error says.
FAILED = 0


class Steps:
    """One kind's repeats: the last text, the last call's outcome, and how many in a row."""

    __slots__ = ("text", "outcome", "count")

    def __init__(self) -> None:
        self.text: int | None = None
        self.outcome: int | None = None
        self.count = 0


class StepsRule:
    """Rule `text_steps`, both a text and a call rule: texts count, new outcomes reset."""

    reads_recorded = False
    reads_finished = True  # outcomes only
    reads_running = False

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def text(self, session: SessionRecord, part: TextPart) -> Finding | None:
        digest = text_digest(part.text)
        if digest is None:
            return None
        kinds: dict[str, Steps] = session.state(NAME, dict)
        steps = kinds.get(part.kind)
        if steps is None:
            steps = kinds[part.kind] = Steps()
        steps.count = steps.count + 1 if digest == steps.text else 1
        steps.text = digest
        return None if steps.count < self.steps else TextSteps(part.kind, steps.count)

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> Finding | None:
        if not finished or call.outcome is None:
            return None
        kinds: dict[str, Steps] | None = session.peek(NAME)
        if not kinds:
            return None
        outcome = FAILED if failed(call) else call.outcome
        for steps in kinds.values():
            if outcome != steps.outcome:
                if steps.outcome is not None and steps.count:
                    steps.count = 1  # the text before this call starts the count again
                steps.outcome = outcome
        return None
