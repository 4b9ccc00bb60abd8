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
