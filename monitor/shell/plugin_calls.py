"""TEMPORARY: the plugin's calls fed to the tracker as the stream would carry them.

Until the tracker takes plugin calls itself (issue 17, "One policy"), `judge_by_tracker` turns
a `PluginCall` into the `running` tool part the stream would carry and feeds it; a loop the
tracker finds on it blocks the call. The stream carries the same call under OpenCode's part id,
before or after the plugin asks (the hook and the stream race), so `StreamMatch` makes the
tracker see each call once, under the plugin's id, with its outcome from the stream:
- an update of a call the plugin asked about is renamed to the plugin's id (matched by
  session, call id and order: call ids repeat across steps);
- in a directory whose plugin asks, a call's first updates are held back until the plugin
  asks about it (then renamed) or the call ends unasked (the plugin fell open: then fed as
  they came);
- a call the stream recorded before any plugin of its directory asked is not judged again.
Replace both with a core entry.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from typing import Any

from monitor.core.plugin_protocol import ALLOW, PluginCall, PluginVerdict, block
from monitor.core.tracker import Intervene, Tracker

# Every map here is bounded: a server whose calls never finish must not grow them.
_MAX_KEYS = 4096
_PER_KEY = 8

Key = tuple[str, str]


def _bounded_put(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    if len(table) > _MAX_KEYS:
        table.popitem(last=False)


def _tool_part(frame: Any) -> dict[str, Any] | None:
    event = frame.get("payload", frame) if isinstance(frame, dict) else None
    if not isinstance(event, dict) or event.get("type") != "message.part.updated":
        return None
    properties = event.get("properties")
    part = properties.get("part") if isinstance(properties, dict) else None
    if (
        not isinstance(part, dict)
        or part.get("type") != "tool"
        or not isinstance(part.get("id"), str)
    ):
        return None
    return part


class StreamMatch:
    """Part ids for plugin calls, and the matching of the stream's updates to them."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        # Plugin calls whose stream updates have not come yet, in order.
        self._waiting: OrderedDict[Key, deque[str]] = OrderedDict()
        # OpenCode's part id -> the plugin's.
        self._renamed: OrderedDict[str, str] = OrderedDict()
        # Updates held back, by OpenCode's part id: (key, frames).
        self._held: OrderedDict[str, tuple[Key, list[Any]]] = OrderedDict()
        # Calls the stream recorded before the plugin asked, by key.
        self._recorded: OrderedDict[Key, deque[str]] = OrderedDict()
        self._asking: OrderedDict[str, None] = OrderedDict()  # directories whose plugin asks

    def new_part(self, call: PluginCall) -> tuple[str | None, list[Any]]:
        """The id to record the call under (None: the stream recorded it already), and the
        updates held back for it, renamed, to feed after it."""
        _bounded_put(self._asking, call.directory, None)
        key = (call.session_id, call.call_id)
        recorded = self._recorded.get(key)
        if recorded:
            recorded.popleft()
            return None, []
        part_id = f"plugin-{next(self._numbers)}"
        for real, (held_key, frames) in list(self._held.items()):
            if held_key == key:
                del self._held[real]
                _bounded_put(self._renamed, real, part_id)
                for frame in frames:
                    _tool_part(frame)["id"] = part_id  # type: ignore[index]
                return part_id, frames
        queue = self._waiting.get(key)
        if queue is None:
            queue = deque(maxlen=_PER_KEY)
            _bounded_put(self._waiting, key, queue)
        queue.append(part_id)
        return part_id, []

    def rename(self, frame: Any, directory: str | None) -> list[Any]:
        """The frames to feed now for this one: itself renamed, none (held back), or the
        updates held back for its call with it."""
        part = _tool_part(frame)
        if part is None:
            return [frame]
        real: str = part["id"]
        recorded = self._renamed.get(real)
        if recorded is not None:
            part["id"] = recorded
            return [frame]
        key = (str(part.get("sessionID")), str(part.get("callID")))
        queue = self._waiting.get(key)
        if queue:
            part["id"] = queue.popleft()
            _bounded_put(self._renamed, real, part["id"])
            return [frame]
        finished = isinstance(part.get("state"), dict) and part["state"].get("status") in (
            "completed",
            "error",
        )
        held = self._held.get(real)
        if held is not None:
            if not finished:
                held[1].append(frame)
                return []
            del self._held[real]
            return [*held[1], frame]  # the plugin never asked: it fell open
        if not finished and directory is not None and directory in self._asking:
            _bounded_put(self._held, real, (key, [frame]))
            return []
        if directory is None or directory not in self._asking:
            queue = self._recorded.get(key)
            if queue is None:
                queue = deque(maxlen=_PER_KEY)
                _bounded_put(self._recorded, key, queue)
            if real not in queue:
                queue.append(real)
        return [frame]


def judge_by_tracker(
    tracker: Tracker, match: StreamMatch, call: PluginCall
) -> tuple[PluginVerdict, Intervene | None, list[Any]]:
    """The verdict on one plugin call, the loop that blocked it, and the stream's updates of
    the call held back until now (the shell feeds them next)."""
    part_id, released = match.new_part(call)
    if part_id is None:
        return ALLOW, None, []
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
            return block(decision.feedback), decision, released
    return ALLOW, None, released
