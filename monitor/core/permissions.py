"""Answering OpenCode's permission requests: refuse the call that completes a loop before it runs.

With `"permission": {"*": "ask"}` the server sends a `permission.asked` request naming the
call by message and call id, shortly before or after the call's `running` update (with its
full input); a `reject` reply with a message stops the call before it runs, and the model reads
the message as the call's result. The tracker decides at `running` that a call completes a
loop; this gate then says how to stop it:

- its request came already: refuse it (`Reply` reject);
- it will ask permission (the session's earlier identical calls asked, and no `always` reply
  has let them through since): wait for its request and refuse it;
- it will not ask (they ran without asking) or nothing is known yet: the `Intervene` goes on
  to the abort, as without the gate. Nothing here waits to see whether a request comes.

OpenCode's own `doom_loop` check (one message holding three identical calls) also asks; such a
request is a loop the server found, refused with our feedback at once (`approve`) or after a
grace period in which a person may answer it first (`gate`). Under `approve` every other
request is approved (`once`), once its call's `running` update has shown it is not a loop's.
Mode `off` answers nothing and leaves every decision as it is.

Pure: events in, decisions out; the shell sends the replies and owns the grace timer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from monitor.core.events import PermissionAsked, PermissionReplied, ToolPart
from monitor.core.feedback import rejection_text
from monitor.core.guard import RecentMap
from monitor.core.signature import canonical_signature, signature_digest

if TYPE_CHECKING:
    from monitor.core.tracker import Intervene

PermissionMode = Literal["off", "gate", "approve"]
DOOM_LOOP = "doom_loop"
# OpenCode asks `doom_loop` when the last calls of one message are this many identical ones.
DOOM_LOOP_CALLS = 3

# Bounds on what one session (and the whole gate) remembers; a model step rarely runs more
# than a few calls at once, and a session makes few distinct calls that ask.
_MAX_CALLS = 64
_MAX_SIGNATURES = 256
_MAX_REQUESTS = 4096

_FINISHED = ("completed", "error")


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer permission request `request_id`.

    `loop` is the loop this answer stops (always with `reject` and `message`, the text the
    model reads as the refused call's result); None for an approval. `wait` is how long to
    leave the request to others first: answer only if it is still pending then.
    """

    request_id: str
    session_id: str
    directory: str | None
    reply: Literal["once", "reject"]
    message: str | None = None
    loop: Intervene | None = None
    wait: float = 0.0


class _Call:
    """A call seen at `running`, until its final update."""

    __slots__ = ("part_id", "tool", "digest", "asked", "request", "loop", "stopped")

    def __init__(self, part_id: str, tool: str, digest: int) -> None:
        self.part_id = part_id
        self.tool = tool
        self.digest = digest
        self.asked = False
        # Its request, while nobody (we included) has been told to answer it.
        self.request: str | None = None
        # The loop this call completes, waiting for the call's permission request.
        self.loop: Intervene | None = None
        # The loop it completes is stopped by an abort: its request must never be approved.
        self.stopped = False


class _Session:
    __slots__ = ("calls", "asks", "early")

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], _Call] = {}
        # Requests that came before their call's `running` update, by call.
        self.early: dict[tuple[str, str], str] = {}
        # Per call signature, what its last call did: the permission it asked, or None
        # when it ran without asking.
        self.asks: dict[int, str | None] = {}


class _Request:
    __slots__ = ("session_id", "permission", "reply")

    def __init__(self, session_id: str, permission: str) -> None:
        self.session_id = session_id
        self.permission = permission
        self.reply: str | None = None


def _bounded_put(table: dict, key: object, value: object, limit: int) -> None:
    table.pop(key, None)
    if len(table) >= limit:
        del table[next(iter(table))]
    table[key] = value


class PermissionGate:
    """Follows the calls and permission requests of every session; see the module doc."""

    def __init__(
        self, mode: PermissionMode = "off", grace: float = 30.0, max_sessions: int = 10_000
    ) -> None:
        self.mode = mode
        self.grace = grace
        self._sessions: RecentMap[str, _Session] = RecentMap(max_sessions)
        self._requests: dict[str, _Request] = {}

    def part(self, part: ToolPart, live: bool) -> Intervene | None:
        """Take every tool part update, before the tracker records it.

        Returns a loop that was waiting for a request that never came (the call finished
        without asking): it must now be stopped as without the gate. `live` is False for
        parts read back, whose past requests we cannot know.
        """
        if self.mode == "off" or part.message_id is None or part.call_id is None:
            return None
        key = (part.message_id, part.call_id)
        session = self._sessions.get(part.session_id)
        call = None if session is None else session.calls.get(key)
        if call is None:
            if part.status != "running":
                return None
            session = self._sessions.touch(part.session_id, _Session)
            digest = signature_digest(canonical_signature(part.tool, part.input))
            call = _Call(part.part_id, part.tool, digest)
            _bounded_put(session.calls, key, call, _MAX_CALLS)
            early = session.early.pop(key, None)
            if early is not None:
                self._ask(session, call, early)
            return None
        if part.status not in _FINISHED:
            return None
        assert session is not None
        del session.calls[key]
        if live and not call.asked:
            # Learned: calls like this one run without asking.
            _bounded_put(session.asks, call.digest, None, _MAX_SIGNATURES)
        return call.loop

    def decide(
        self, part: ToolPart, decision: Intervene | None, directory: str | None
    ) -> Intervene | Reply | None:
        """After the tracker took `part`: `decision` is the loop it completes, if any;
        `directory` the session's project.

        Returns the decision to carry out now (the abort), a `Reply` (the refusal of a request
        that came already, or under `approve` the approval of a call that is no loop), or
        None: nothing, or wait for the call's request (`asked` then returns the refusal).
        """
        if self.mode == "off" or part.status != "running":
            return decision
        session = self._sessions.get(part.session_id)
        call = None
        if session is not None and part.message_id is not None and part.call_id is not None:
            call = session.calls.get((part.message_id, part.call_id))
        if session is None or call is None:
            return decision
        request, call.request = call.request, None
        if decision is None:
            if request is not None and self.mode == "approve":
                return Reply(request, part.session_id, directory, "once")
            return None
        if request is not None:
            return self._refuse(request, decision, 0.0)
        if call.asked or session.asks.get(call.digest) is None:
            # Its request was answered already by someone else, or its like ran without
            # asking (or we never saw one finish): abort as before.
            call.stopped = True
            return decision
        call.loop = decision
        return None

    def asked(
        self,
        event: PermissionAsked,
        directory: str | None,
        doom_loop: Callable[[PermissionAsked, str], Intervene],
    ) -> Reply | None:
        """A permission request: how to answer it, if at all.

        `directory` is the session's project; `doom_loop` makes the decision for a loop the
        server found, given the request and the part id of the last call of that tool.
        A request seen before (read back again after a reconnect) gets no second answer.
        """
        if self.mode == "off" or event.request_id in self._requests:
            return None
        request = _Request(event.session_id, event.permission)
        _bounded_put(self._requests, event.request_id, request, _MAX_REQUESTS)
        session = self._sessions.get(event.session_id)
        if event.permission == DOOM_LOOP:
            decision = doom_loop(event, self._last_part(session, event.tool))
            wait = 0.0 if self.mode == "approve" else self.grace
            return self._refuse(event.request_id, decision, wait)
        if event.message_id is None or event.call_id is None:
            # Not a call's request: nothing to weigh it against.
            if self.mode == "approve":
                return Reply(event.request_id, event.session_id, directory, "once")
            return None
        key = (event.message_id, event.call_id)
        session = self._sessions.touch(event.session_id, _Session)
        call = session.calls.get(key)
        if call is None:
            # Before the call's `running` update: whether it is a loop's is not known yet,
            # so it is answered then (`decide`).
            _bounded_put(session.early, key, event.request_id, _MAX_CALLS)
            return None
        self._ask(session, call, event.request_id)
        if call.loop is not None:
            decision, call.loop, call.request = call.loop, None, None
            return self._refuse(event.request_id, decision, 0.0)
        call.request = None
        if call.stopped or self.mode != "approve":
            return None
        return Reply(event.request_id, event.session_id, directory, "once")

    def _ask(self, session: _Session, call: _Call, request_id: str) -> None:
        """Learn that `call` asked: calls like it will ask too."""
        request = self._requests.get(request_id)
        call.asked = True
        # A request answered before its call's `running` update (by a person, a client)
        # is not ours to answer any more.
        call.request = request_id if self.pending(request_id) else None
        if request is not None:
            _bounded_put(session.asks, call.digest, request.permission, _MAX_SIGNATURES)

    def replied(self, event: PermissionReplied) -> None:
        """Someone answered a request (we, a person, a client)."""
        request = self._requests.get(event.request_id)
        if request is None:
            return
        request.reply = event.reply
        session = self._sessions.get(request.session_id)
        if event.reply == "always" and session is not None:
            # Later calls under this permission will not ask: their loops need the abort.
            for digest, permission in session.asks.items():
                if permission == request.permission:
                    session.asks[digest] = None

    def pending(self, request_id: str) -> bool:
        """True while nobody has answered the request, as far as the stream told us."""
        request = self._requests.get(request_id)
        return request is not None and request.reply is None

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id)

    def _refuse(self, request_id: str, decision: Intervene, wait: float) -> Reply:
        message = rejection_text(
            decision.cycle, decision.tools, decision.hold, decision.prior_interventions + 1
        )
        return Reply(
            request_id,
            decision.session_id,
            decision.directory,
            "reject",
            message=message,
            loop=decision,
            wait=wait,
        )

    @staticmethod
    def _last_part(session: _Session | None, tool: str | None) -> str:
        """The part id of the session's last unfinished call of `tool` ("" if none)."""
        if session is None:
            return ""
        for call in reversed(session.calls.values()):
            if call.tool == tool:
                return call.part_id
        return ""
