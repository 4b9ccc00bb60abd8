"""What a server is, from its probes, and so which routes act on a session (core/server.py):
decided in the core on what the shell read, tested here pair by pair."""

from __future__ import annotations

import pytest

from monitor.core.server import (
    API_HEALTH,
    HEALTH,
    Probe,
    ServerKind,
    assumed_kind,
    engine_of_session,
    kind_from_probes,
    probes,
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


@pytest.mark.parametrize(
    ("health", "api_health", "kind"),
    [
        # 1.18.33: both health routes; both engines, its version given.
        (HEALTHY, UP, ServerKind(classic=True, engine=True, version="1.18.33")),
        # A 1.x before the new engine: no `/api`.
        (HEALTHY, MISSING, ServerKind(classic=True, engine=False, version="1.18.33")),
        # An older 1.x without a health route either: 1.x, no version.
        (MISSING, MISSING, ServerKind(classic=True, engine=False, version=None)),
        (MISSING, DENIED, ServerKind(classic=True, engine=False, version=None)),
        # 2.0: `/api` only.
        (MISSING, UP, ServerKind(classic=False, engine=True, version=None)),
        # A 1.x health route that gives no version string: still a 1.x one.
        (NO_VERSION, UP, ServerKind(classic=True, engine=True, version="unknown")),
        (ODD, MISSING, ServerKind(classic=True, engine=False, version="unknown")),
    ],
)
def test_auto_decides_the_kind_pair_by_pair_of_health_answers(
    health: Probe, api_health: Probe, kind: ServerKind
) -> None:
    assert probes("auto") == (HEALTH, API_HEALTH)
    assert kind_from_probes("auto", {HEALTH: health, API_HEALTH: api_health}) == kind


@pytest.mark.parametrize(
    ("choice", "health", "kind"),
    [
        ("1", HEALTHY, ServerKind(classic=True, engine=False, version="1.18.33")),
        ("1", MISSING, ServerKind(classic=True, engine=False, version=None)),
        ("2", HEALTHY, ServerKind(classic=False, engine=True, version="1.18.33")),
        ("2", MISSING, ServerKind(classic=False, engine=True, version=None)),
    ],
)
def test_a_chosen_api_decides_without_asking_api_health(
    choice: str, health: Probe, kind: ServerKind
) -> None:
    assert probes(choice) == (HEALTH,)
    assert kind_from_probes(choice, {HEALTH: health}) == kind


def test_before_the_probes_answer_the_choice_says_what_the_server_is_taken_for() -> None:
    assert assumed_kind("auto") == BOTH
    assert assumed_kind("1") == V1
    assert assumed_kind("2") == V2


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
