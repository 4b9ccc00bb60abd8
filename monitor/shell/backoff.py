"""Waiting between attempts: capped exponential backoff with full jitter.

Jitter keeps many monitors (one per server, restarted together) from reconnecting in step.
The random source is passed in, so tests get exact delays.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0

    def delay(
        self, attempt: int, uniform: Callable[[float, float], float] = random.uniform
    ) -> float:
        """Seconds to wait before retry number `attempt` (0 for the first retry)."""
        ceiling = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        # Never below half the ceiling: full jitter can draw ~0 and retry in a tight loop.
        return uniform(ceiling / 2, ceiling)
