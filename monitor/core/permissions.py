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

Pure: events in, decisions out; the shell sends the replies and runs the grace timer: a
`Reply` with a `wait` is a deadline, whose expiry the shell feeds back (`Tracker.expire`), and
the gate answers then whether to refuse the request after all.

The gate keeps no table of its own: what it knows of a session's calls and requests lives in
the session's record (monitor/core/session.py), beside the tracker's, and a call's identity is
the one the rules use (its digest after the tool profile), so a call relabelled by its
`description` is the same call here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from monitor.core.calls import CallEvent, CallState, advance
from monitor.core.decisions import Intervene, Plan, Reply
from monitor.core.events import PermissionAsked, PermissionReplied, ToolPart
from monitor.core.findings import Rule
from monitor.core.handover import Awaiting, WaitEvent, WaitState, handed
from monitor.core.session import (
    MAX_ASKS,
    MAX_IN_FLIGHT,
    MAX_REQUESTS,
    Call,
    Request,
    SessionRecord,
    bounded_put,
)

__all__ = ["DOOM_LOOP", "DOOM_LOOP_CALLS", "PermissionGate", "PermissionMode", "Reply"]

PermissionMode = Literal["off", "gate", "approve"]
DOOM_LOOP = Rule.DOOM_LOOP
# OpenCode asks `doom_loop` when the last calls of one message are this many identical ones.
DOOM_LOOP_CALLS = 3

_FINISHED = ("completed", "error")


class PermissionGate:
    """Follows the calls and permission requests of every session; see the module doc."""

    def __init__(self, mode: PermissionMode = "off", grace: float = 30.0) -> None:
        self.mode = mode
        self.grace = grace

    def follows(self, part: ToolPart) -> bool:
        """Whether the gate follows this call (it must be named as requests name it)."""
        return self.mode != "off" and part.message_id is not None and part.call_id is not None

    def started(self, session: SessionRecord, call: Call, part: ToolPart) -> None:
        """`call` is seen at `running` for the first time (`follows(part)` holds)."""
        assert part.message_id is not None and part.call_id is not None
        key = call.key = (part.message_id, part.call_id)
        early = None if session.early is None else session.early.pop(key, None)
        if early is not None:
            self._ask(session, call, early)

    def finished(self, session: SessionRecord, call: Call, live: bool) -> None:
        """The final update of a call the gate follows, before the tracker takes it (a loop
        that waited for a request that never came is the tracker's to stop: `WaitEvent.END`).
        `live` is False for parts read back, whose past requests we cannot know."""
        if live and not call.asked:
            # Learned: calls like this one run without asking.
            _put_ask(session, call.digest, None)
        call.key = None

    def decide(
        self,
        session_id: str,
        session: SessionRecord,
        call: Call | None,
        decision: Intervene | None,
        directory: str | None,
        route: int,
    ) -> Intervene | Reply | None:
        """After the tracker took a `running` update of `call`: `decision` is the loop it
        completes, if any; `directory` the session's project, `route` its engine's routes.

        Returns the decision to carry out now (the abort), a `Reply` (the refusal of a request
        that came already, or under `approve` the approval of a call that is no loop), or
        None: nothing, or wait for the call's request (`asked` then returns the refusal).
        """
        if call is None or call.key is None:
            return decision
        request, call.request = call.request, None
        if decision is None:
            if request is not None and self.mode == "approve":
                return Reply(request, session_id, directory, "once", route=route)
            return None
        if request is not None:
            return _refuse(request, decision, 0.0)
        asks = session.asks
        if call.asked or asks is None or asks.get(call.digest) is None:
            # Its request was answered already by someone else, or its like ran without
            # asking (or we never saw one finish): abort as before.
            advance(call, CallEvent.ABORT)
            return decision
        call.waiting = Awaiting(WaitState.AWAIT_REQUEST, decision)
        return None

    def asked(
        self,
        session: SessionRecord,
        event: PermissionAsked,
        directory: str | None,
        route: int,
        doom_loop: Callable[[PermissionAsked, str], Intervene],
    ) -> Reply | None:
        """A permission request: how to answer it, if at all.

        `directory` is the session's project, `route` its engine's routes; `doom_loop`
        makes the decision for a loop the server found, given the request and the part id of
        the last call of that tool.
        A request seen before (read back again after a reconnect) gets no second answer.
        """
        requests = session.requests
        if self.mode == "off" or (requests is not None and event.request_id in requests):
            return None
        if requests is None:
            requests = session.requests = {}
        bounded_put(requests, event.request_id, Request(event.permission), MAX_REQUESTS)
        if event.permission == DOOM_LOOP:
            decision = doom_loop(event, _last_part(session, event.tool))
            if decision.plan is Plan.DEFER:
                return _again(session, event, decision, directory, route)
            wait = 0.0 if self.mode == "approve" else self.grace
            return _refuse(event.request_id, decision, wait)
        if event.message_id is None or event.call_id is None:
            # Not a call's request: nothing to weigh it against.
            if self.mode == "approve":
                return Reply(event.request_id, event.session_id, directory, "once", route=route)
            return None
        key = (event.message_id, event.call_id)
        call = session.by_key(key)
        if call is None:
            # Before the call's `running` update: whether it is a loop's is not known yet,
            # so it is answered then (`decide`).
            if session.early is None:
                session.early = {}
            bounded_put(session.early, key, event.request_id, MAX_IN_FLIGHT)
            return None
        self._ask(session, call, event.request_id)
        call.request = None
        loop = handed(call.waiting, WaitEvent.REQUEST)
        if loop is not None:
            return _refuse(event.request_id, loop, 0.0)
        if call.state is CallState.STOPPED or self.mode != "approve":
            return None
        return Reply(event.request_id, event.session_id, directory, "once", route=route)

    def _ask(self, session: SessionRecord, call: Call, request_id: str) -> None:
        """Learn that `call` asked: calls like it will ask too."""
        request = None if session.requests is None else session.requests.get(request_id)
        call.asked = True
        # A request answered before its call's `running` update (by a person, a client)
        # is not ours to answer any more.
        call.request = request_id if self.pending(session, request_id) else None
        if request is not None:
            _put_ask(session, call.digest, request.permission)

    def replied(self, session: SessionRecord, event: PermissionReplied) -> None:
        """Someone answered a request (we, a person, a client)."""
        request = None if session.requests is None else session.requests.get(event.request_id)
        if request is None:
            return
        request.reply = event.reply
        if event.reply == "always" and session.asks is not None:
            # Later calls under this permission will not ask: their loops need the abort.
            for digest, permission in session.asks.items():
                if permission == request.permission:
                    session.asks[digest] = None

    @staticmethod
    def pending(session: SessionRecord | None, request_id: str) -> bool:
        """True while nobody has answered the request, as far as the stream told us."""
        requests = None if session is None else session.requests
        request = None if requests is None else requests.get(request_id)
        return request is not None and request.reply is None


def _refuse(request_id: str, decision: Intervene, wait: float) -> Reply:
    """Refuse a request for the loop `decision` stands for, with its refusal text (after
    `wait` seconds of grace for a person)."""
    return Reply(
        request_id,
        decision.session_id,
        decision.directory,
        "reject",
        message=decision.refusal,
        loop=decision,
        wait=wait,
        route=decision.route,
    )


def _again(
    session: SessionRecord,
    event: PermissionAsked,
    decision: Intervene,
    directory: str | None,
    route: int,
) -> Reply:
    """A `doom_loop` request about a loop an intervention of this run stands for already (the
    server asks about the burst whose call we refused, or whose run we are stopping): no
    second intervention, and no grace for a person, since the loop is acted on. Refused at
    once, unless that intervention was the plugin's refusal of a run meant to go on: then it
    is approved, as refusing it would end the run the refusal let go on (NOTES.md: a
    rejected `doom_loop` ends the run), and each call of the burst still asks the plugin,
    which refuses it as the same loop (`Plan.DEFER`)."""
    acted = session.acted
    if session.plugin and acted is not None and acted.decision.plan is Plan.REFUSE:
        return Reply(event.request_id, event.session_id, directory, "once", route=route)
    return _refuse(event.request_id, decision, 0.0)


def _put_ask(session: SessionRecord, digest: int, permission: str | None) -> None:
    if session.asks is None:
        session.asks = {}
    bounded_put(session.asks, digest, permission, MAX_ASKS)


def _last_part(session: SessionRecord, tool: str | None) -> str:
    """The part id of the session's last unfinished call of `tool` that the gate follows
    ("" if none)."""
    for call in reversed(list((session.in_flight or {}).values())):
        if call.key is not None and call.tool == tool:
            return call.part_id
    return ""
