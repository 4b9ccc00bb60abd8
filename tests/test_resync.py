"""Resync planning: given what the server says is busy, which runs end and which are read back."""

from monitor.core.resync import ResyncPlan, directories_to_ask, plan_resync


def test_runs_the_server_no_longer_calls_busy_end_and_busy_ones_are_read_back():
    plan = plan_resync(
        busy={"a": "/asked", "new": "/asked"},
        known={"a": "/stream", "gone": "/stream", "quiet": None},
        follows=None,
        acting_on=[],
    )
    # `a` lives where the stream said; `new` where it was found busy.
    assert plan == ResyncPlan(
        end_runs=("gone", "quiet"), read_back=(("a", "/stream"), ("new", "/asked"))
    )


def test_a_session_being_acted_on_is_not_read_back():
    plan = plan_resync(busy={"a": None, "b": None}, known={}, follows=None, acting_on=["a"])
    assert plan.read_back == (("b", None),)


def test_attach_reads_back_only_the_followed_session():
    plan = plan_resync(
        busy={"a": "/p", "b": "/p"}, known={"a": "/p", "b": "/p"}, follows={"b"}, acting_on=[]
    )
    assert plan == ResyncPlan(end_runs=(), read_back=(("b", "/p"),))


def test_every_directory_of_a_run_is_asked_and_the_configured_one_too():
    assert directories_to_ask({"a": "/x", "b": "/y", "c": "/x"}, None) == {"/x", "/y", None}
    assert directories_to_ask({}, "/proj") == {"/proj"}


def test_the_stream_missed_runs_the_server_idled_or_ran_further():
    from monitor.core.resync import missed_by_stream

    ours = {"idled": 2, "further": 2, "agrees": 3, "long_call": 1}
    busy = {"further", "agrees", "long_call"}
    theirs = {"further": 4, "agrees": 3, "long_call": 0}
    assert missed_by_stream(ours, busy, theirs) == ["idled", "further"]


def test_finished_calls_count_the_current_run_without_transparent_tools():
    from monitor.core.resync import finished_calls
    from tests import frames_factory as ff

    messages = [
        *ff.run_record("ses_1", 3),  # an earlier run: not counted
        ff.user_message("ses_1", "again"),
        *ff.export_reads("ses_1", 2),
        ff.assistant_message("ses_1", ff.export_part("ses_1", "t", "completed", tool="todowrite")),
        ff.assistant_message("ses_1", ff.export_part("ses_1", "r", "running")),
    ]
    assert finished_calls(messages, {"todowrite"}) == 2
    assert finished_calls(messages, set()) == 3
    assert finished_calls({"not": "a list"}, set()) == 0


def test_a_directory_that_cannot_be_asked_is_left_out_and_its_runs_kept():
    # Issue 33: a plugin's question (or a frame) may name a folder with a lone surrogate,
    # which no query can carry: asked, it failed the whole resync, every session's.
    odd = "/p\ud800"
    assert directories_to_ask({"a": odd, "b": "/y"}, None) == {"/y", None}
    plan = plan_resync(busy={}, known={"a": odd, "b": "/y"}, follows=None, acting_on=[])
    assert plan == ResyncPlan(end_runs=("b",), read_back=())
