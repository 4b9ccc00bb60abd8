"""The progress rules (no_progress, revisit, narration-aware text steps) and budgets, as tables
of cases; and their measured false alarms on the shared real corpus."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from monitor.core.budget import Budget, BudgetBook, BudgetReached, usage_of
from monitor.core.evaluate import ProgressSettings, run_progress, set_table
from monitor.core.rules.facts import CallFacts, changes_files, outcome_digest
from monitor.core.rules.no_progress import NoProgress
from monitor.core.rules.revisit import Revisit
from monitor.core.rules.text_steps import EchoedSteps
from monitor.core.tracker import Detection


def call(name: str, out: str = "FAILED test_x", tool: str = "bash") -> CallFacts:
    """`e...` names change files; the digest is the name, the outcome the output."""
    return CallFacts(
        tool, hash(name), outcome_digest("completed", out, None, {"exit": 1}), name.startswith("e")
    )


def first(rule: NoProgress | Revisit, calls: list[CallFacts]) -> int | None:
    for index, facts in enumerate(calls, 1):
        if rule.see(facts) is not None:
            return index
    return None


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        # edit, rerun the same check, same result, five times: caught on the 5th run
        ([call(f"e{i}") if i % 2 == 0 else call("test") for i in range(10)], 10),
        # the result changes after an edit: progress, never a loop
        ([call(f"e{i}") if i % 2 == 0 else call("test", f"{i} failed") for i in range(20)], None),
        # reruns with nothing changed in between are cycle's, not this rule's
        ([call("test")] * 12, None),
        # a silent success after every edit says nothing
        (
            [
                call(f"e{i}")
                if i % 2 == 0
                else CallFacts("bash", 1, outcome_digest("completed", "", None, {"exit": 0}), False)
                for i in range(20)
            ],
            None,
        ),
        # two checks in turn, each after edits, each unchanged: caught on the first one's 5th run
        ([c for i in range(6) for c in (call(f"e{i}"), call("test"), call("lint", "E1"))], 14),
    ],
)
def test_no_progress(calls: list[CallFacts], expected: int | None) -> None:
    assert first(NoProgress(repeats=5), calls) == expected


def view(n: int) -> CallFacts:
    return CallFacts("scroll_down", 7, outcome_digest("completed", f"view {n}", None, None), False)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        # paging through 14 views over and over: the 12th revisit comes at call 14 + 12
        ([view(i % 14) for i in range(60)], 26),
        # shuffled re-reading of 5 files
        ([call(f"r{(i * 3) % 5}", "text") for i in range(40)], 17),
        # reading 40 different things
        ([call(f"r{i}", "text") for i in range(40)], None),
        # re-reading after every edit: what was read may read differently
        ([c for i in range(30) for c in (call("rfile", "text"), call(f"e{i}"))], None),
    ],
)
def test_revisit(calls: list[CallFacts], expected: int | None) -> None:
    assert first(Revisit(window=16, revisits=12), calls) == expected


def test_narration_before_different_reads_is_not_a_repeated_step() -> None:
    echoes = EchoedSteps(steps=8)
    narration = hash("Let's look at the X method:")
    found = [echoes.text(narration) or echoes.call(call(f"r{i}", f"file {i}")) for i in range(15)]
    assert found == [None] * 15


def test_same_text_and_same_result_is_found_on_the_8th_step() -> None:
    echoes = EchoedSteps(steps=8)
    text = hash("I will try again.")
    found = [echoes.text(text) or echoes.call(call(f"c{i}", "not found")) for i in range(10)]
    assert [i for i, f in enumerate(found, 1) if f] == [8]


def test_text_only_steps_repeat_and_end_with_the_run() -> None:
    echoes = EchoedSteps(steps=3)
    assert [echoes.text(5), echoes.text(5), echoes.text(5)] == [None, None, None]
    assert echoes.end() is not None


@pytest.mark.parametrize(
    ("tool", "command", "expected"),
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
def test_changes_files(tool: str, command: str | None, expected: bool) -> None:
    assert changes_files(tool, {"command": command}) is expected


def test_budget_counts_growth_per_message_and_rolls_up_the_tree() -> None:
    book = BudgetBook(run=Budget(steps=2), tree=Budget(tokens=250))
    book.session("child", "root")
    assert book.message("root", "m1", 100, 0.1) == []
    assert book.message("root", "m1", 120, 0.1) == []  # the same step, grown by 20
    assert book.message("child", "m2", 100, 0.1) == []
    assert book.message("child", "m3", 30, 0.0) == [
        BudgetReached("child", "root", "run", "steps", 2, 2),
        BudgetReached("child", "root", "tree", "tokens", 250, 250),
    ]
    assert book.message("child", "m4", 30, 0.0) == []  # each limit fires once
    book.end_run("child")
    assert book.message("child", "m5", 1, 0.0) == []


def test_usage_of_sums_every_kind_of_token() -> None:
    info = {
        "role": "assistant",
        "sessionID": "s",
        "id": "m",
        "cost": 0.5,
        "tokens": {"input": 1, "output": 2, "reasoning": 3, "cache": {"read": 4, "write": 5}},
    }
    assert usage_of(info) == ("s", "m", 15, 0.5)
    assert usage_of({**info, "role": "user"}) is None


# --- the shared real corpus -----------------------------------------------------------------

# ../shared beside the repository (CI, /work/main), or beside the worktrees' folder.
_ROOT = Path(__file__).resolve().parents[1]
SHARED = (
    next(
        (
            p
            for p in (_ROOT.parent / "shared", _ROOT.parent.parent / "shared")
            if (p / "realtraj" / "corpus.tar.xz").is_file()
        ),
        _ROOT.parent / "shared",
    )
    / "realtraj"
    / "corpus.tar.xz"
)
CACHE = Path("/tmp/olm-realtraj-cache")


@pytest.fixture(scope="module")
def corpus() -> Path:
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is absent")
    root = CACHE / f"corpus-{SHARED.stat().st_size}"
    if not (root / "corpus" / "sets.json").is_file():
        with tarfile.open(SHARED) as archive:
            archive.extractall(root, filter="data")
    return root / "corpus"


def test_defaults_fire_on_no_silent_success_and_at_most_2_resolved_runs(corpus: Path) -> None:
    from monitor.shell.evaluate import cached_run

    sets = json.loads((corpus / "sets.json").read_text())
    fired = {}
    for name in [*sets["silent_success"], *sets["gemini_resolved"], *sets["known_loops"]]:
        tracked, steps = cached_run(corpus / name, Detection(), CACHE / "runs")
        fired[name] = {**tracked, **run_progress(steps, ProgressSettings())}
    rules = [
        "cycle",
        "failure",
        "wait",
        "text_repeat",
        "text_steps",
        "no_progress",
        "revisit",
        "text_steps_echo",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in set_table(fired, sets, rules, rules)}
    # known_loops, same_error (not replayed here), silent_success, gemini_resolved
    assert rows["together"][:4] == ["48", "0", "0", "1"]
    assert rows["revisit"][:4] == ["12", "0", "0", "0"]
    assert rows["no_progress"][:4] == ["0", "0", "0", "0"]


def test_outcome_masks_the_line_counter_of_a_long_lived_bash() -> None:
    # SWE-agent's shell numbers its lines: the same failing check, run after each edit
    # (doubao jackson-databind-4320), must read as the same outcome
    def run(line: int) -> int:
        return outcome_digest("completed", f"/bin/bash: line {line}: javac: not found", None, None)

    assert run(36191) == run(36254)
    assert outcome_digest("completed", "x.py line 3: E1", None, None) != outcome_digest(
        "completed", "x.py line 4: E1", None, None
    )


# --- written regression traces (tests/corpus/progress), replayed here until the rules are wired
# into the tracker; then they move up to tests/corpus and `evaluate` replays them

PROGRESS_CORPUS = Path(__file__).parent / "corpus" / "progress"


def first_firing(path: Path) -> tuple[str, int] | None:
    """The first rule (tracker's or progress) to fire on a written trace, and where; the
    tracker's `text_steps` is left out, as `text_steps_echo` replaces it."""
    from monitor.shell.evaluate import replay_frames

    lines = path.read_text("utf-8").splitlines()
    frames = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    tracked, steps = replay_frames(path.name, frames, Detection())
    fired = {**tracked, **run_progress(steps, ProgressSettings())}
    firings = sorted(
        (positions[0], rule)
        for rule, positions in fired.items()
        if positions and rule != "text_steps"
    )
    return (firings[0][1], firings[0][0]) if firings else None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("edit-rerun-same-result.sse", ("no_progress", 10)),
        ("edit-rerun-bash-counter.sse", ("no_progress", 10)),
        ("test-edit-test-progress.sse", None),
        ("paging-cycle-14.sse", ("revisit", 26)),
        ("paging-cycle-17.sse", ("revisit", 29)),
        ("shuffled-reread.sse", ("revisit", 17)),
        ("narrated-different-reads.text-legit.sse", None),
    ],
)
def test_written_progress_traces(name: str, expected: tuple[str, int] | None) -> None:
    from monitor.core.evaluate import parse_label

    path = PROGRESS_CORPUS / name
    label = parse_label(path.read_text("utf-8").splitlines()[0])
    assert first_firing(path) == expected
    # the label says the same as the table above
    assert label.loop_at == (None if expected is None else expected[1])


def test_every_written_progress_trace_is_in_the_table() -> None:
    names = {p.name for p in PROGRESS_CORPUS.glob("*.sse")}
    assert len(names) == 7


def test_the_old_text_steps_takes_narration_for_a_loop() -> None:
    """What `text_steps_echo` fixes: the tracker's rule fires on the narrated legit trace."""
    from monitor.shell.evaluate import replay_frames

    lines = (PROGRESS_CORPUS / "narrated-different-reads.text-legit.sse").read_text().splitlines()
    frames = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    tracked, _ = replay_frames("narrated", frames, Detection())
    assert tracked == {"text_steps": [7]}
