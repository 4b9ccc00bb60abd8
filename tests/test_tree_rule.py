"""Rule `tree` (issue 31, "Subagent trees"): a subagent session too deep, or one child too
many of one parent in one run, stops the tree at its root, once; through the tracker as the
stream feeds it (`session.created` / `session.updated` with `info.parentID`)."""

from __future__ import annotations

import pytest

from monitor.config import detection_of, load_settings
from monitor.core.decisions import Plan
from monitor.core.findings import Rule, TreeShape
from monitor.core.limits import DetectionError
from monitor.core.tracker import Detection, Tracker
from monitor.errors import ConfigError
from tests.frames_factory import envelope, feed_all, idle, subagent

ROOT = "ses_root"


def chain(tracker: Tracker, levels: int, top: str = ROOT, prefix: str = "ses_d") -> list:
    """Sessions `{prefix}1` (a child of `top`) to `{prefix}{levels}`, each the child of the one
    before: every decision, in order."""
    frames = [
        subagent(f"{prefix}{n}", top if n == 1 else f"{prefix}{n - 1}")
        for n in range(1, levels + 1)
    ]
    return feed_all(tracker, frames)


def children(tracker: Tracker, count: int, parent: str = ROOT, first: int = 1) -> list:
    frames = [subagent(f"ses_c{n}", parent) for n in range(first, first + count)]
    return feed_all(tracker, frames)


# -- depth -----------------------------------------------------------------------------------


def test_depth_three_is_not_flagged() -> None:
    assert chain(Tracker(), 3) == []


def test_the_fourth_level_stops_the_tree_at_its_root() -> None:
    tracker = Tracker()
    assert chain(tracker, 3) == []
    [decision] = tracker.feed(subagent("ses_d4", "ses_d3")).decisions
    assert decision.session_id == ROOT  # the root, not the child that tripped it
    assert decision.finding == TreeShape("depth", 4, 3, "ses_d4", "ses_d3")
    assert decision.finding.rule is Rule.TREE and decision.finding.rule == "tree"
    assert decision.part_id == "ses_d4"  # found on that child's appearance
    assert decision.finding.describe() == (
        "subagent session ses_d4 is at depth 4 (more than 3 levels of subagents)"
    )
    assert decision.feedback.startswith(
        "Automatic notice: your run was stopped because your subagents ran "
        "away: subagent session ses_d4 is at depth 4 (more than 3 levels of subagents)."
    )
    assert "Do not start more subagents" in decision.feedback
    assert decision.directory == "/p"


def test_the_root_is_stopped_not_blocked_or_nudged() -> None:
    """The root waits on its subagents' `task` call: no next call to refuse, no next step."""
    for first in ("block", "nudge", "stop"):
        tracker = Tracker(Detection(first_action=first))
        [decision] = chain(tracker, 4)
        assert decision.plan is Plan.STOP, first
    held = Tracker(Detection(on_loop="hold"))
    [decision] = chain(held, 4)
    assert decision.plan is Plan.HOLD


def test_a_child_first_seen_in_session_updated_counts_and_its_updates_do_not_again() -> None:
    tracker = Tracker()
    frames = [
        subagent(f"ses_d{n}", ROOT if n == 1 else f"ses_d{n - 1}", "session.updated")
        for n in range(1, 4)
    ]
    assert feed_all(tracker, frames * 3) == []  # the same sessions updated: nothing new
    [decision] = tracker.feed(subagent("ses_d4", "ses_d3", "session.updated")).decisions
    assert (decision.session_id, decision.finding.count) == (ROOT, 4)


def test_depth_is_counted_from_the_tree_s_root_whatever_the_depth_setting() -> None:
    tracker = Tracker(Detection(tree_depth=1))
    assert chain(tracker, 1) == []
    [decision] = tracker.feed(subagent("ses_d2", "ses_d1")).decisions
    assert decision.session_id == ROOT
    assert decision.finding.describe() == (
        "subagent session ses_d2 is at depth 2 (more than 1 levels of subagents)"
    )


# -- fan-out ---------------------------------------------------------------------------------


def test_twenty_children_are_fine_the_21st_stops_the_tree() -> None:
    tracker = Tracker()
    assert children(tracker, 20) == []
    [decision] = tracker.feed(subagent("ses_c21", ROOT)).decisions
    assert decision.session_id == ROOT
    assert decision.part_id == "ses_c21"
    assert decision.finding == TreeShape("fanout", 21, 20, "ses_c21", ROOT)
    assert decision.finding.describe() == (
        "session ses_root started 21 children in one run (more than 20 subagent sessions), "
        "the last ses_c21"
    )
    assert "your subagents ran away: session ses_root started 21 children" in decision.feedback


def test_a_subagent_s_own_fan_out_stops_the_tree_at_its_root() -> None:
    tracker = Tracker()
    assert chain(tracker, 1) == []
    assert children(tracker, 20, parent="ses_d1") == []
    [decision] = tracker.feed(subagent("ses_c21", "ses_d1")).decisions
    assert decision.session_id == ROOT
    assert (decision.finding.parent, decision.finding.child) == ("ses_d1", "ses_c21")


def test_children_of_different_parents_do_not_add_up() -> None:
    tracker = Tracker()
    assert chain(tracker, 1) == []
    assert children(tracker, 15) == []
    assert children(tracker, 15, parent="ses_d1", first=100) == []


def test_a_new_run_of_the_parent_starts_its_fan_out_over() -> None:
    tracker = Tracker()
    assert children(tracker, 20) == []
    tracker.feed(envelope(idle(ROOT), "/p"))
    assert children(tracker, 20, first=21) == []
    [decision] = tracker.feed(subagent("ses_c41", ROOT)).decisions
    assert (decision.session_id, decision.finding.count) == (ROOT, 21)


# -- off -------------------------------------------------------------------------------------


def test_tree_depth_0_turns_depth_off_only() -> None:
    tracker = Tracker(Detection(tree_depth=0))
    assert chain(tracker, 40, top="ses_deep") == []
    assert children(tracker, 20) == []
    [decision] = children(tracker, 1, first=21)
    assert decision.finding.measure == "fanout"


def test_tree_fanout_0_turns_fan_out_off_only() -> None:
    tracker = Tracker(Detection(tree_fanout=0))
    assert children(tracker, 500) == []
    [decision] = chain(tracker, 4)
    assert decision.finding.measure == "depth"


def test_both_at_0_and_the_seed_rules_leave_trees_alone() -> None:
    for detection in (Detection(tree_depth=0, tree_fanout=0), _seeded()):
        tracker = Tracker(detection)
        assert chain(tracker, 40) == []
        assert children(tracker, 100) == []


def _seeded() -> Detection:
    settings = load_settings({"url": "http://127.0.0.1:4096", "rules": "seed"}, {}, isatty=False)
    return detection_of(settings)


# -- one intervention for the tree -----------------------------------------------------------


def test_one_intervention_for_the_tree_while_it_is_under_way() -> None:
    tracker = Tracker()
    [decision] = chain(tracker, 10)  # the 4th level trips it; the 5th to the 10th do not again
    assert decision.finding.child == "ses_d4"
    assert children(tracker, 30) == []  # a fan-out trip in the same tree: not a second one
    assert children(tracker, 30, parent="ses_d2", first=100) == []
    assert tracker.interventions(ROOT) == 1


def test_the_tree_trips_again_after_its_root_s_run_ended() -> None:
    tracker = Tracker()
    [first] = chain(tracker, 4)
    tracker.feed(envelope(idle(ROOT), "/p"))
    [second] = tracker.feed(subagent("ses_d5", "ses_d4")).decisions
    assert (second.session_id, second.finding.count) == (ROOT, 5)
    assert (first.prior_interventions, second.prior_interventions) == (0, 1)


def test_another_tree_is_not_held_back_by_the_first() -> None:
    tracker = Tracker()
    [first] = chain(tracker, 4)
    [other] = chain(tracker, 4, top="ses_other", prefix="ses_o")
    assert (first.session_id, other.session_id) == (ROOT, "ses_other")


def test_a_book_too_small_for_the_tree_forgets_it_and_never_raises() -> None:
    """`max_sessions` 1: each account pushes the one before out (the child's, the parent's
    count): what is forgotten is not counted, and nothing fails."""
    tracker = Tracker(Detection(max_sessions=1, tree_depth=1, tree_fanout=1))
    frames = [subagent("ses_a", ROOT), subagent("ses_b", ROOT), subagent("ses_c", "ses_b")]
    assert feed_all(tracker, frames) == []


def test_a_cycle_of_parents_is_cut() -> None:
    tracker = Tracker(Detection(tree_depth=1))
    frames = [subagent("ses_x", "ses_y"), subagent("ses_y", "ses_z"), subagent("ses_z", "ses_x")]
    decisions = feed_all(tracker, frames)
    # ses_z's ancestors: ses_x, ses_y, and ses_z again, where the walk stops.
    assert [(d.session_id, d.finding.measure, d.finding.count) for d in decisions] == [
        ("ses_y", "depth", 2)
    ]


def test_sessions_without_a_parent_are_never_a_tree_finding() -> None:
    tracker = Tracker(Detection(tree_depth=1, tree_fanout=1))
    frames = [
        envelope({"type": "session.created", "properties": {"info": {"id": f"ses_{n}"}}}, "/p")
        for n in range(50)
    ]
    assert feed_all(tracker, frames) == []


# -- settings --------------------------------------------------------------------------------


def test_defaults() -> None:
    assert (Detection().tree_depth, Detection().tree_fanout) == (3, 20)


@pytest.mark.parametrize("field", ["tree_depth", "tree_fanout"])
def test_a_negative_limit_is_refused(field: str) -> None:
    with pytest.raises(DetectionError, match=f"{field} must be at least 0"):
        Detection(**{field: -1})


@pytest.mark.parametrize(
    ("field", "raw", "expected"), [("tree_depth", "5", 5), ("tree_fanout", "0", 0)]
)
def test_the_settings_reach_the_detection(field: str, raw: str, expected: int) -> None:
    settings = load_settings({"url": "http://127.0.0.1:4096", field: raw}, {}, isatty=False)
    assert getattr(detection_of(settings), field) == expected


@pytest.mark.parametrize("raw", ["-1", "x"])
def test_a_bad_setting_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="tree_depth in --tree-depth: expected 0 \\(off\\)"):
        load_settings({"url": "http://127.0.0.1:4096", "tree_depth": raw}, {}, isatty=False)
