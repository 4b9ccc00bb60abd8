"""Record the text-loop traces of the corpus from the real server:
`python -m tests.corpus.record_text` (`TRACE=name` for one).

Each trace is one session of a real, isolated `opencode serve` whose scripted model
(monitor/kit/scripted_model.py) streams text or reasoning in small chunks; its `/event` stream
is written as the server sent it, after a first comment line with its label: `: expect legit`,
or `: expect loop at N`, N being the position a detection must report (`call_index`): for a
loop inside one part, the delta of that part on which the 5th back-to-back repetition
completes (worked out from the script here, not by running the detector); for the same text
at successive steps, the tool calls recorded when the 8th step's text ends: the 8th, since
the server sends a step's tool call `running` before its text part's final update. Files are named
`*.text-loop.sse` and `*.text-legit.sse`. The texts are also what the real-server tests
stream (tests/test_real_text.py).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from monitor.kit.scripted_model import script
from tests.corpus.record import record_all

CHUNK = 12  # characters per delta in the traces
REPEATS = 5  # the default `text_repeats`
STEPS = 8  # the default `text_steps`

PARAGRAPH = (
    "I have checked the configuration and it looks correct. The tests still fail with the "
    "same error. Maybe the problem is in the parser after all. Let me look at it once more."
    "\n\n"
)
ONE_LINE = "I will now read the configuration file again to be completely sure. "
REASONING = "Wait, maybe the bug is in the tokenizer. Let me re-check how it splits words. "

_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def different_lines(count: int = 120) -> str:
    """A long answer whose lines all differ (in words, not only in numbers)."""
    lines = []
    for n in range(count):
        a, b, c = (_WORDS[(n * k + k) % len(_WORDS)] for k in (1, 3, 7))
        lines.append(f"- The {a} module calls {b} before {c}, step {n}.")
    return "Here is what each module does:\n\n" + "\n".join(lines) + "\n"


def code_block(lines: int = 80) -> str:
    """A code block of many similar and many identical lines."""
    body = "".join(f"    assert check(items[{n}])\n    assert ready()\n" for n in range(lines // 2))
    return "The test checks every item:\n\n```python\ndef test_items():\n" + body + "```\n\nDone.\n"


def table(rows: int = 60) -> str:
    """A markdown table whose rows are mostly identical."""
    out = "| setting | default | changed |\n|---|---|---|\n"
    out += "".join("| `enabled` | yes | no |\n" for _ in range(rows))
    return "The settings:\n\n" + out + "\nAll of them keep their defaults.\n"


def numbered_list(items: int = 100) -> str:
    """A numbered list of 100 items that differ only in their numbers."""
    return "".join(f"{n}. Read section {n} of the manual.\n" for n in range(1, items + 1))


def chunk_of(text_before: str, repeated: str, repeats: int = REPEATS) -> int:
    """The delta on which `repeats` back-to-back copies of `repeated` (after `text_before`)
    are complete: the last sentence ends at the white space that follows it."""
    trailing = len(repeated) - len(repeated.rstrip())
    chars = len(text_before) + repeats * len(repeated) - trailing + 1
    return math.ceil(chars / CHUNK)


def _distinct_reads(count: int) -> list[tuple[str, dict[str, Any]]]:
    return [("read", {"filePath": f"notes-{n}.md"}) for n in range(count)]


def _text(answer: str, **extra: Any) -> str:
    return script(_distinct_reads(1), 0, answer=answer, chunk=CHUNK, **extra)


# name -> (label, prompt)
TRACES: dict[str, tuple[str, str]] = {
    "paragraph-repeated.text-loop": (
        f"loop at {chunk_of('', PARAGRAPH)}",
        _text(PARAGRAPH, repeat=25),
    ),
    "one-line-repeated.text-loop": (
        f"loop at {chunk_of('', ONE_LINE)}",
        _text(ONE_LINE, repeat=40),
    ),
    "reasoning-repeated.text-loop": (
        f"loop at {chunk_of('', REASONING)}",
        _text("Found it.", reasoning=REASONING, reasoning_repeat=30),
    ),
    "same-text-every-step.text-loop": (
        f"loop at {STEPS}",
        script(
            _distinct_reads(10),
            10,
            say="I am not sure what to do next, so I will look around a bit more.",
            chunk=CHUNK,
        ),
    ),
    "different-lines.text-legit": ("legit", _text(different_lines())),
    "code-block.text-legit": ("legit", _text(code_block())),
    "table.text-legit": ("legit", _text(table())),
    "numbered-list.text-legit": ("legit", _text(numbered_list())),
    "narrated-steps.text-legit": (
        "legit",
        script(_distinct_reads(6), 6, say="Let me read the next file.", chunk=CHUNK),
    ),
}


if __name__ == "__main__":
    asyncio.run(record_all(TRACES))
