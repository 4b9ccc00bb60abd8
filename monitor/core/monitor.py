"""The monitor: the core's one face to the shell. Inputs in, commands out.

`Monitor` takes what the shell sees (a frame's data, a frame read back, a session's record,
the plugin's question and what came of its answer, a call's time bound run out, what came of
an intervention's request, the role the shell's lock gives, what the server is, the time)
and returns the commands to carry out (`monitor.core.commands`). It calls nothing back and is
given no callbacks; the time comes in with each input. It owns the tracker (every session's
state; the shell reaches it through nothing else) and the live interventions (`Lives`: each
session's, in order, and the work parked while the server is away). Every policy choice the
shell used to make lives here: whether this monitor acts for a session (`role`), a standby
refuses no question on its own account (the plugin's own rule judges), a session not yet read
back is not judged on part of its history, a dry run allows what it would block, a deferred
loop is not counted again, a deferred or standby outcome is not notified, a question that
fell open is counted, a flood of refused questions or malformed frames gets one line per
interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

from monitor.core import intervention as life
from monitor.core.commands import (
    Await,
    Command,
    Count,
    Do,
    Log,
    Send,
    Stop,
    Tell,
)
from monitor.core.decisions import Deadline, Intervene, Outcome, Plan, Reply
from monitor.core.export import current_run, export_frames, feedback_count, held_in, late_frames
from monitor.core.fed import Fed, SessionView
from monitor.core.lives import Lives
from monitor.core.plugin_protocol import ALLOW, PluginCall, PluginVerdict, RequestRefused
from monitor.core.plugin_stats import UNASKED_CHECK_S, PluginStats, Unasked
from monitor.core.profile import transparent_tools
from monitor.core.resync import Waiting, finished_calls
from monitor.core.server import ServerKind
from monitor.core.throttle import Throttle
from monitor.core.tracker import Tracker

__all__ = ["NOT_FOLLOWED", "STANDBY", "Monitor"]

MALFORMED_LOG_EVERY_S = 10.0
REFUSED_LOG_EVERY_S = 10.0
# The plugin's 503 while the session's run is not known: its own rule judges the call.
NOT_FOLLOWED = "the monitor is (re)connecting and has not read this session's run yet"
# A standby refuses nothing on its own account: the plugin's own rule judges the call, the
# acting monitor sees it on the stream (monitor.shell.acting). It serves the endpoint for at
# most a poll: while a monitor without one gives it the role.
STANDBY = "the monitor is another's standby and acts on nothing; the plugin's own rule judges"
NOT_ASKING = (
    "the server runs tool calls and no plugin asks this monitor: install the plugin where the "
    "server looks (`opencode-loop-monitor plugin install`, then restart OpenCode) with this "
    "monitor's --url; `plugin status` checks it"
)
# An outcome another monitor tells of (it acted, or it acts for this server): one
# notification per loop.
_NOT_NOTIFIED = (Outcome.DEFERRED, Outcome.STANDBY)


class Monitor:
    """Every session the daemon (or `attach`, `only_session`) follows, from a frame or a
    question to the intervention's end, as the tracker keeps them; see the module."""

    def __init__(
        self, tracker: Tracker, dry_run: bool = False, only_session: str | None = None
    ) -> None:
        self.tracker = tracker
        self.dry_run = dry_run
        self.only_session = only_session
        # Whether this monitor acts (the shell's lock says, `role`; a standby logs what it
        # finds), which monitor does when this one does not, and the sessions an `attach`
        # acts for (a daemon leaves them to it).
        self.acting = True
        self._acting_pid: int | None = None
        self._attached: frozenset[str] = frozenset()
        self.plugin_stats = PluginStats()
        # While the plugin endpoint is served and no plugin has asked yet.
        self.unasked: Unasked | None = None
        self._endpoint: str | None = None  # where the plugin endpoint is served
        # When `tick` next has anything to do (`Unasked.next_check`): a quiet frame before
        # then costs one comparison.
        self._next_tick = float("inf")
        self._malformed = Throttle(MALFORMED_LOG_EVERY_S)
        self._refusals = Throttle(REFUSED_LOG_EVERY_S)
        self._ended = False
        self.lives = Lives()
        # Reads of the record before a stop (`life.found`): more where another monitor
        # answers this server's plugin.
        self._reads = 1
        # Whether the server replays a new-engine session's missed events (`server`): as a
        # 1.18.33 until a connect says otherwise.
        self._replays = True

    def serving_plugins(self, endpoint: str, unasked_after: float) -> None:
        """The shell serves the plugin endpoint (`endpoint`, as a plugin reaches it) from now
        on: say when no plugin asks."""
        self._endpoint = endpoint
        self.unasked = Unasked(unasked_after, min(UNASKED_CHECK_S, unasked_after / 5))
        self._next_tick = self.unasked.next_check

    def server(self, kind: ServerKind) -> None:
        """What the server the next connect reaches serves: which routes a session's
        actions take where its own frames have not said, and whether a new-engine session's
        missed events are replayed or its record read back (`last_seq`)."""
        self._replays = kind.replays
        self.tracker.server_routes(kind.classic)

    def role(
        self, acting: bool, acting_pid: int | None = None, attached: Iterable[str] = ()
    ) -> None:
        """What the lock the shell holds says (monitor.shell.acting): whether this monitor
        acts; the process id the server's lock names (the acting daemon's, as far as known:
        a loop left to another is logged with it); the sessions an `attach` acts for, which
        a daemon that acts leaves to it. The one source of whether a loop found here is
        acted on or logged as another's."""
        self.acting = acting
        self._acting_pid = acting_pid
        self._attached = frozenset(attached)

    def plugin_elsewhere(self, elsewhere: bool) -> None:
        """Another monitor of this server answers its plugin (`elsewhere`): a loop's call
        caught on the stream may be one its plugin blocks a moment later (the hook runs
        before the stream shows the call), so the record is read a few times before acting."""
        self._reads = life.REFUSED_READS if elsewhere else 1

    def engine_known(self, session_id: str, engine: int) -> None:
        """`attach`'s session, looked up before its frames say which engine runs it: one of
        the new engine (2) is read back and acted on by its routes from now on."""
        if engine == 2:
            self.tracker.engine_sessions((session_id,))

    def question(
        self, call: PluginCall, following: bool
    ) -> tuple[PluginVerdict | RequestRefused, list[Command]]:
        """The plugin's question about one call (`following`: the session's run is known,
        not being read back): the answer, and what to carry out."""
        if not self.acting:
            return RequestRefused(503, STANDBY), []
        if not following:
            # Judged on part of its history, the loop's call was let through (a daemon
            # restarted mid-run). The plugin's own rule, which saw every call, judges it.
            return RequestRefused(503, NOT_FOLLOWED), []
        judged = self.tracker.judge(call)
        decision = judged.decision
        if decision is None:
            return judged.verdict, []
        commands: list[Command] = []
        commands.extend(_loop_counts(decision))
        if judged.verdict == ALLOW or self.dry_run:
            self._act_for(decision, (), commands)  # a nudge, or what a dry run logs
            return ALLOW, commands
        commands.extend(self.blocked(decision, call.call_id))
        return judged.verdict, commands

    def answered(
        self, call: PluginCall, verdict: PluginVerdict, now_unix: float, answered: bool = True
    ) -> list[Command]:
        """The plugin was answered (`answered` False: it had given up waiting)."""
        label, fell_open = self.plugin_stats.asked(call, verdict, now_unix, answered)
        return [Count("plugin_asked", (label, verdict.verdict, fell_open))]

    def late(self, call: PluginCall, now_unix: float) -> list[Command]:
        """A question the plugin gave up on before it was read: the call ran unasked (the
        plugin counts it, and reports it with its next question); not judged."""
        fields = {"session_id": call.session_id, "tool": call.tool}
        return [Log("info", "plugin.late", fields), *self.answered(call, ALLOW, now_unix, False)]

    def refused(self, refused: RequestRefused, now: float) -> list[Command]:
        """A question refused (a wrong token, a bad body, a standby's 503, ...)."""
        self.plugin_stats.refused += 1
        commands: list[Command] = [Count("plugin_refused", (refused.status,))]
        # Anyone who can connect can be refused as often as they like: one line per status
        # per interval, or they would fill the journal and push loop.detected out with it.
        count = self._refusals.due(str(refused.status), now)
        if count is not None:
            fields = {"status": refused.status, "reason": refused.message, "count": count}
            commands.append(Log("warning", "plugin.refused", fields))
        return commands

    def frame(self, data: str, now: float) -> tuple[Fed, Sequence[Command]]:
        """One frame's data, as read from the stream: what it did, and what to carry out."""
        fed = self.tracker.feed_data(data)
        return fed, self.fed(fed, now)

    def event(self, frame: object, now: float) -> tuple[Fed, Sequence[Command]]:
        """One frame decoded already (held while a resync ran, or read back: a session's
        history, a pending permission request): what it did, and what to carry out."""
        fed = self.tracker.feed(frame)
        return fed, self.fed(fed, now)

    def seed(
        self, session_id: str, directory: str | None, messages: list[Any], now: float
    ) -> list[Command]:
        """A busy session's record, read back before it is followed live (`Tracker.seed`):
        its current run rebuilt, and what that decided to carry out."""
        frames = list(export_frames(current_run(messages)))
        tracker = self.tracker
        decisions = tracker.seed(
            session_id,
            frames,
            directory,
            feedback_count(messages),
            held_in(messages),
            late_frames(messages),
        )
        fields = {
            "session_id": session_id,
            "calls": sum(isinstance(frame, dict) for frame in frames),
            "loop": bool(decisions),
        }
        commands: list[Command] = [Log("info", "session.seeded", fields)]
        commands.extend(Await(deadline) for deadline in tracker.read_back_deadlines(session_id))
        behind = self.lives.acting_on(session_id)
        for command in self.fed(Fed(tuple(decisions)), now):
            if behind or not _reads_at_once(command):
                commands.append(command)
                continue
            # The check before acting reads the record just read back: it is judged on that
            # read, not read again. A read again that failed would act (better twice than
            # never) on a loop whose run the record shows refused or stopped by a monitor
            # before a restart (found by tests/test_model.py).
            assert isinstance(command, Do) and isinstance(command.command, life.ReadRecent)
            read = life.Read(messages[-command.command.last :])
            commands.extend(_with_said(command, self.happened(command.number, read, now)))
        return commands

    def idle_read(self, session_id: str, directory: str | None, messages: list[Any]) -> None:
        """An idle session's newest messages, read back: whether it waits for a person, and
        how often it was intervened in (the ladder goes on where an earlier process left it)."""
        held, interventions = held_in(messages), feedback_count(messages)
        if held or interventions or session_id in self.tracker.held():
            late = late_frames(messages)
            self.tracker.seed(session_id, (), directory, interventions, held, late)

    def end_runs(self, session_ids: Iterable[str], now: float) -> Sequence[Command]:
        """The runs of these sessions are over (the resync found them idle): a refusal that
        waited in one is carried out late."""
        return self.fed(Fed(tuple(self.tracker.end_runs(session_ids))), now)

    def named_busy(self, route: int, session_ids: Iterable[str]) -> None:
        """The busy sessions one route's list named (`route` 2: the new engine's)."""
        self.tracker.named_busy(route, session_ids)

    def gone(self, session_id: str) -> None:
        """The server says the session is gone (a read-back found it deleted)."""
        self.tracker.forget(session_id)

    def known(self) -> dict[str, str | None]:
        """A query: every session followed, with the directory the stream told (or None)."""
        return self.tracker.known()

    def running(self) -> dict[str, str | None]:
        """A query: the sessions with a run under way, with their directories."""
        return self.tracker.running()

    def held(self) -> dict[str, str | None]:
        """A query: the sessions on hold, with their directories."""
        return self.tracker.held()

    def held_sessions(self) -> int:
        """A query: how many sessions are on hold (the held gauge)."""
        return self.tracker.held_sessions

    def active_sessions(self) -> int:
        """A query: how many sessions have a run under way (the sessions gauge)."""
        return self.tracker.active_sessions

    def sessions_view(self) -> list[SessionView]:
        """A query: a read-only copy of every session followed, oldest first."""
        return self.tracker.sessions_view()

    def waits(self, waiting: Waiting, session_id: str, directory: str | None) -> bool:
        """A query: whether a question about the session waits for the resync under way."""
        return self.tracker.waits(waiting, session_id, directory)

    def route(self, session_id: str) -> int:
        """A query: which engine's routes act on the session (`Tracker.route`)."""
        return self.tracker.route(session_id)

    def last_seq(self, session_id: str) -> int | None:
        """A query: where a new-engine session's missed events are replayed from, its last
        durable event (None: not one, or a server with no replay, 2.x: its record is read
        back instead, as a 1.x session's is)."""
        return self.tracker.adapter.last_seq(session_id) if self._replays else None

    def reads_permissions(self) -> bool:
        """A query: whether permission requests are judged (pending ones read back)."""
        return self.tracker.detection.permissions != "off"

    def finished_calls(self, messages: object) -> int:
        """A query: the calls of a session's current run the server has finished, as the
        tracker counts them (the transparent tools left out)."""
        detection = self.tracker.detection
        return finished_calls(
            messages, transparent_tools(detection.profile, detection.ignore_tools)
        )

    def fed(self, fed: Fed, now: float) -> Sequence[Command]:
        """What one frame fed to the tracker (or one session read back) did."""
        if fed.quiet and now < self._next_tick:
            return ()  # most frames: nothing to do, nothing allocated
        commands: list[Command] = []
        if fed.decisions or fed.replies:
            self._carry_out(fed, commands)
        commands.extend(Await(deadline) for deadline in fed.deadlines)
        if fed.malformed is not None:
            commands.append(Count("malformed"))
            count = self._malformed.due("frame", now)
            if count is not None:
                fields = {"reason": fed.malformed, "count": self.tracker.malformed_total}
                commands.append(Log("warning", "frame.malformed", fields))
        if fed.spent is not None:
            commands.append(Count("spent", fed.spent))
        if fed.deleted is not None and fed.deleted == self.only_session and not self._ended:
            self._ended = True
            commands.append(Log("info", "attach.session_deleted", {"session_id": fed.deleted}))
            commands.append(Stop())
        if now >= self._next_tick:
            commands.extend(self.tick(now))
        return commands

    def overdue(self, deadline: Deadline) -> list[Command]:
        """A call's time bound (or a loop's wait for its call's end) has run out."""
        decision = self.tracker.overdue(deadline)
        if decision is None:
            return []
        commands: list[Command] = []
        self._carry_out(Fed((decision,)), commands)
        return commands

    def act(self, decision: Intervene) -> list[Command]:
        """Carry out a loop found: stopped, nudged, or (dry run) only logged, as planned."""
        return self._begin(*life.found(decision, dry_run=self.dry_run, reads=self._reads))

    def blocked(
        self, decision: Intervene, call_id: str | None = None, via: str = "plugin"
    ) -> list[Command]:
        """The plugin threw (told to, or by its own rule: `via`): the loop's call did not
        run; the intervention begins from that refusal."""
        return self._begin(*life.refused_call(decision, via, call_id, dry_run=self.dry_run))

    def answer(self, reply: Reply) -> list[Command]:
        """Answer a permission request: a refusal that is an intervention begins like one;
        any other answer is sent at once (`Send`)."""
        found, turn = life.request(reply)
        if found is None:
            return [*self._said(turn), Send(reply)]
        return self._begin(found, turn)

    def standby(self, decision: Intervene, acting_pid: int | None) -> list[Command]:
        """Another monitor (`acting_pid`) acts for this server: the loop is logged as its."""
        return self._said(life.standby(decision, acting_pid))

    def happened(self, number: int, happened: life.Happened, now: float) -> list[Command]:
        """What came of intervention `number`'s last command (`Do`), or its shutdown
        (`Cancelled`), or its end by a bug of ours (`Dropped`): its lines, its outcome's
        commands and its next `Do`. A `Read` after a `ReadRecent` gets whether the run is
        over now; an `Expired` names the reply waited on, and gets what is left to send."""
        found = self.lives.get(number)
        if found is None:
            return []  # done already
        if isinstance(happened, life.Read) and isinstance(found.command(), life.ReadRecent):
            run_over = self.tracker.run_over(found.decision)
            happened = dataclasses.replace(happened, run_over=run_over)
        elif isinstance(happened, life.Expired) and happened.reply is not None:
            happened = life.Expired(self.tracker.expire(happened.reply))
        turn = found.feed(happened)
        commands = self._said(turn)
        self._next(number, found, turn.command, commands, now)
        return commands

    def acting_on(self, session_id: str) -> bool:
        """True while an intervention for this session is queued or under way."""
        return self.lives.acting_on(session_id)

    def resume(self, now: float) -> list[Command]:
        """The server answers again (a connect): the work parked goes on, each behind its
        session's interventions; work too old is given up."""
        numbers, stale = self.lives.resume(now)
        commands: list[Command] = []
        for found in stale:
            commands.extend(self._said(found.feed(life.Dropped("server away too long"))))
        for number in numbers:
            resumed = self.lives.get(number)
            assert resumed is not None
            turn = resumed.feed(life.Resumed())
            commands.extend(self._said(turn))
            self._next(number, resumed, turn.command, commands, now)
        return commands

    def shutdown(self, now: float) -> list[Command]:
        """The watch ends: the work parked for the next connect is given up."""
        commands: list[Command] = []
        for found in self.lives.parked(now):
            commands.extend(self._said(found.feed(life.Cancelled())))
        return commands

    def tick(self, now: float) -> list[Command]:
        """The time passes with or without frames: say once when the server runs calls and
        no plugin asks (the plugin silently misses this monitor: not installed where the
        server looks, or pointing elsewhere)."""
        unasked = self.unasked
        if unasked is None or unasked.done:
            return []
        tracker = self.tracker
        calls = unasked.check(
            # Not the calls of new-engine sessions: 1.18 does not call a 1.x plugin for those.
            lambda: sum(
                view.calls
                for view in tracker.sessions_view()
                if tracker.adapter.engine(view.session_id) == 1
            ),
            bool(self.plugin_stats.by_directory),
            now,
        )
        self._next_tick = unasked.next_check
        if calls is None:
            return []
        fields = {"endpoint": self._endpoint, "calls": calls, "hint": NOT_ASKING}
        return [Log("warning", "plugin.not_asking", fields)]

    def _carry_out(self, fed: Fed, commands: list[Command]) -> None:
        """Every decision and permission answer takes this one path: a deferred loop stands
        for one already counted."""
        for decision in fed.decisions:
            self._act_for(decision, _loop_counts(decision), commands)
        for reply in fed.replies:
            loop = reply.loop
            if self._acts_for(reply.session_id):
                commands.extend(self.answer(reply))
                commands.extend(() if loop is None else _loop_counts(loop))
            elif loop is not None:
                commands.extend(self.standby(loop, self._acting_pid))  # a standby sends nothing

    def _act_for(
        self, decision: Intervene, counts: Sequence[Count], commands: list[Command]
    ) -> None:
        """Carry out a decision, then count it, where this monitor acts for its session (a
        new loop is counted by the monitor that acts on it); else log it as the acting
        monitor's."""
        if self._acts_for(decision.session_id):
            commands.extend(self.act(decision))
            commands.extend(counts)
        else:
            commands.extend(self.standby(decision, self._acting_pid))

    def _acts_for(self, session_id: str) -> bool:
        return (
            self.acting
            and session_id not in self._attached
            and self.only_session in (None, session_id)
        )

    def _begin(self, found: life.Intervention | None, turn: life.Turn) -> list[Command]:
        if found is None or turn.command is None:
            return self._said(turn)
        number = self.lives.begin(found)
        said = tuple(_log(report) for report in turn.reports if isinstance(report, life.Logged))
        return [Do(number, found.decision.session_id, turn.command, said)]

    def _next(
        self,
        number: int,
        found: life.Intervention,
        command: life.Command | None,
        commands: list[Command],
        now: float,
    ) -> None:
        """After a move: the intervention's next `Do`; or it is done, or parked until the
        next connect (the parked work given up for room said)."""
        if command is None:
            self.lives.end(number)
        elif isinstance(command, life.Park):
            for dropped in self.lives.park(number, command, now):
                gone = life.Dropped("too much work waiting for the server")
                commands.extend(self._said(dropped.feed(gone)))
        else:
            commands.append(Do(number, found.decision.session_id, command))

    def _said(self, turn: life.Turn) -> list[Command]:
        """A move's reports as commands: lines, an outcome's counts and tellings; a session
        gone from the server forgotten here."""
        commands: list[Command] = []
        for report in turn.reports:
            if isinstance(report, life.Logged):
                commands.append(_log(report))
            elif isinstance(report, life.Decided):
                commands.append(Log("warning", "intervention.outcome", report.fields))
                commands.extend(self._outcome(report.decision, report.outcome))
            else:
                self.tracker.forget(report.session_id)
        return commands

    def _outcome(self, decision: Intervene, outcome: Outcome) -> list[Command]:
        """How an intervention ended: the core decides what a hold means."""
        self.tracker.outcome(decision, outcome)
        return [
            Count("intervention", (outcome,)),
            Tell(decision, outcome, notify=outcome not in _NOT_NOTIFIED),
        ]


def _reads_at_once(command: Command) -> bool:
    """Whether `command` begins an intervention with a read of the record sent at once."""
    if not isinstance(command, Do):
        return False
    read = command.command
    return isinstance(read, life.ReadRecent) and read.at_once


def _with_said(first: Do, then: list[Command]) -> list[Command]:
    """What came of `first`'s read, `first`'s own lines (its `loop.detected`) kept in their
    place: with its next request, or before the lines its read made."""
    if then and isinstance(then[0], Do) and then[0].number == first.number:
        return [dataclasses.replace(then[0], said=first.said), *then[1:]]
    return [*first.said, *then]


def _log(logged: life.Logged) -> Log:
    level = cast(Literal["debug", "info", "warning", "error"], logged.level)
    return Log(level, logged.event, logged.fields)


def _loop_counts(decision: Intervene) -> tuple[Count, ...]:
    """`loops_detected_total` for a new loop; a deferred one stands for a loop counted."""
    if decision.plan == Plan.DEFER:
        return ()
    return (Count("loop", (decision.finding.shape()[0], decision.rule)),)
