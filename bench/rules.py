"""Per-call cost and per-session memory of the progress rules, beside `cycle`'s in the same run.

Each rule sees the same stream of calls: a non-repeating mix of edits, checks and reads
(none fires, so every call pays the rule's full cost). `cycle` is timed as the tracker runs
it: `detect_cycle` over a deque of the last 32 call digests at the default max period 10.
Memory: `tracemalloc` over 1,000 sessions' rule state after 200 calls each, per session, at
the worst case: 200 different checks and reads with no change, which fill `no_progress`'s 32
checks and `revisit`'s 64 remembered calls.

    python -m bench.rules [--calls N]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections import deque
from collections.abc import Callable

from monitor.core.rules.cycle import detect_cycle
from monitor.core.rules.facts import CallFacts, outcome_digest
from monitor.core.rules.no_progress import NoProgress
from monitor.core.rules.revisit import Revisit
from monitor.core.rules.text_steps import EchoedSteps

HISTORY = 32
SESSIONS = 1000


def calls(n: int) -> list[CallFacts]:
    """Edits, checks whose output changes, reads of ever new files: progress throughout."""
    made = []
    for i in range(n):
        kind = i % 3
        out = outcome_digest("completed", f"result {i}", None, {"exit": kind})
        made.append(CallFacts(("edit", "bash", "read")[kind], hash(("call", i)), out, kind == 0))
    return made


def per_call(feed: Callable[[CallFacts], object], stream: list[CallFacts]) -> float:
    start = time.perf_counter_ns()
    for facts in stream:
        feed(facts)
    return (time.perf_counter_ns() - start) / len(stream)


def cycle_feed() -> Callable[[CallFacts], object]:
    history: deque[int] = deque(maxlen=HISTORY)

    def feed(facts: CallFacts) -> object:
        history.append(facts.digest)
        return detect_cycle(history, max_period=10)

    return feed


def echo_feed() -> Callable[[CallFacts], object]:
    echoes = EchoedSteps()

    def feed(facts: CallFacts) -> object:
        echoes.text(facts.outcome)
        return echoes.call(facts)

    return feed


def memory(make: Callable[[], Callable[[CallFacts], object]], stream: list[CallFacts]) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = []
    for _ in range(SESSIONS):
        feed = make()
        for facts in stream:
            feed(facts)
        kept.append(feed)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / SESSIONS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rules", description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args(argv)
    stream = calls(args.calls)
    short = [CallFacts("read", hash(("read", i)), hash(("out", i)), False) for i in range(200)]
    rules: dict[str, Callable[[], Callable[[CallFacts], object]]] = {
        "cycle": cycle_feed,
        "no_progress": lambda: NoProgress().see,
        "revisit": lambda: Revisit().see,
        "text_steps_echo": echo_feed,
    }
    floor = per_call(cycle_feed(), stream)
    print(f"{'rule':<16} {'ns/call':>8} {'x cycle':>8} {'bytes/session':>14}")
    for name, make in rules.items():
        cost = floor if name == "cycle" else per_call(make(), stream)
        print(f"{name:<16} {cost:>8.0f} {cost / floor:>8.2f} {memory(make, short):>14.0f}")


if __name__ == "__main__":
    main()
