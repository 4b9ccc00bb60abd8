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


def test_a_session_unknown_at_the_connect_waits_for_its_own_directory_or_the_configured_one():
    from monitor.core.resync import waits_on

    assert waits_on("/a", {"/a", None}, None) == ("/a",)
    assert waits_on("/elsewhere", {"/a", None}, None) == (None,)
    assert waits_on(None, {"/proj"}, "/proj") == ("/proj",)
    assert waits_on("/elsewhere", {"/a"}, "/proj") == ()


def test_the_session_and_directory_of_a_frame_of_either_generation():
    from monitor.core.events_v2 import session_of
    from monitor.testing import engine_event
    from tests.frames_factory import call, envelope

    running = call("ses_a", "p1", "read", {})[0]
    assert session_of(envelope(running, "/w")) == ("ses_a", "/w", 1)
    assert session_of(running) == ("ses_a", None, 1)
    called = engine_event("session.tool.called", "ses_b", {"callID": "c"}, seq=3, directory="/v")
    assert session_of(called) == ("ses_b", "/v", 2)
    sync = {
        "directory": "/v",
        "payload": {"type": "sync", "syncEvent": {**called, "type": "session.next.tool.called.1"}},
    }
    assert session_of(sync) == ("ses_b", "/v", 2)
    assert session_of(envelope({"type": "server.heartbeat", "properties": {}}, "/w")) == (
        None,
        None,
        1,
    )
    assert session_of([1]) == (None, None, 1)


def test_frames_wait_only_for_what_the_resync_reads_of_their_session():
    import json

    from monitor.core.resync import Waiting
    from tests.frames_factory import call, envelope

    def data(session: str, directory: str) -> str:
        return json.dumps(envelope(call(session, "p1", "read", {})[0], directory))

    waiting = Waiting(["ses_known"], ["/a", "/b", None], None)
    # Known at the connect: waits for the whole resync.
    assert waiting.admit(data("ses_known", "/a")) is None
    # Unknown, its directory asked: waits for that answer, which is asked first.
    assert waiting.admit(data("ses_new", "/a")) is None
    assert waiting.admit(data("ses_idle", "/b")) is None
    assert set(waiting.urgent()) == {"/a", "/b"}
    # Unknown, in a directory nobody asks but the server's own is: waits for that one.
    assert waiting.admit(data("ses_far", "/far")) is None
    # Its directory answered, not busy there: its frames go on, and the next at once.
    assert waiting.answer("/b", 1, set()) == ["ses_idle"]
    assert len(waiting.free(["ses_idle"])) == 1
    assert waiting.admit(data("ses_idle", "/b")) is not None
    # Busy there: read back (by the resync), then freed the same way.
    assert waiting.answer("/a", 1, {"ses_new"}) == ["ses_new"]
    assert len(waiting.free(["ses_new"])) == 1
    # A session first seen after its directory answered busy waits with the known ones.
    waiting.answer(None, 1, {"ses_late"})
    assert waiting.admit(data("ses_late", "/c")) is None
    assert waiting.live == {"ses_idle", "ses_new"}
    # The plugin's questions for the sessions still held wait too (`Watch.judge` answers 503
    # and the plugin's own rule judges): their history is not read back yet.
    held = ("ses_known", "ses_far", "ses_late")
    asked = [(s, "/a") for s in (*held, "ses_idle", "ses_new", "ses_unseen")]
    assert [waiting.waits(s, where, 1) for s, where in asked] == [
        True, True, True, False, False, False
    ]  # fmt: skip
    assert len(waiting.rest()) == 3  # ses_known, ses_far, ses_late
    assert waiting.admit("{not json") is not None  # a malformed frame is fed to be counted


def test_a_question_before_any_frame_of_its_session_waits_for_its_directory():
    # The reconnect gap: a daemon restarted mid-run, and the plugin asks about the looping
    # call before any frame names the session. Judged then, on an empty history, the call
    # was let through. The question now places the session as its first frame would.
    import json

    from monitor.core.resync import Waiting
    from tests.frames_factory import call, envelope

    waiting = Waiting([], ["/a", "/b"], None)
    assert waiting.waits("ses_run", "/a", 1) and waiting.waits("ses_new", "/b", 1)
    assert waiting.urgent() == ["/a", "/b"]  # the directories asked next
    # A folder nobody asks (nor is the server's own): nothing to wait for.
    assert not waiting.waits("ses_far", "/far", 1)
    # Its frames wait with it, and a second question does not let it go.
    frame = json.dumps(envelope(call("ses_run", "p1", "read", {})[0], "/a"))
    assert waiting.admit(frame) is None and waiting.waits("ses_run", "/a", 1)
    # Not busy in its folder: judged at once from then on.
    assert waiting.answer("/b", 1, set()) == ["ses_new"]
    waiting.free(["ses_new"])
    assert not waiting.waits("ses_new", "/b", 1)
    # Busy: it waits while the resync reads it back, then is followed.
    assert waiting.answer("/a", 1, {"ses_run"}) == ["ses_run"]
    assert waiting.waits("ses_run", "/a", 1)
    assert len(waiting.free(["ses_run"])) == 1
    assert not waiting.waits("ses_run", "/a", 1)


def test_frames_let_go_together_are_fed_in_the_streams_order_across_sessions():
    import json

    from monitor.core.resync import Waiting
    from tests.frames_factory import call, envelope

    def data(session: str, part: str) -> str:
        return json.dumps(envelope(call(session, part, "read", {})[0], "/w"))

    waiting = Waiting(["ses_known"], ["/w"], None)
    sent = [("ses_b", "p1"), ("ses_a", "p2"), ("ses_known", "p3"), ("ses_b", "p4"), ("ses_a", "p5")]
    for session, part in sent:
        assert waiting.admit(data(session, part)) is None
    # First come first: ses_b's first frame came before ses_a's.
    assert waiting.answer("/w", 1, set()) == ["ses_b", "ses_a"]
    freed = waiting.free(["ses_b", "ses_a"])
    parts = [frame["payload"]["properties"]["part"]["id"] for frame in freed]  # type: ignore[index]
    assert parts == [
        "p1",
        "p2",
        "p4",
        "p5",
    ]  # the stream's order, not one session's after the other
    assert len(waiting.rest()) == 1  # ses_known's, at the end of the resync


def test_each_engines_answer_frees_only_the_sessions_that_speak_it():
    import json

    from monitor.core.resync import Waiting
    from monitor.testing import engine_event
    from tests.frames_factory import call, envelope

    classic = json.dumps(envelope(call("ses_c", "p1", "read", {})[0], "/a"))
    new = json.dumps(engine_event("session.tool.called", "ses_n", {"callID": "c"}, 1, "/a"))
    waiting = Waiting([], ["/a"], None)
    assert waiting.admit(classic) is None and waiting.admit(new) is None
    # The classic answer came, the `/api` one has not (hung, say): only ses_c goes on.
    assert waiting.answer("/a", 1, set()) == ["ses_c"]
    assert waiting.urgent() == ["/a"]
    assert waiting.answer("/a", 2, {"ses_n"}) == ["ses_n"]
