"""What a server serves, as its probes show it, and so which routes act on a session.

The shell asks the health routes (`probes`) and hands their answers here (`kind_from_probes`);
the core keeps the kind (`Monitor.server`) and says by it which routes a session's requests
take (`session_route`), which reads tell the busy sessions (`ServerKind.routes`) and which
messages tell the engine of a session not seen on the stream (`engine_of_session`). Route 1 is
the 1.x `/session/...` routes, 2 the new engine's `/api/session/...`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "API_HEALTH",
    "HEALTH",
    "Probe",
    "ServerKind",
    "assumed_kind",
    "engine_of_session",
    "kind_from_probes",
    "probes",
    "session_route",
]

HEALTH = "/global/health"  # 1.x servers (1.18.33 too); older 1.x have none
API_HEALTH = "/api/health"  # servers with the new engine's `/api` routes


@dataclass(frozen=True, slots=True)
class Probe:
    """One health route's answer: its HTTP status and, when taken, its body."""

    status: int
    body: object = None

    @property
    def answered(self) -> bool:
        return 200 <= self.status < 300


def session_route(classic: bool, seen: int | None = None) -> int:
    """The routes a session's requests take: a server without the 1.x routes has only `/api`
    (2); otherwise the engine the session was seen on (its frames, or the server naming it as
    the new engine's), else 1."""
    return 2 if not classic or seen == 2 else 1


@dataclass(frozen=True, slots=True)
class ServerKind:
    """What a server serves: the 1.x routes (`classic`), the `/api` routes of the new engine
    (`engine`), and the version it gives (`/global/health`), if any."""

    classic: bool
    engine: bool
    version: str | None = None

    @property
    def api_stream(self) -> bool:
        """Whether its stream is `/api/event`: 1.18.33's `/global/event` carries both engines
        (the new one's events as `sync` copies with their seq); a server without it has
        `/api/event`."""
        return not self.classic

    def routes(self) -> tuple[int, ...]:
        """The routes it serves, each read for its own sessions (which are busy): the 1.x
        ones first, so that a hung `/api` read holds up no 1.x session."""
        return tuple(route for route, has in ((1, self.classic), (2, self.engine)) if has)

    def unseen_route(self) -> int:
        """The routes of a session not seen on the stream yet, and of the server's lists."""
        return session_route(self.classic)

    def telling_routes(self) -> tuple[int, ...]:
        """The routes whose messages tell which engine runs a session (`engine_of_session`):
        on a server of one engine, none."""
        return (2,) if self.classic and self.engine else ()

    def describe(self) -> str:
        engines = [name for name, has in (("1.x", self.classic), ("2.x", self.engine)) if has]
        return f"opencode {self.version or '(no version given)'}: {' and '.join(engines)} API"

    def log_fields(self) -> dict[str, object]:
        """`server.detected`'s fields."""
        return {
            "server": self.describe(),
            "version": self.version,
            "classic": self.classic,
            "engine": self.engine,
        }


def assumed_kind(choice: str) -> ServerKind:
    """What a server is taken for before its probes answer (`--api auto|1|2`): under `auto`,
    a 1.18.33 (both), as before the client knew of 2.x servers."""
    return ServerKind(classic=choice != "2", engine=choice != "1")


def probes(choice: str) -> tuple[str, ...]:
    """The health routes to ask at every connect (a server may be upgraded in place):
    `--api 1|2` decides the kind without `/api/health`, the version is asked all the same."""
    return (HEALTH,) if choice in ("1", "2") else (HEALTH, API_HEALTH)


def kind_from_probes(choice: str, answers: Mapping[str, Probe]) -> ServerKind:
    """The kind the answers to `probes(choice)` show. Without `/api`, a 1.x server whatever
    its health route says (older ones have none); with it, 2.x only if it lacks the 1.x
    health route too."""
    version = _version(answers[HEALTH])
    if choice in ("1", "2"):
        return ServerKind(classic=choice == "1", engine=choice == "2", version=version)
    engine = answers[API_HEALTH].answered
    return ServerKind(classic=version is not None or not engine, engine=engine, version=version)


def _version(health: Probe) -> str | None:
    """The version `/global/health` gives (1.x servers); None where there is none."""
    if not health.answered:
        return None
    version = health.body.get("version") if isinstance(health.body, dict) else None
    return version if isinstance(version, str) else "unknown"


def engine_of_session(kind: ServerKind, has_messages: Mapping[int, bool | None]) -> int:
    """Which engine runs a session not seen on the stream (`attach`'s look-up), from whether
    it has messages on each of `kind.telling_routes()` (None: that route did not answer it).
    Every session of a server without the 1.x routes is the new engine's (2). 1.18.33 answers
    a session of either engine on both `GET /session/{id}` and `GET /api/session/{id}`, but
    keeps each engine's messages apart (`/api/session/{id}/message` is empty for a 1.x
    session): one with messages on the `/api` route is the new engine's. One never prompted
    is taken for a 1.x one until its first event says otherwise."""
    return session_route(kind.classic, 2 if has_messages.get(2) else None)
