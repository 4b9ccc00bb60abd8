"""The progress rules (no_progress, revisit, text_steps with outcomes) and budgets, through the
tracker as the stream feeds it; and their measured false alarms on the shared real corpus."""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from monitor.config import load_settings
from monitor.core.budget import Budget
from monitor.core.events import MessageUsage, parse_event
from monitor.core.rules.facts import changes_files
from monitor.core.session import outcome_digest
from monitor.core.tracker import Detection, Tracker
from tests.frames_factory import SHARED_PLACES as _PLACES
from tests.frames_factory import call as call_frames
from tests.frames_factory import envelope, idle, usage

SES = "ses_progress"
# Only the rule under test: `cycle` and `failure` stay on (they cannot be off), out of reach.
ONLY = Detection(failure_repeats=0, text_steps=0, text_repeats=0)
_parts = iter(range(1, 10**6))


def bash(command: str, output: str = "FAILED test_x", exit: int = 1) -> list[dict]:
    part = f"prt_{next(_parts)}"
    frames = call_frames(SES, part, "bash", {"command": command}, output)
    frames[-1]["properties"]["part"]["state"]["metadata"] = {"exit": exit}
    return frames


def tool(name: str, args: dict[str, Any], output: str) -> list[dict]:
    return call_frames(SES, f"prt_{next(_parts)}", name, args, output)


def edit(n: int) -> list[dict]:
    return tool(
        "edit", {"filePath": "calc.py", "oldString": f"v{n}", "newString": f"v{n + 1}"}, "ok"
    )


def text(words: str) -> list[dict]:
    part = f"prt_{next(_parts)}"
    body = {"id": part, "sessionID": SES, "messageID": "msg_1", "type": "text", "text": words}
    return [
        {
            "type": "message.part.updated",
            "properties": {"part": {**body, "time": {"start": 1, "end": 2}}},
        }
    ]


def first(tracker: Tracker, steps: list[list[dict]]) -> tuple[str, int] | None:
    """The first decision over `steps` (each a call or a text): its rule and the call count."""
    for frames in steps:
        for frame in frames:
            for decision in tracker.feed(frame).decisions:
                return decision.rule, decision.call_index
    return None


# -- no_progress -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # edit, rerun the same check, same result, five times: caught on the 5th run
        ([s for i in range(8) for s in (edit(i), bash("pytest"))], ("no_progress", 10)),
        # the durations differ, nothing else: the same result
        (
            [s for i in range(8) for s in (edit(i), bash("pytest", f"1 failed in 0.{i}1s"))],
            ("no_progress", 10),
        ),
        # the result changes after each edit: progress, never a loop
        ([s for i in range(10) for s in (edit(i), bash("pytest", f"{9 - i} failed"))], None),
        # a silent success after every edit says nothing
        ([s for i in range(10) for s in (edit(i), bash("pytest", "", 0))], None),
        # a bash command that writes is a change too
        (
            [s for i in range(8) for s in (bash(f"sed -i 's/{i}/x/' a.py", "", 0), bash("make"))],
            ("no_progress", 10),
        ),
        # two checks in turn, each after edits: caught on the first one's 5th run
        (
            [s for i in range(6) for s in (edit(i), bash("pytest"), bash("ruff .", "E1"))],
            ("no_progress", 14),
        ),
    ],
)
def test_no_progress(steps: list[list[dict]], expected: tuple[str, int] | None) -> None:
    assert first(Tracker(replace(ONLY, revisits=0)), steps) == expected


def fix(n: int) -> list[dict]:
    """A script that changes files, which no rule can tell from its command."""
    return bash(f"python fix_{n}.py", f"fixed {n}", 0)


def diff(additions: int) -> list[dict]:
    files = [{"file": "calc.py", "additions": additions, "deletions": 0}]
    return [{"type": "session.diff", "properties": {"sessionID": SES, "diff": files}}]


def test_no_progress_counts_a_new_session_diff_as_a_change() -> None:
    steps = [s for i in range(6) for s in (fix(i), diff(i + 1), bash("python check.py"))]
    assert first(Tracker(replace(ONLY, revisits=0)), steps) == ("no_progress", 10)
    # without the server's word, the fixes are not changes: plain reruns, no finding
    unsaid = [s for i in range(6) for s in (fix(i), bash("python check.py"))]
    assert first(Tracker(replace(ONLY, revisits=0)), unsaid) is None


def test_the_same_diff_again_is_no_change() -> None:
    steps = [s for i in range(6) for s in (fix(i), diff(1), bash("python check.py"))]
    assert first(Tracker(replace(ONLY, revisits=0)), steps) is None


def test_file_edited_is_a_change_for_the_runs_of_its_directory() -> None:
    tracker = Tracker(replace(ONLY, revisits=0))
    here = "/home/dev/project"
    edited = {"type": "file.edited", "properties": {"file": "a.py"}}

    def step(n: int, where: str) -> list[dict]:
        return [
            *(envelope(f, here) for f in fix(n)),
            envelope(edited, where),
            *(envelope(f, here) for f in bash("check")),
        ]

    assert first(tracker, [step(n, here) for n in range(6)]) == ("no_progress", 10)
    elsewhere = Tracker(replace(ONLY, revisits=0))
    assert first(elsewhere, [step(n, "/other") for n in range(6)]) is None


def test_the_outcome_masks_the_line_counter_of_a_long_lived_bash() -> None:
    # SWE-agent's shell numbers its lines: the same failing check, run after each edit
    # (doubao jackson-databind-4320), must read as the same outcome
    def run(line: int) -> int:
        return outcome_digest("completed", f"/bin/bash: line {line}: javac: not found", None, None)

    assert run(36191) == run(36254)
    assert outcome_digest("completed", "x.py line 3: E1", None, None) != outcome_digest(
        "completed", "x.py line 4: E1", None, None
    )


@pytest.mark.parametrize(
    ("name", "command", "expected"),
    [
        ("edit", None, True),
        ("bash", "sed -i 's/a/b/' x.py", True),
        ("bash", "cat <<'EOF' > t.py\nprint()\nEOF", True),
        ("bash", "python t.py 2>&1 > /dev/null", False),
        ("bash", "grep -n foo x.py 2>/dev/null", False),
        ("bash", "python reproduce.py", False),
        ("open", "open x.java", False),
    ],
)
def test_changes_files(name: str, command: str | None, expected: bool) -> None:
    assert changes_files(name, {"command": command}) is expected


# -- revisit ---------------------------------------------------------------------------------


def view(n: int) -> list[dict]:
    """The n-th view of one long file, paged 100 lines at a time."""
    return tool("read", {"filePath": "Big.java", "offset": 100 * n}, f"lines {100 * n}-")


# Five files read over and over, each round in another order: no block repeats back to back.
SHUFFLED = [f"r{k}" for order in ("01234", "31402", "24130", "40321", "13042") * 4 for k in order]


def read(name: str, output: str = "text") -> list[dict]:
    return tool("read", {"filePath": name}, output)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # paging through 14 views over and over: the 12th revisit comes at call 14 + 12
        ([view(i % 14) for i in range(60)], ("revisit", 26)),
        # shuffled re-reading of 5 files (cycle sees no block repeated back to back)
        ([read(name) for name in SHUFFLED], ("revisit", 17)),
        # reading 40 different things
        ([read(f"r{i}") for i in range(40)], None),
        # re-reading after every edit: what was read may read differently
        ([s for i in range(30) for s in (read("file"), edit(i))], None),
        # polling: the wait rule's, with its allowance
        ([bash("sleep 5 && gh run view 1", "status: queued", 0)] * 19, None),
    ],
)
def test_revisit(steps: list[list[dict]], expected: tuple[str, int] | None) -> None:
    assert first(Tracker(replace(ONLY, no_progress_runs=0)), steps) == expected


def test_revisit_names_its_tools_and_window() -> None:
    tracker = Tracker(replace(ONLY, no_progress_runs=0))
    decisions = [d for i in range(30) for f in view(i % 14) for d in tracker.feed(f).decisions]
    [decision] = decisions
    assert decision.finding.describe() == (
        "12 of the last 16 calls (read) brought back what was already seen"
    )
    assert "nothing has changed since" in decision.feedback


# -- text_steps ------------------------------------------------------------------------------

STEPS = replace(ONLY, text_steps=8, revisits=0, no_progress_runs=0)


def test_narration_before_different_reads_is_not_a_repeated_step() -> None:
    steps = [
        s for i in range(15) for s in (text("Let's look at the X method:"), read(f"f{i}", f"{i}"))
    ]
    assert first(Tracker(STEPS), steps) is None


def test_the_same_text_before_failures_is_found_at_the_8th_text() -> None:
    steps = [
        s for i in range(10) for s in (text("I will try again."), bash(f"ls n{i}", f"no n{i}", 2))
    ]
    assert first(Tracker(STEPS), steps) == ("text_steps", 7)


def test_text_only_steps_repeat() -> None:
    assert first(Tracker(STEPS), [text("Same.")] * 9) == ("text_steps", 0)


# -- budgets ---------------------------------------------------------------------------------


def session_info(session: str, parent: str) -> dict:
    info = {"id": session, "parentID": parent, "directory": "/p"}
    return envelope({"type": "session.created", "properties": {"info": info}}, "/p")


def test_message_usage_sums_every_kind_of_token() -> None:
    frame = usage("ses_a", "msg_1", 1)
    frame["payload"]["properties"]["info"]["tokens"] = {
        "input": 1,
        "output": 2,
        "reasoning": 3,
        "cache": {"read": 4, "write": 5},
    }
    assert parse_event(frame)[1] == MessageUsage("ses_a", "msg_1", 15, 0.0, "/p")


def test_a_run_budget_of_steps_stops_the_run_at_the_step_that_reaches_it() -> None:
    tracker = Tracker(Detection(run_budget=Budget(steps=3)))
    fed = [tracker.feed(usage("ses_a", f"msg_{n}", 10)) for n in (1, 1, 2, 3, 4)]
    [decision] = [d for f in fed for d in f.decisions]
    assert (decision.rule, decision.part_id) == ("budget", "msg_3")
    assert decision.finding.describe() == "the run's budget of 3 steps was reached (3 steps spent)"
    assert "Write a short summary" in decision.feedback
    tracker.feed(idle("ses_a"))  # a new run starts with a new budget
    assert [tracker.feed(usage("ses_a", f"msg_{n}", 1)).decisions for n in (5, 6)] == [(), ()]


def test_a_tree_budget_counts_the_subagents_growth_only() -> None:
    tracker = Tracker(Detection(tree_budget=Budget(tokens=250)))
    tracker.feed(session_info("ses_child", "ses_root"))
    assert tracker.feed(usage("ses_root", "msg_1", 100)).spent == ("/p", 100, 0.0)
    assert tracker.feed(usage("ses_root", "msg_1", 120)).spent == ("/p", 20, 0.0)  # grown by 20
    assert tracker.feed(usage("ses_child", "msg_2", 100)).decisions == ()
    [decision] = tracker.feed(usage("ses_child", "msg_3", 30)).decisions
    assert (decision.session_id, decision.finding.describe()) == (
        "ses_child",
        "the session tree's budget of 250 tokens was reached (250 tokens spent)",
    )
    assert tracker.feed(usage("ses_child", "msg_4", 30)).decisions == ()  # once


def test_budgets_are_off_by_default() -> None:
    tracker = Tracker()
    assert [tracker.feed(usage("ses_a", f"msg_{n}", 10**7, 100.0)).decisions for n in range(5)] == [
        ()
    ] * 5


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("steps=200", Budget(steps=200)),
        ("tokens=5000000, cost=2.5", Budget(tokens=5_000_000, cost=2.5)),
        ("off", Budget()),
    ],
)
def test_budget_setting(raw: str, expected: Budget) -> None:
    settings = load_settings({"url": "http://127.0.0.1:4096", "run_budget": raw}, {}, isatty=False)
    assert settings.run_budget == expected


@pytest.mark.parametrize("raw", ["steps=0", "cost=-1", "cost=nan", "minutes=3", "200"])
def test_a_bad_budget_is_refused_with_the_form_it_takes(raw: str) -> None:
    from monitor.errors import ConfigError

    with pytest.raises(ConfigError, match="steps=N,tokens=N,cost=USD"):
        load_settings({"url": "http://127.0.0.1:4096", "tree_budget": raw}, {}, isatty=False)


# -- the shared real corpus ------------------------------------------------------------------

SHARED = (
    next((p for p in _PLACES if (p / "realtraj" / "corpus.tar.xz").is_file()), _PLACES[0])
    / "realtraj"
    / "corpus.tar.xz"
)
CACHE = Path("/tmp/olm-realtraj-cache")


@pytest.fixture(scope="module")
def corpus() -> Path:
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is absent (set OLM_SHARED_DIR to the folder holding realtraj/)")
    root = CACHE / f"corpus-{SHARED.stat().st_size}"
    if not (root / "corpus" / "sets.json").is_file():
        with tarfile.open(SHARED) as archive:
            archive.extractall(root, filter="data")
    return root / "corpus"


def test_defaults_fire_on_no_silent_success_and_at_most_2_resolved_runs(corpus: Path) -> None:
    from monitor.core.evaluate import set_table
    from monitor.shell.evaluate import replay_run

    sets = json.loads((corpus / "sets.json").read_text())
    names = [*sets["silent_success"], *sets["gemini_resolved"], *sets["known_loops"]]
    fired = {name: replay_run(corpus / name, Detection()) for name in names}
    rules = ["cycle", "failure", "wait", "text_repeat", "text_steps", "no_progress", "revisit"]
    rows = {line.split()[0]: line.split()[1:] for line in set_table(fired, sets, rules, rules)}
    # known_loops, same_error (not replayed here), silent_success, gemini_resolved
    assert rows["together"][:4] == ["48", "0", "0", "1"]
    assert rows["no_progress"][2:4] == ["0", "0"]
    assert rows["revisit"][2:4] == ["0", "0"]
    assert rows["text_steps"][2:4] == ["0", "0"]
