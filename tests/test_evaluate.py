"""The evaluation over the corpus (tests/corpus): every loop caught at its labelled call, no
legitimate trace stopped; and the seed rule set, reachable by one setting, as it was."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest

from monitor.config import detection_of, load_settings
from monitor.core.evaluate import Label, LabelError, Result, parse_label
from monitor.core.rules.cycle import Cycle
from monitor.core.tracker import SEED, Detection, Tracker
from monitor.errors import ConfigError
from monitor.shell.evaluate import evaluate_paths
from tests.frames_factory import call, feed_all

CORPUS = Path(__file__).parent / "corpus"

EXPECTED = """code-block.text-legit.sse                        legit        -                  ok
different-lines.text-legit.sse                   legit        -                  ok
edit-rerun-bash-counter.sse                      loop at 10   no_progress at 10  caught
edit-rerun-same-result.sse                       loop at 10   no_progress at 10  caught
failure-rewritten-command.sse                    loop at 4    failure at 4       caught
narrated-different-reads.text-legit.sse          legit        -                  ok
narrated-steps.text-legit.sse                    legit        -                  ok
numbered-list.text-legit.sse                     legit        -                  ok
one-line-repeated.text-loop.sse                  loop at 29   text_repeat at 29  caught
paging-cycle-14.sse                              loop at 26   revisit at 26      caught
paging-cycle-17.sse                              loop at 29   revisit at 29      caught
paragraph-repeated.text-loop.sse                 loop at 72   text_repeat at 72  caught
polling-forever.sse                              loop at 20   wait at 20         caught
polling-until-done.sse                           legit        -                  ok
reads-of-different-files.sse                     legit        -                  ok
reasoning-repeated.text-loop.sse                 loop at 33   text_repeat at 33  caught
relabelled-retry.sse                             loop at 4    cycle at 4         caught
retry-between-todo-updates.sse                   loop at 4    cycle at 4         caught
routine-over-files.sse                           legit        -                  ok
routine-same-file.sse                            loop at 15   cycle at 15        caught
same-text-every-step.text-loop.sse               loop at 8    text_steps at 8    caught
shuffled-reread.sse                              loop at 17   revisit at 17      caught
table.text-legit.sse                             legit        -                  ok
test-edit-test-progress.sse                      legit        -                  ok
tests-after-distinct-edits.sse                   legit        -                  ok
w-circles-empty-finds.sse                        loop at 11   circles at 11      caught
w-circles-missing-symbol.sse                     loop at 12   circles at 12      caught
w-circles-same-filter.sse                        loop at 7    circles at 7       caught
w-cycle-of-6.sse                                 loop at 18   cycle at 18        caught
w-cycle-of-8.sse                                 loop at 20   revisit at 20      caught
w-failure-edit-old-string-not-found.sse          loop at 4    failure at 4       caught
w-failure-line-numbers-change.sse                loop at 4    failure at 4       caught
w-failure-same-error-prose-commands.sse          loop at 4    failure at 4       caught
w-failure-tool-error-state.sse                   loop at 4    failure at 4       caught
w-identical-read.sse                             loop at 4    cycle at 4         caught
w-legit-batch-edits.sse                          legit        -                  ok
w-legit-ci-polling.sse                           legit        -                  ok
w-legit-debug-script-while-tests-move.sse        legit        -                  ok
w-legit-different-failures.sse                   legit        -                  ok
w-legit-distinct-edits-same-check.sse            legit        -                  ok
w-legit-health-and-log-in-turn.sse               legit        -                  ok
w-legit-interrupt-after-launches.sse             legit        -                  ok
w-legit-list-in-one-file.sse                     legit        -                  ok
w-legit-long-streams.sse                         legit        -                  ok
w-legit-many-reads.sse                           legit        -                  ok
w-legit-refused-changes-between-checks.sse       legit        -                  ok
w-legit-routine-of-6-over-modules.sse            legit        -                  ok
w-legit-same-description-different-commands.sse  legit        -                  ok
w-legit-silent-successes.sse                     legit        -                  ok
w-legit-six-misses-then-found.sse                legit        -                  ok
w-legit-status-answered-in-progress.sse          legit        -                  ok
w-legit-three-failures-then-fix.sse              legit        -                  ok
w-legit-todo-between-different-reads.sse         legit        -                  ok
w-legit-wait-for-server.sse                      legit        -                  ok
w-no-progress-debugger-quit.sse                  loop at 14   no_progress at 14  caught
w-no-progress-failures-between-edits.sse         loop at 10   no_progress at 10  caught
w-no-progress-lines-rewritten-in-turn.sse        loop at 12   no_progress at 12  caught
w-no-progress-rewrites-own-change.sse            loop at 10   no_progress at 10  caught
w-pair-cycle.sse                                 loop at 6    cycle at 6         caught
w-relabelled-task.sse                            loop at 4    cycle at 4         caught
w-revisit-creeping-read.sse                      loop at 4    revisit at 4       caught
w-runaway-while-true.sse                         loop at 2    runaway at 2       caught
w-timeout-raised-each-retry.sse                  loop at 4    cycle at 4         caught
w-todo-between-identical-reads.sse               loop at 4    cycle at 4         caught
w-wait-never-ends.sse                            loop at 20   wait at 20         caught
w-wait-same-failure.sse                          loop at 4    failure at 4       caught
wait-same-failure.sse                            loop at 4    failure at 4       caught

rule         caught  early   late  false alarms  where
cycle             9      0      0             0  4, 4, 15, 18, 4, 6, 4, 4, 4
failure           7      0      0             0  4, 4, 4, 4, 4, 4, 4
wait              2      0      0             0  20, 20
text_repeat       3      0      0             0  29, 72, 33
text_steps        1      0      0             0  8
no_progress       6      0      0             0  10, 10, 14, 10, 12, 10
revisit           5      0      0             0  26, 29, 17, 20, 4
circles           3      0      0             0  11, 12, 7
runaway           1      0      0             0  2
budget            0      0      0             0  -
tree              0      0      0             0  -
doom_loop         0      0      0             0  -
total: 37 loops, 37 caught at the labelled call, 0 early or late, 0 missed; 30 legit, 0 false alarms
"""

SEED_TOTAL = (
    "total: 37 loops, 4 caught at the labelled call, 2 early or late, 31 missed; "
    "30 legit, 5 false alarms"
)


def test_corpus_table_with_the_defaults():
    out = io.StringIO()
    assert evaluate_paths([str(CORPUS)], Detection(), out=out, err=io.StringIO()) == 0
    assert out.getvalue() == EXPECTED


def test_corpus_with_the_seed_rules_misses_and_misfires():
    out = io.StringIO()
    assert evaluate_paths([str(CORPUS)], SEED, out=out, err=io.StringIO()) == 1
    assert out.getvalue().splitlines()[-1] == SEED_TOTAL


def test_corpus_has_both_sides_and_recordings():
    traces = sorted(CORPUS.glob("*.sse"))
    labels = [parse_label(path.open().readline()) for path in traces]
    assert len(traces) >= 30
    assert sum(label.loop_at is None for label in labels) == 30
    # Recorded from the real server: 10 tool traces, 9 text traces; and 7 progress traces.
    assert sum(not path.name.startswith("w-") for path in traces) == 26


def test_unlabelled_trace_is_a_usage_error(tmp_path):
    (tmp_path / "x.sse").write_text("data: {}\n\n")
    err, out = io.StringIO(), io.StringIO()
    assert evaluate_paths([str(tmp_path)], Detection(), out=out, err=err) == 2
    assert "no label" in err.getvalue()
    assert out.getvalue() == ""  # no empty table under the error


@pytest.mark.parametrize(
    ("line", "label"),
    [(": expect legit", Label(None)), (": expect loop at 12", Label(12))],
)
def test_labels(line, label):
    assert parse_label(line) == label


def test_bad_label():
    with pytest.raises(LabelError):
        parse_label(": expect a loop")


def test_verdicts():
    assert Result("a", Label(4), "cycle", 4).verdict == "caught"
    assert Result("a", Label(4), "cycle", 3).verdict == "early"
    assert Result("a", Label(4), "cycle", 5).verdict == "late"
    assert Result("a", Label(4)).verdict == "missed"
    assert Result("a", Label(None), "wait", 9).verdict == "false alarm"
    assert Result("a", Label(None)).verdict == "ok"


# -- the seed rule set ------------------------------------------------------------------------


def test_rules_seed_setting_gives_the_seed_detection():
    settings = load_settings({"rules": "seed"}, {}, isatty=False)
    assert detection_of(settings) == replace(SEED, ignore_args={})
    assert (SEED.max_period, SEED.repeats, SEED.failure_repeats, SEED.wait_calls) == (4, 3, 0, 0)
    assert SEED.profile == "none"


def test_rules_seed_keeps_the_settings_it_does_not_fix():
    flags = {"rules": "seed", "max_sessions": "7", "on_loop": "hold", "history": "40"}
    detection = detection_of(load_settings(flags, {}, isatty=False))
    assert (detection.max_sessions, detection.on_loop, detection.history) == (7, "hold", 40)
    assert (detection.max_period, detection.text_repeats) == (4, 0)


def test_rules_seed_refuses_settings_it_fixes():
    with pytest.raises(ConfigError, match="max_period in --max-period: cannot be combined"):
        load_settings({"rules": "seed", "max_period": "6"}, {}, isatty=False)


def seed_run(letters: str, detection: Detection) -> list[tuple[int, Cycle]]:
    frames = []
    for n, letter in enumerate(letters):
        frames += call("s", f"p{n}", "read", {"filePath": letter})
    return [
        (d.call_index, Cycle(*d.finding.shape()[:2])) for d in feed_all(Tracker(detection), frames)
    ][:1]


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ("AAAAAAAA", [(4, Cycle(1, 4))]),
        ("ABABABAB", [(6, Cycle(2, 3))]),
        ("ABCABCABCABC", [(9, Cycle(3, 3))]),
        ("ABCDABCDABCDABCD", [(12, Cycle(4, 3))]),
        ("ABCABCAB", []),
        ("AAA", []),
        ("ABABA", []),
        ("ABCDEABCDEABCDE", []),
        ("XYZAAAA", [(7, Cycle(1, 4))]),
        ("ABAB" + "CDCDCD", [(10, Cycle(2, 3))]),
    ],
)
def test_seed_cases_through_the_tracker(calls, expected):
    assert seed_run(calls, SEED) == expected


def test_default_rules_catch_the_period_5_seed_case():
    assert seed_run("ABCDEABCDEABCDE", Detection()) == [(15, Cycle(5, 3))]


def test_seed_rules_ignore_failures_and_labels():
    frames = []
    for n in range(6):
        frames += call("s", f"p{n}", "bash", {"command": f"ls x{n}", "description": "d"})
    assert feed_all(Tracker(SEED), frames) == []


def test_evaluate_command(capsys):
    from monitor.cli import main

    assert main(["evaluate", str(CORPUS)]) == 0
    assert capsys.readouterr().out == EXPECTED
    assert main(["evaluate", "--rules", "seed", str(CORPUS)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == SEED_TOTAL
