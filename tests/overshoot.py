"""Overshoot: tool calls that started after the call that completed a cycle."""

from __future__ import annotations


def overshoot(messages: list[dict], part_ids: list[str]) -> int:
    """Tool calls that started after each cycle-completing part, within the same run."""
    total = 0
    for part_id in part_ids:
        counting = False
        for message in messages:
            if message["info"]["role"] == "user" and counting:
                break
            for part in message["parts"]:
                if counting and part.get("type") == "tool":
                    total += 1
                counting = counting or part.get("id") == part_id
        assert counting, f"part {part_id} is not in the session"
    return total
