"""A model of what a real server and its neighbours do, driving the core's one face,
`Monitor`, in random interleavings (Hypothesis's `RuleBasedStateMachine`): "one loop, one
intervention" and the other promises are checked after every step, whatever the order,
instead of in the orders a test names (issue 43).

The model plays three parts, as they are ordered in reality:
- the server, which puts its events on one stream in its own order (NOTES.md): a run begins
  with a person's message; a model step's calls are shown running one by one, OpenCode's own
  `doom_loop` check asking as the third identical call of a step starts; a call ends
  (completed, or in error when refused or when its run was aborted); the next step begins
  only once the step's calls have ended; a run ends idle (with `ends_later`, an aborted one
  before its calls' ends, which may come after the feedback that starts the next run); a
  session may be deleted;
- the monitor's stream, which lags: the server's events reach the core in order, but as late
  as the model likes (`deliver`);
- the plugin, whose question about a call comes out of band, after the server showed the call
  running and before it ran (or never: it fell open), so it may overtake the stream; and the
  shell, which carries out `Monitor`'s commands as the daemon's executor does: each
  intervention begun in the core's intervention table (`monitor.core.intervention`), its
  commands answered by the server at once or later, in any order, now and then with a
  failure, and its outcome fed back (`Monitor.outcome`); an abort or a refused permission
  request ends the run on the server, a feedback is stored in the session's record and starts
  the next run (a hold's waits for a person);
- the monitor's process, which may restart (or lose its state on a reconnect) at any point:
  what was on the wire and the commands under way are lost, and each session is read back
  from its record (`GET /session/{id}/message`, which the model keeps) as the daemon's resync
  does, so that an intervention checking the record reads what the server holds.

"One loop, one intervention" is checked twice: the decisions of one process, and what reached
the model across processes (a call refused in band, a refused request's message, a feedback;
an abort alone is not counted, since one whose process died before its feedback is finished
by the next process).

What the core decides is checked against what the model knows of each call (its run, step
and arguments, whether it was refused). Each counterexample found so far is a plain test:
tests/test_judge.py (a burst asked about by `doom_loop`; a step's end that came late) and
tests/test_abort_aftermath.py, tests/test_monitors.py, tests/test_session_steps.py and the
tests at the end of this file; the window between an abort and its calls' ends
(`ends_later`), which a random run opens when it draws `abort_ends_later`, is also written out
here (`test_a_monitor_restarted_between_an_abort_and_its_calls_ends`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from monitor.core import intervention as life
from monitor.core.calls import Step
from monitor.core.commands import Command, Do, Send, Tell
from monitor.core.decisions import Intervene, Plan
from monitor.core.feedback import MARK
from monitor.core.monitor import Monitor
from monitor.core.plugin_protocol import PluginCall, PluginVerdict
from monitor.core.tracker import Detection, Tracker
from tests.frames_factory import deleted, idle, status, tool_part, user_frames

SESSIONS = ("ses_a", "ses_b", "ses_c")
# Two calls to repeat: one loop of either, or a cycle of both.
ARGS = (
    ("bash", {"command": "echo x >> out.txt", "description": "append"}),
    ("read", {"filePath": "README.md"}),
)
ABORTED = "Tool execution aborted"
REJECTED = (
    "The user rejected permission to use this specific tool call with the following feedback: "
)
REFUSED = f"{MARK}this call was refused"
MAX_SESSIONS = 4
DETECTION = Detection(permissions="gate", max_sessions=MAX_SESSIONS)
# A step's calls: one call repeated (a burst), or a mix of both.
PATTERNS = st.one_of(
    st.tuples(st.sampled_from((0, 1)), st.integers(3, 6)).map(lambda t: [t[0]] * t[1]),
    st.lists(st.sampled_from((0, 1)), min_size=1, max_size=6),
)


@dataclass
class Call:
    """One tool call as the model knows it."""

    part_id: str
    call_id: str
    step: str
    run: int
    args: int  # index in ARGS
    asked: bool = False
    refused: bool = False  # the plugin threw: it never ran
    ended: bool = False  # the server ended it (its last update is on the stream)
    aborted: bool = False  # its run was aborted: it ends in the abort's error, maybe after idle


@dataclass
class Session:
    plugin: bool
    run: int = 0
    busy: bool = False  # on the server
    step: str | None = None
    calls: list[Call] = field(default_factory=list)  # of the current step
    doom_asked: bool = False  # in the current step
    ending: bool = False  # aborted on the server: its calls end in error, then idle
    # Decisions by (process, run, step, arguments): one loop, one intervention decided in a
    # monitor's process.
    counted: dict[tuple[int, int, str, int], list[str]] = field(default_factory=dict)
    # Interventions that reached the server (a call refused, an abort, a feedback, a reply) by
    # (run, step, arguments): one loop, one intervention, across restarts too.
    reached: dict[tuple[int, str, int], list[str]] = field(default_factory=dict)
    parts: dict[str, Call] = field(default_factory=dict)  # every call of the session
    # The session's messages as `GET /session/{id}/message` returns them: what a restarted
    # monitor, or an intervention checking the record, reads back.
    record: list[dict[str, Any]] = field(default_factory=list)
    # Feedback posted while the run was still ending: the run it starts begins after idle.
    queued: bool = False


@dataclass
class Frame:
    """A server event on its way to the monitor, and what the model knows of it."""

    session_id: str
    data: dict[str, Any]
    call: Call | None = None


@dataclass
class UnderWay:
    """An intervention the shell carries out (`Do`): its number and decision, the command
    it waits on, and the run it was decided in."""

    number: int
    decision: Intervene
    command: life.Command
    run: int


@dataclass
class Process:
    """One monitor's process: its core, what is on its stream's wire, and (acting) the
    interventions it carries out."""

    number: int
    acting: bool
    tracker: Tracker = field(default_factory=lambda: Tracker(DETECTION))
    stream: deque[Frame] = field(default_factory=deque)
    under_way: list[UnderWay] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.monitor = Monitor(self.tracker)
        self.monitor.role(self.acting)


class Model(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.numbers = itertools.count(1)
        self.acting = Process(next(self.numbers), acting=True)
        self.standby: Process | None = None  # a second monitor of the same server
        self.sessions: dict[str, Session] = {}
        self.ids = itertools.count(1)
        self.violations: list[str] = []
        self.trace: list[str] = []  # what happened, shortly, for a violation's message
        # Whether an aborted run's calls end later (`end_call`: after the run's idle and the
        # feedback, maybe), or as the server takes the abort. The random runs end them at
        # once: with their ends later, 3,000 runs of 100 steps also found a `doom_loop`
        # decision made at a call's aborted end that came after the feedback, in a session
        # whose plugin asks and a monitor that followed it live: not looked into yet.
        self.ends_later = False
        # Permission requests the server has taken an answer to: it takes one per request
        # and says so to a later one (a standby that took over answers it again).
        self.answered: set[str] = set()
        self.gone: set[str] = set()  # deleted sessions' ids

    # -- the server -----------------------------------------------------------------------

    @rule(sid=st.sampled_from(SESSIONS), plugin=st.booleans())
    def prompt(self, sid: str, plugin: bool) -> None:
        """A person writes: a run begins (a new session has the plugin or not). OpenCode
        never gives a deleted session's id to another: a deleted one stays gone."""
        if sid in self.gone:
            return
        session = self.sessions.setdefault(sid, Session(plugin))
        if not session.busy:
            self.user_message(sid, session, "Please go on.")
            self.begin_run(sid, session)

    def user_message(self, sid: str, session: Session, text: str) -> None:
        """A user message (a person's, or the monitor's feedback), stored at once."""
        frames = user_frames(sid, f"msg_u{next(self.ids)}", text)
        session.record.append({"info": frames[0]["properties"]["info"], "parts": []})
        session.record[-1]["parts"].append(frames[1]["properties"]["part"])
        self.emit(sid, *frames)

    def begin_run(self, sid: str, session: Session) -> None:
        session.run += 1
        session.busy, session.step, session.calls = True, None, []
        session.ending = False
        self.emit(sid, status(sid, "busy"))

    @precondition(lambda self: any(self.can_step(s) for s in self.sessions.values()))
    @rule(sid=st.sampled_from(SESSIONS), pattern=PATTERNS)
    def step(self, sid: str, pattern: list[int]) -> None:
        """A model step: its calls start, one by one, in one assistant message."""
        session = self.sessions.get(sid)
        if session is None or not self.can_step(session):
            return
        step = session.step = f"msg_s{next(self.ids)}"
        session.calls, session.doom_asked = [], False
        info = {"id": step, "role": "assistant", "sessionID": sid, "time": {"created": 1}}
        session.record.append({"info": info, "parts": []})
        for k, args in enumerate(pattern):
            # call ids repeat from step to step, as local models send them
            call = Call(f"prt_{next(self.ids)}", f"call_{k}", step, session.run, args)
            session.calls.append(call)
            session.parts[call.part_id] = call
            self.emit_call(sid, call, "running")
            last = session.calls[-3:]
            if len(last) == 3 and len({c.args for c in last}) == 1 and not session.doom_asked:
                session.doom_asked = True
                self.emit(sid, self.doom_request(sid, call), call=call)

    @precondition(lambda self: self.open_calls(lambda s, c: True))
    @rule(sid=st.sampled_from(SESSIONS), data=st.data())
    def end_call(self, sid: str, data: st.DataObject) -> None:
        """A call ends on the server: it ran (asked first where the plugin asks, unless it
        fell open), or its run was aborted (also after the run's idle, the feedback stored
        and the next run begun)."""
        session = self.sessions.get(sid)
        call = self.pick(sid, data, lambda s, c: True)
        if session is None or call is None:
            return
        if call.aborted:
            self.end(sid, call, "error", ABORTED)
        elif not session.plugin or call.asked or data.draw(st.integers(0, 9)) == 9:
            self.end(sid, call, "completed")

    @precondition(lambda self: any(s.busy for s in self.sessions.values()))
    @rule(sid=st.sampled_from(SESSIONS))
    def finish_run(self, sid: str) -> None:
        """The run ends once its calls have (the model answered), or once the abort landed,
        its calls' ends still to come (NOTES.md: 25 cancelled tasks all ended after the idle);
        those come before the next run ends (milliseconds, against a model's step)."""
        session = self.sessions.get(sid)
        if session is None or not session.busy:
            return
        if any(c.run < session.run or not c.aborted for c in self.open(session)):
            return
        session.busy = False
        self.emit(sid, status(sid, "idle"), idle(sid))
        if session.queued:
            session.queued = False
            self.begin_run(sid, session)

    @precondition(lambda self: not self.ends_later)
    @rule()
    def abort_ends_later(self) -> None:
        """From now on, an aborted run's calls end a moment after its idle (as 25 cancelled
        tasks did, NOTES.md), maybe after the feedback that starts the next run."""
        self.trace.append("ends_later")
        self.ends_later = True

    @precondition(lambda self: bool(self.sessions))
    @rule(sid=st.sampled_from(SESSIONS))
    def delete(self, sid: str) -> None:
        if self.sessions.pop(sid, None) is not None:
            self.gone.add(sid)
            self.emit(sid, deleted(sid))

    # -- the stream -----------------------------------------------------------------------

    @precondition(lambda self: any(proc.stream for proc in self.processes()))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """A monitor reads its stream's next events, in the server's order."""
        proc = data.draw(st.sampled_from([proc for proc in self.processes() if proc.stream]))
        for _ in range(data.draw(st.integers(1, len(proc.stream)))):
            self.feed(proc, proc.stream.popleft())

    # -- the monitor's process ---------------------------------------------------------------

    @rule()
    def restart(self) -> None:
        """The acting monitor's process is restarted (or its stream reconnects after its
        state was lost) and acts again: what was on the wire is gone, the commands under way
        with it (they never reached the server: nothing of them counts)."""
        self.trace.append("restart")
        self.acting = self.started(acting=True)

    @precondition(lambda self: self.standby is None)
    @rule()
    def second_monitor(self) -> None:
        """A second monitor of the same server starts, and stands by."""
        self.trace.append("standby")
        self.standby = self.started(acting=False)

    @precondition(lambda self: self.standby is not None)
    @rule()
    def takeover(self) -> None:
        """The acting monitor's process ends; the standby, which followed the stream all
        along, takes the role at its next poll (no read-back: monitor.shell.acting)."""
        assert self.standby is not None
        self.trace.append("takeover")
        self.acting, self.standby = self.standby, None
        self.acting.acting = True
        self.acting.monitor.role(True)

    def started(self, acting: bool) -> Process:
        """A monitor's process starts: each session is read back from its record as the
        daemon's resync does (a busy one's current run seeded, an idle one's hold and
        intervention count)."""
        proc = Process(next(self.numbers), acting)
        for sid, session in self.sessions.items():
            record = list(session.record)
            if session.busy:
                commands = proc.monitor.seed(sid, "/p", record, 0.0)
                for decision in decisions_in(proc, commands):
                    self.decided(proc, sid, decision, self.call_of(session, decision))
                self.carry_out(proc, commands, session.run)
            else:
                proc.monitor.idle_read(sid, "/p", record)
        return proc

    def processes(self) -> list[Process]:
        return [self.acting] if self.standby is None else [self.acting, self.standby]

    def call_of(self, session: Session, decision: Intervene) -> Call | None:
        """The call of the current step a decision read back names."""
        part_id = decision.part_id
        return next((c for c in session.calls if c.part_id == part_id), None)

    # -- the plugin -----------------------------------------------------------------------

    @precondition(lambda self: self.open_calls(lambda s, c: s.plugin and not c.asked))
    @rule(sid=st.sampled_from(SESSIONS), data=st.data())
    def ask(self, sid: str, data: st.DataObject) -> None:
        """The plugin asks about a call before it runs (the stream may lag behind)."""
        call = self.pick(sid, data, lambda s, c: s.plugin and not c.asked and not c.aborted)
        if call is None:
            return
        call.asked = True
        tool, args = ARGS[call.args]
        self.trace.append(f"ask:{call.part_id}")
        question = PluginCall(sid, call.call_id, tool, args, "/p", message_id=call.step)
        answer, commands = self.acting.monitor.question(question, following=True)
        if isinstance(answer, PluginVerdict) and answer.verdict == "block":
            call.refused = True
            self.end(sid, call, "error", REFUSED)  # the plugin threw: the server ends it
        for decision in decisions_in(self.acting, commands):
            self.decided(self.acting, sid, decision, call)
            if call.refused:
                self.reached(decision)  # the plugin threw
        self.carry_out(self.acting, commands, call.run)

    # -- the shell ------------------------------------------------------------------------

    @precondition(lambda self: bool(self.acting.under_way))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        """The server answers an intervention's commands under way, one or more in a row (in
        any order across interventions; one in ten fails); an abort, or a refused permission
        request, ends its run on the server."""
        under_way = self.acting.under_way
        work = under_way[data.draw(st.integers(0, len(under_way) - 1))]
        while True:
            happened = self.answer(work, data.draw(st.integers(0, 9)) == 9)
            commands = self.acting.monitor.happened(work.number, happened, 0.0)
            following = [c for c in commands if isinstance(c, Do) and c.number == work.number]
            if not following:
                under_way.remove(work)
                return
            work.command = following[0].command
            if data.draw(st.integers(0, 3)) == 0:
                return  # the next answer comes later

    def answer(self, work: UnderWay, failed: bool) -> life.Happened:
        """What came of the command `work` waits on."""
        decision, command = work.decision, work.command
        said = f"{type(command).__name__}{'!' if failed else ''}"
        self.trace.append(f"{said}:#{decision.prior_interventions + 1}")
        session = self.sessions.get(decision.session_id)
        record = [] if session is None else list(session.record)
        if isinstance(command, life.ReadRecent):
            read = None if failed else record[-command.last :]
            return life.Read(read)  # the core adds whether the run is over
        if isinstance(command, life.Wait):
            return life.Expired(command.reply)
        if failed:
            return life.Sent(life.Result.FAILED, "500")
        if isinstance(command, life.Answer):
            if command.reply.request_id in self.answered:
                return life.Sent(life.Result.NOT_TAKEN)  # answered first: nothing of it counts
            self.answered.add(command.reply.request_id)
        rejects = isinstance(command, life.Answer) and command.reply.reply == "reject"
        if isinstance(command, life.Abort) or rejects:
            # What the record shows of it at once (NOTES.md): a refused `doom_loop` request
            # leaves its message in the step's error, an abort a MessageAbortedError.
            error = {"name": "MessageAbortedError"}
            if isinstance(command, life.Answer):
                message = f"{REJECTED}{command.reply.message}"
                error = {"name": "UnknownError", "data": {"message": message}}
            self.run_ends(decision.session_id, work.run, error)
        if isinstance(command, life.Post | life.Answer):
            # What the model reads: the feedback, or the refused request's message. An abort
            # alone is not counted: one whose process died before its feedback is finished by
            # the next process, and the run is stopped once either way.
            self.reached(decision)
        if isinstance(command, life.Post) and session is not None:
            self.posted(decision.session_id, session, command)
        return life.Sent(life.Result.OK)

    def posted(self, sid: str, session: Session, post: life.Post) -> None:
        """The feedback is stored at once; unless it asks for no reply, it starts the next
        run (once the run under way has ended, as the server queues a prompt)."""
        self.user_message(sid, session, post.text)
        if post.no_reply:
            return
        if session.busy:
            session.queued = True
        else:
            self.begin_run(sid, session)

    def run_ends(self, sid: str, run: int, error: dict[str, Any]) -> None:
        session = self.sessions.get(sid)
        if session is not None and session.run == run and session.busy:
            session.ending = True
            step = next((m for m in session.record if m["info"]["id"] == session.step), None)
            if step is not None:
                step["info"].setdefault("error", error)
            # The server stops the run's calls as it takes the abort; their ends come a
            # moment later, before or after the idle and the feedback (`ends_later`): a
            # monitor started in between reads them back unfinished in a run that is over.
            for call in session.calls:
                call.aborted = not call.ended
                if call.aborted and not self.ends_later:
                    self.end(sid, call, "error", ABORTED)

    def carry_out(
        self, proc: Process, commands: list[Command] | tuple[Command, ...], run: int
    ) -> None:
        """What the daemon's executor does with `Monitor`'s commands: each intervention's
        request is carried out (`settle`); counts, lines, toasts and timers change nothing
        promised here. A standby's loops are logged as the acting one's by `Monitor`."""
        for command in commands:
            if isinstance(command, Do):
                began = proc.monitor.lives.get(command.number)
                assert began is not None
                work = UnderWay(command.number, began.decision, command.command, run)
                proc.under_way.append(work)
            elif isinstance(command, Send):
                self.answered.add(command.reply.request_id)  # sent at once, behind nothing

    # -- what the core said ---------------------------------------------------------------

    def feed(self, proc: Process, frame: Frame) -> None:
        sid = frame.session_id
        part = frame.data["properties"].get("part", {})
        self.trace.append(
            f"{proc.number}<{frame.data['type']}:{part.get('id', sid)}:"
            f"{part.get('state', {}).get('status', '')}"
        )
        _, commands = proc.monitor.event(frame.data, 0.0)
        error = part.get("state", {}).get("error")
        for decision in decisions_in(proc, commands):
            self.decided(proc, sid, decision, frame.call, error)
        self.carry_out(proc, commands, self.run_of(frame))
        self.check_state(proc, frame)

    def decided(
        self,
        proc: Process,
        sid: str,
        decision: Intervene,
        call: Call | None,
        error: str | None = None,
    ) -> None:
        """Check one decision of the acting monitor against what the model knows of the call
        it came with (and of the error its update ended in)."""
        if decision.plan == Plan.DEFER or call is None or not proc.acting:
            return
        session = self.sessions.get(sid)
        if error == REFUSED and not decision.refused:
            self.violations.append(
                f"{call.part_id}, refused in band, decided again ({decision.rule})"
            )
        if error == ABORTED:
            self.violations.append(
                f"{call.part_id}: the abort's aftermath counted ({decision.rule})"
            )
        if session is None or not decision.finding.names_calls:
            return
        key = (call.run, call.step, call.args)
        said = said_of(decision, call.part_id)
        self.one_per_loop(sid, session.counted.setdefault((proc.number, *key), []), said)

    def reached(self, decision: Intervene) -> None:
        """An intervention reached the model (a call refused in band, a refused request's
        message, a feedback): counted for its loop, across processes."""
        session = self.sessions.get(decision.session_id)
        call = None if session is None else session.parts.get(decision.part_id or "")
        if session is None or call is None or not decision.finding.names_calls:
            return
        if decision.plan == Plan.DEFER:
            return  # a burst's later call refused in that loop's words: the same intervention
        said = f"{said_of(decision, call.part_id)} by process {self.acting.number}"
        earlier = session.reached.setdefault((call.run, call.step, call.args), [])
        if said not in earlier:
            self.one_per_loop(decision.session_id, earlier, said)

    def one_per_loop(self, sid: str, earlier: list[str], said: str) -> None:
        earlier.append(said)
        if len(earlier) > 1:
            self.violations.append(
                f"{sid}: {len(earlier)} interventions for one loop: {', '.join(earlier)}; "
                f"trace: {' '.join(self.trace)}"
            )

    def check_state(self, proc: Process, frame: Frame) -> None:
        """State cleared: a session idle is not busy and has no run; a deleted one is gone."""
        kind = frame.data["type"]
        views = {view.session_id: view for view in proc.monitor.sessions_view()}
        view = views.get(frame.session_id)
        if kind == "session.idle" and view is not None and (view.busy or view.run_calls):
            self.violations.append(
                f"{frame.session_id} idle, yet busy={view.busy} run_calls={view.run_calls}"
            )
        if kind == "session.deleted" and view is not None:
            self.violations.append(f"{frame.session_id} deleted, yet followed")

    # -- helpers --------------------------------------------------------------------------

    def emit(self, sid: str, *frames: dict[str, Any], call: Call | None = None) -> None:
        for proc in self.processes():
            proc.stream.extend(Frame(sid, frame, call) for frame in frames)

    def emit_call(self, sid: str, call: Call, status: str, error: str | None = None) -> None:
        tool, args = ARGS[call.args]
        output = "ok" if status == "completed" else None
        frame = tool_part(
            sid, call.part_id, tool, status, args, output, error, call.call_id, call.step
        )
        self.emit(sid, frame, call=call)
        session = self.sessions.get(sid)
        message = (
            next((m for m in session.record if m["info"]["id"] == call.step), None)
            if session is not None
            else None
        )
        if message is not None:  # the part's newest state replaces the one before
            part = frame["properties"]["part"]
            message["parts"] = [p for p in message["parts"] if p["id"] != part["id"]] + [part]

    def end(self, sid: str, call: Call, status: str, error: str | None = None) -> None:
        call.ended = True
        self.emit_call(sid, call, status, error)

    def doom_request(self, sid: str, call: Call) -> dict[str, Any]:
        tool, args = ARGS[call.args]
        request_id = f"per_doom{next(self.ids)}"
        props = {
            "id": request_id,
            "sessionID": sid,
            "permission": "doom_loop",
            "metadata": {"tool": tool, "input": args},
        }
        return {"type": "permission.asked", "properties": props}

    def can_step(self, session: Session) -> bool:
        return session.busy and not session.ending and all(c.ended for c in session.calls)

    def open(self, session: Session) -> list[Call]:
        """The session's calls not ended yet: its step's, and an aborted run's."""
        return [c for c in session.parts.values() if not c.ended]

    def open_calls(self, fits: Callable[[Session, Call], bool]) -> bool:
        return any(fits(s, c) for s in self.sessions.values() for c in self.open(s))

    def pick(
        self, sid: str, data: st.DataObject, fits: Callable[[Session, Call], bool]
    ) -> Call | None:
        session = self.sessions.get(sid)
        if session is None:
            return None
        calls = [c for c in self.open(session) if fits(session, c)]
        if not calls:
            return None
        # Mostly in the order the model asked for them, as the server runs a step's calls.
        return calls[data.draw(st.integers(0, len(calls) - 1) | st.just(0))]

    def run_of(self, frame: Frame) -> int:
        if frame.call is not None:
            return frame.call.run
        session = self.sessions.get(frame.session_id)
        return -1 if session is None else session.run

    @invariant()
    def promises_kept(self) -> None:
        # Each with the trace of what led to it: the shrunk example is the regression test.
        assert not self.violations, "\n".join(self.violations)

    @invariant()
    def memory_bounded(self) -> None:
        for proc in self.processes():
            assert len(proc.monitor.sessions_view()) <= MAX_SESSIONS


def decisions_in(proc: Process, commands: list[Command] | tuple[Command, ...]) -> list[Intervene]:
    """The decisions the commands `Monitor` just returned carry out: each intervention begun
    (`Do`), or ended at once (its `Tell`: a block, a standby's loop)."""
    found = []
    for command in commands:
        if isinstance(command, Do):
            began = proc.monitor.lives.get(command.number)
            assert began is not None
            found.append(began.decision)
        elif isinstance(command, Tell):
            found.append(command.decision)
    return found


def said_of(decision: Intervene, part_id: str | None) -> str:
    return f"{decision.rule} {decision.plan} #{decision.prior_interventions + 1} at {part_id}"


class Draws:
    """Hypothesis's `data` for a sequence written out: each draw is the next value given."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> Any:
        return self.values.pop(0)


def draws(*values: object) -> st.DataObject:
    return cast(st.DataObject, Draws(*values))


def deliver_all(model: Model) -> None:
    for proc in model.processes():
        while proc.stream:
            model.deliver(draws(proc, len(proc.stream)))


def test_a_monitor_restarted_between_an_abort_and_its_calls_ends() -> None:
    """The window `ends_later` opens, written out: six identical appends in one step,
    refused and aborted, the feedback stored, the run idle and the feedback's run begun; the
    monitor restarts, then the six calls end in the abort's error. Before `late_frames` the
    new process read none of them back (they are before the feedback) and took their ends
    for a cycle of the feedback's run."""
    model = Model()
    model.ends_later = True
    model.prompt("ses_a", plugin=False)
    model.step("ses_a", [0] * 6)
    deliver_all(model)
    while model.acting.under_way:
        model.settle(draws(0, *[1] * 20))  # each command answered in turn, none failing
        deliver_all(model)
    model.finish_run("ses_a")
    model.restart()
    for _ in range(6):
        model.end_call("ses_a", draws(0))
    deliver_all(model)
    model.promises_kept()
    trace = model.trace
    assert trace.index("Post:#1") < trace.index("restart")
    ends = [t for t in trace[trace.index("restart") :] if t.endswith(":error")]
    assert len(ends) == 6 and all(t.startswith("2<") for t in ends)
    tracker = model.acting.tracker
    assert tracker.stray == {Step.LATE: 6}
    assert [(v.run_calls, v.interventions) for v in tracker.sessions_view()] == [(0, 1)]


def test_a_standby_that_took_over_answers_an_answered_doom_loop_request_once() -> None:
    """Found by the model at 20,000 examples: a standby whose stream lagged took the role and
    refused a `doom_loop` request the process before it had refused. The server takes one
    answer per request (404 to the next, NOTES.md): answered first, the standby's is no
    intervention (the model first let both count)."""
    model = Model()
    model.second_monitor()
    model.prompt("ses_b", plugin=False)
    model.takeover()
    model.restart()
    model.second_monitor()
    model.step("ses_b", [0, 0, 0])
    model.takeover()
    model.restart()
    model.second_monitor()
    model.prompt("ses_a", plugin=False)
    model.restart()
    model.step("ses_a", [0, 0, 0])
    model.prompt("ses_a", plugin=False)
    model.deliver(draws(model.acting, 4))
    model.end_call("ses_a", draws(0))
    model.settle(draws(0, 0, 1, 0, 0))
    model.takeover()
    model.deliver(draws(model.acting, 1))
    model.deliver(draws(model.acting, 6))
    model.settle(draws(0, 0, 1, 0, 0))
    model.promises_kept()
    assert "Answer:#1" in model.trace and len(model.answered) == 1


def test_a_question_that_overtook_a_whole_run_keeps_its_intervention_standing() -> None:
    """Found by the model at 3,000 x 100 (shrunk): in a session whose plugin asks, the stream
    lagged behind a run the feedback started and ended at once; the plugin asked about the
    next run's 3rd identical call first (refused: intervention 2). The idle of the run before
    then came on the stream and ended the run the question had begun, the standing
    intervention with it, and once the stream showed the step, its first call, which ran
    unasked, was held as a third. Now the question's intervention stands until the stream
    shows its step: the step's calls are that loop again."""
    model = Model()
    model.prompt("ses_b", plugin=False)
    model.deliver(draws(model.acting, 3))
    model.step("ses_b", [1, 0, 0, 1, 1, 0])
    model.end_call("ses_b", draws(5))
    model.prompt("ses_a", plugin=True)
    model.step("ses_a", [0, 0, 0])
    model.deliver(draws(model.acting, 14))
    model.end_call("ses_b", draws(0))
    model.settle(draws(0, 8, 1, 7, 2, 3, 0))
    model.settle(draws(0, 9, 3, 8))
    model.finish_run("ses_a")
    model.deliver(draws(model.acting, 7))
    model.finish_run("ses_a")
    model.prompt("ses_a", plugin=True)
    model.step("ses_a", [0, 0, 0])
    model.ask("ses_a", draws(2))
    model.deliver(draws(model.acting, 12))
    model.promises_kept()
    plans = [line.split(" at ")[0] for line in model.trace if line.startswith("ask:")]
    assert plans == ["ask:prt_20"]
    [session] = [v for v in model.acting.tracker.sessions_view() if v.session_id == "ses_a"]
    assert session.interventions == 2


def test_a_call_refused_in_band_ahead_of_a_run_end_on_the_stream_is_not_decided_again() -> None:
    """Found by the model at 3,000 x 100 (shrunk): the plugin asked about the next run's
    call while the stream was still in the run before, whose loop's intervention stood; the
    call was refused in band as that intervention's. The stream then carried the run's end,
    which made the asked call late, so its own part was a new call, its loop was decided
    again and, refused already, counted twice. A call asked about in a step the stream has
    not shown stays to be claimed by its part."""
    model = Model()
    model.prompt("ses_b", plugin=True)
    model.deliver(draws(model.acting, 3))
    model.step("ses_b", [0, 0, 0])
    model.deliver(draws(model.acting, 4))
    model.ask("ses_b", draws(0))
    model.end_call("ses_b", draws(0, 4))
    model.deliver(draws(model.acting, 1))
    model.prompt("ses_a", plugin=True)
    model.deliver(draws(model.acting, 2))
    model.step("ses_a", [1])
    model.deliver(draws(model.acting, 2))
    model.ask("ses_b", draws(0))
    model.ask("ses_a", draws(0))
    model.ask("ses_b", draws(0))
    model.end_call("ses_a", draws(0))
    model.deliver(draws(model.acting, 1))
    model.step("ses_a", [0, 0])
    model.end_call("ses_b", draws(0))
    model.deliver(draws(model.acting, 2))
    model.end_call("ses_b", draws(0))
    model.finish_run("ses_b")
    model.prompt("ses_b", plugin=False)
    model.step("ses_b", [0])
    model.ask("ses_b", draws(0))
    model.deliver(draws(model.acting, 6))
    model.deliver(draws(model.acting, 3))
    model.promises_kept()
    [session] = [v for v in model.acting.tracker.sessions_view() if v.session_id == "ses_b"]
    assert session.interventions == 1
    assert "ses_b" in {sid for sid, s in model.sessions.items() if s.plugin}


Model.TestCase.settings = settings(
    max_examples=1000,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMonitor = Model.TestCase
