"""Loop rules, one module each, behind one small interface.

A rule is an object made from the settings (`Detection`) that the tracker hands, for one
session, every call as it is recorded or finishes (`CallRule.call`) or every finished text or
reasoning part (`TextRule.text`); it answers with a finding (monitor/core/findings.py) or None.
The tracker dispatches over its list of rules in order and acts on the first finding; after an
intervention, and when a run ends, every rule's state starts over.

What a rule sees:

- `session` (monitor/core/session.py): the run's history (`session.block(n)`,
  `session.last_tools(n)`, `session.history_length()`), how many calls the run made
  (`session.calls - session.run_start`), and its own running state, kept under its name with
  `session.state(name, make)` (made on first use, dropped when the run ends: a rule keeps no
  state of its own across sessions);
- `call` (`session.Call`): `tool`, `digest` (the call's identity after the tool profile, the
  same the permission gate uses), `part_id`, `status` ("running", "completed", "error"),
  `args` (the arguments after the profile) and, once it finished, `outcome` (a digest of its
  output, error and exit status);
- `recorded`: this update is the call's first that counts (at `running`, or at its final
  update in `input+output` mode, or when its `running` was missed); `finished`: this update
  brings its outcome (taken once per call). Both can be true at once. Neither: a `running`
  update re-sent for a call already recorded (bash re-sends one each time its output grows,
  in `input` mode), its `state.metadata` in `call.metadata`.

A rule says which updates it reads (`reads_recorded`, `reads_finished`, `reads_running`); the
tracker asks it only about those, so a `running` update costs nothing in the rules that wait
for outcomes, and a re-sent one nothing in the rules that do not read them.

A next rule is one module here with a class that follows `CallRule` or `TextRule`, made from
its own settings; one field of `Detection`, one finding class (monitor/core/findings.py), and
one line in `rules_of` (monitor/core/detection.py) that makes it from that field, or leaves it
out when the setting turns it off.
"""

from __future__ import annotations

from typing import Protocol

from monitor.core.events import TextPart
from monitor.core.findings import Finding
from monitor.core.session import Call, SessionRecord

__all__ = ["CallRule", "TextRule"]


class CallRule(Protocol):
    """A rule over a session's tool calls."""

    reads_recorded: bool  # asked about an update that records its call
    reads_finished: bool  # asked about an update that brings its call's outcome
    reads_running: bool  # asked about a `running` update re-sent for a recorded call

    def call(
        self, session: SessionRecord, call: Call, recorded: bool, finished: bool
    ) -> Finding | None:
        """What this update of `call` completes, if anything."""
        ...


class TextRule(Protocol):
    """A rule over a session's finished text and reasoning parts."""

    def text(self, session: SessionRecord, part: TextPart) -> Finding | None:
        """What this finished part completes, if anything."""
        ...
