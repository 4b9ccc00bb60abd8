"""What a server is, from its probes, and so which routes act on a session (core/server.py):
decided in the core on what the shell read, tested here pair by pair."""

from __future__ import annotations

import pytest

from monitor.core.server import (
    API_HEALTH,
    API_INFO,
    HEALTH,
    Probe,
    ServerKind,
    assumed_kind,
    engine_of_session,
    kind_from_probes,
    permission_body,
    probes,
    prompt_body,
    session_route,
)

BOTH = ServerKind(classic=True, engine=True)
V1 = ServerKind(classic=True, engine=False)
V2 = ServerKind(classic=False, engine=True)

HEALTHY = Probe(200, {"healthy": True, "version": "1.18.33"})
NO_VERSION = Probe(200, {"healthy": True})
ODD = Probe(200, ["not", "an", "object"])
MISSING = Probe(404)
DENIED = Probe(403)
UP = Probe(200, {"healthy": True})


INFO = Probe(200, {"version": "2.2.5", "pid": 17329, "urls": ["http://127.0.0.1:4596"]})
# 2.x answers every path outside `/api`, and 1.18.33 an unknown one, with its web page: the
# shell hands it over as a 200 with no JSON body, no answer of that route.
PAGE = Probe(200)
V2_2_5 = ServerKind(classic=False, engine=True, version="2.2.5", generation=2, pid=17329)


@pytest.mark.parametrize(
    ("info", "health", "api_health", "kind"),
    [
        # 1.18.33: both health routes, `/api/info` its web page; both engines, its version.
        (PAGE, HEALTHY, UP, ServerKind(classic=True, engine=True, version="1.18.33")),
        # A 1.x before the new engine: no `/api`.
        (MISSING, HEALTHY, MISSING, ServerKind(classic=True, engine=False, version="1.18.33")),
        # An older 1.x without a health route either: 1.x, no version.
        (MISSING, MISSING, MISSING, ServerKind(classic=True, engine=False, version=None)),
        (MISSING, MISSING, DENIED, ServerKind(classic=True, engine=False, version=None)),
        # The new engine's `/api` alone, without `/api/info`.
        (PAGE, PAGE, UP, ServerKind(classic=False, engine=True, version=None)),
        # A 1.x health route that gives no version string: still a 1.x one.
        (PAGE, NO_VERSION, UP, ServerKind(classic=True, engine=True, version="unknown")),
        (MISSING, ODD, MISSING, ServerKind(classic=True, engine=False, version="unknown")),
        # 2.2.5: `/api/info`; its web page on every other path (never taken for a 1.x).
        (INFO, PAGE, MISSING, V2_2_5),
        # A 2.x whose `/api/info` gives neither version nor pid: a 2.x all the same.
        (Probe(200, {}), PAGE, MISSING, ServerKind(False, True, generation=2)),
        (
            Probe(200, {"version": 2, "pid": -1}),
            PAGE,
            MISSING,
            ServerKind(False, True, generation=2),
        ),
    ],
)
def test_auto_decides_the_kind_pair_by_pair_of_health_answers(
    info: Probe, health: Probe, api_health: Probe, kind: ServerKind
) -> None:
    assert probes("auto") == (API_INFO, HEALTH, API_HEALTH)
    answers = {API_INFO: info, HEALTH: health, API_HEALTH: api_health}
    assert kind_from_probes("auto", answers) == kind


@pytest.mark.parametrize(
    ("choice", "info", "health", "kind"),
    [
        ("1", MISSING, HEALTHY, ServerKind(classic=True, engine=False, version="1.18.33")),
        ("1", MISSING, MISSING, ServerKind(classic=True, engine=False, version=None)),
        # 1.18.33's new engine alone: its bodies and its history, as a 1.x server's.
        ("2", PAGE, HEALTHY, ServerKind(classic=False, engine=True, version="1.18.33")),
        ("2", MISSING, MISSING, ServerKind(classic=False, engine=True, version=None)),
        ("2", INFO, PAGE, V2_2_5),
    ],
)
def test_a_chosen_api_decides_without_asking_api_health(
    choice: str, info: Probe, health: Probe, kind: ServerKind
) -> None:
    asked = probes(choice)
    assert asked == ((HEALTH,) if choice == "1" else (API_INFO, HEALTH))
    answers = {API_INFO: info, HEALTH: health}
    assert kind_from_probes(choice, {path: answers[path] for path in asked}) == kind


def test_before_the_probes_answer_the_choice_says_what_the_server_is_taken_for() -> None:
    assert assumed_kind("auto") == BOTH
    assert assumed_kind("1") == V1
    assert assumed_kind("2") == ServerKind(classic=False, engine=True, generation=2)


@pytest.mark.parametrize(
    ("kind", "prompt", "permission", "replays"),
    [
        # 1.18.33's new engine: its own forms, and its missed events replayed by seq.
        (
            BOTH,
            {"prompt": {"text": "T"}, "resume": False},
            {"reply": "reject", "message": "M"},
            True,
        ),
        (V2, {"prompt": {"text": "T"}, "resume": False}, {"reply": "reject", "message": "M"}, True),
        # 2.2.5 takes only these (any other key is a 400) and has no replay route.
        (V2_2_5, {"text": "T", "resume": False}, {"decision": "reject", "message": "M"}, False),
        (
            V1,
            {"prompt": {"text": "T"}, "resume": False},
            {"reply": "reject", "message": "M"},
            False,
        ),
    ],
)
def test_each_server_gets_the_bodies_it_takes_and_is_replayed_only_where_it_can_be(
    kind: ServerKind, prompt: dict[str, object], permission: dict[str, object], replays: bool
) -> None:
    assert prompt_body(kind, "T", resume=False) == prompt
    assert permission_body(kind, "reject", "M") == permission
    assert permission_body(kind, "once", None) == {next(iter(permission)): "once"}
    assert kind.replays is replays


@pytest.mark.parametrize(
    ("classic", "seen", "route"),
    [
        (True, None, 1),  # not seen yet: the 1.x routes
        (True, 1, 1),
        (True, 2, 2),  # seen on (or named by) the new engine
        (False, None, 2),  # a 2.x-only server has nothing but `/api`
        (False, 1, 2),
        (False, 2, 2),
    ],
)
def test_a_sessions_route_pair_by_pair(classic: bool, seen: int | None, route: int) -> None:
    assert session_route(classic, seen) == route


def test_the_routes_read_for_busy_sessions_the_1x_ones_first() -> None:
    assert (BOTH.routes(), V1.routes(), V2.routes()) == ((1, 2), (1,), (2,))
    assert (BOTH.unseen_route(), V1.unseen_route(), V2.unseen_route()) == (1, 1, 2)


@pytest.mark.parametrize(
    ("kind", "has_messages", "engine"),
    [
        (BOTH, {2: True}, 2),  # messages on `/api`: the new engine's
        (BOTH, {2: False}, 1),  # none there: a 1.x session (or one never prompted)
        (BOTH, {2: None}, 1),  # `/api` did not answer it after all
        (V1, {}, 1),
        (V2, {}, 2),
    ],
)
def test_attachs_look_up_decides_the_engine_from_what_was_read(
    kind: ServerKind, has_messages: dict[int, bool | None], engine: int
) -> None:
    # Only a server of both engines has messages to read for it.
    assert kind.telling_routes() == ((2,) if kind == BOTH else ())
    assert engine_of_session(kind, has_messages) == engine
