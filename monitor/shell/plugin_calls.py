"""TEMPORARY: the plugin's calls fed to the tracker as the stream would carry them.

Until the tracker takes plugin calls itself (issue 17, "One policy"), `judge_by_tracker` turns
a `PluginCall` into the `running` tool part the stream would carry and feeds it; a loop the
tracker finds on it blocks the call. The hook runs before the call reaches the stream, so the
stream's own updates of that call come later under OpenCode's part id: `StreamMatch` renames
them to the id the call was recorded under (by session, call id and order), so the tracker
counts each call once and takes its outcome from the stream. Replace both with a core entry.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from typing import Any

from monitor.core.plugin_protocol import ALLOW, PluginCall, PluginVerdict, block
from monitor.core.tracker import Intervene, Tracker

# Plugin calls whose stream updates have not come yet, and stream parts renamed: bounded, as
# a server whose sessions we do not follow never sends the updates.
_MAX_WAITING_KEYS = 4096
_MAX_RENAMED = 4096


class StreamMatch:
    """Part ids for plugin calls, and the renaming of their stream updates to them."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self._waiting: OrderedDict[tuple[str, str], deque[str]] = OrderedDict()
        self._renamed: OrderedDict[str, str] = OrderedDict()

    def new_part(self, call: PluginCall) -> str:
        part_id = f"plugin-{next(self._numbers)}"
        key = (call.session_id, call.call_id)
        queue = self._waiting.get(key)
        if queue is None:
            queue = self._waiting[key] = deque(maxlen=8)
            if len(self._waiting) > _MAX_WAITING_KEYS:
                self._waiting.popitem(last=False)
        queue.append(part_id)
        return part_id

    def rename(self, frame: Any) -> Any:
        """The frame, with a plugin call's tool part under the id it was recorded with."""
        if not self._waiting and not self._renamed:
            return frame
        event = frame.get("payload", frame) if isinstance(frame, dict) else None
        if not isinstance(event, dict) or event.get("type") != "message.part.updated":
            return frame
        properties = event.get("properties")
        part = properties.get("part") if isinstance(properties, dict) else None
        if not isinstance(part, dict) or part.get("type") != "tool":
            return frame
        real = part.get("id")
        if not isinstance(real, str):
            return frame
        recorded = self._renamed.get(real)
        if recorded is None:
            queue = self._waiting.get((str(part.get("sessionID")), str(part.get("callID"))))
            if not queue:
                return frame
            recorded = self._renamed[real] = queue.popleft()
            if len(self._renamed) > _MAX_RENAMED:
                self._renamed.popitem(last=False)
        part["id"] = recorded
        return frame


def judge_by_tracker(
    tracker: Tracker, match: StreamMatch, call: PluginCall
) -> tuple[PluginVerdict, Intervene | None]:
    """The verdict on one plugin call, and the loop that blocked it."""
    part_id = match.new_part(call)
    frame = {
        "directory": call.directory,
        "payload": {
            "type": "message.part.updated",
            "properties": {
                "part": {
                    "id": part_id,
                    "type": "tool",
                    "sessionID": call.session_id,
                    "callID": call.call_id,
                    "tool": call.tool,
                    "state": {"status": "running", "input": dict(call.args)},
                }
            },
        },
    }
    for decision in tracker.feed(frame).decisions:
        if decision.part_id == part_id:
            return block(decision.feedback), decision
    return ALLOW, None
