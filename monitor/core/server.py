"""What a server serves, as its probes show it, and so which routes act on a session.

The shell asks the health routes (`probes`) and hands their answers here (`kind_from_probes`);
the core keeps the kind (`Monitor.server`) and says by it which routes a session's requests
take (`session_route`), which reads tell the busy sessions (`ServerKind.routes`) and which
messages tell the engine of a session not seen on the stream (`engine_of_session`), which body
each request of the new engine takes (`prompt_body`, `permission_body`), and whether its
missed events can be replayed (`ServerKind.replays`). Route 1 is the 1.x `/session/...`
routes, 2 the new engine's `/api/session/...`.

Three servers answer the probes (seen on the real servers, ../shared/opencode/NOTES.md and
V2-REAL-NOTES.md):
- 1.x: `/global/health` `{healthy, version}`; 1.18.33 also serves the new engine under `/api`
  (`/api/health`, `/api/session/{id}/history`, its own body forms);
- 2.x (2.2.5): `GET /api/info` `{version, pid, urls, ...}`; no `/api/health`, no history
  route; every path outside `/api` answers `200 text/html`, the web app, which is no answer
  of a route (the shell hands such an answer over as not answered, `Probe.answered`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "API_HEALTH",
    "API_INFO",
    "HEALTH",
    "Probe",
    "ServerKind",
    "assumed_kind",
    "engine_of_session",
    "kind_from_probes",
    "permission_body",
    "probes",
    "prompt_body",
    "session_route",
]

HEALTH = "/global/health"  # 1.x servers (1.18.33 too); older 1.x have none
API_HEALTH = "/api/health"  # 1.18's new engine under `/api`
API_INFO = "/api/info"  # 2.x: its version and pid


@dataclass(frozen=True, slots=True)
class Probe:
    """One health route's answer: its HTTP status and, when taken, its JSON body (None for a
    route that answered no JSON, such as 2.x's web page on every path outside `/api`)."""

    status: int
    body: object = None

    @property
    def answered(self) -> bool:
        return 200 <= self.status < 300 and self.body is not None


def session_route(classic: bool, seen: int | None = None) -> int:
    """The routes a session's requests take: a server without the 1.x routes has only `/api`
    (2); otherwise the engine the session was seen on (its frames, or the server naming it as
    the new engine's), else 1."""
    return 2 if not classic or seen == 2 else 1


@dataclass(frozen=True, slots=True)
class ServerKind:
    """What a server serves: the 1.x routes (`classic`), the `/api` routes of the new engine
    (`engine`), and the version it gives (`/global/health`, 2.x's `/api/info`), if any."""

    classic: bool
    engine: bool
    version: str | None = None
    # 2 for a 2.x server (it answers `/api/info`), 1 for a 1.x one, 1.18.33 with its new
    # engine too: the bodies its `/api` takes and whether it replays missed events go by it.
    generation: int = 1
    # The server process's id as 2.x's `/api/info` gives it (None elsewhere): the plugin in
    # it finds its monitor by it.
    pid: int | None = None

    @property
    def replays(self) -> bool:
        """Whether a new-engine session's missed events can be read again from its last seq
        (1.18.33's `/api/session/{id}/history`); 2.x has no such route, and a session it ran
        while we were away is read back from its record, as a 1.x one is."""
        return self.engine and self.generation == 1

    @property
    def inbox(self) -> bool:
        """Whether a session's messages not taken by a run yet wait in its inbox
        (`GET /api/session/{id}/inbox`, 2.x), apart from its record: a feedback posted to an
        idle session without starting a run (a hold's) is read there."""
        return self.generation == 2

    @property
    def toasts(self) -> bool:
        """Whether the TUI's toast route is there (`POST /tui/show-toast`, 1.x, 1.18.33 too):
        2.x has no TUI route (its web app answers every path outside `/api`, a POST 405), so
        a toast there is a request for nothing."""
        return self.classic

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


def prompt_body(kind: ServerKind, text: str, resume: bool) -> dict[str, object]:
    """The body of a new-engine session's `POST /api/session/{id}/prompt`: 1.18.33 takes
    `{prompt: {text}, resume}`, 2.x `{text, resume}` (its schema refuses any other key, 400)."""
    if kind.generation == 1:
        return {"prompt": {"text": text}, "resume": resume}
    return {"text": text, "resume": resume}


def permission_body(kind: ServerKind, reply: str, message: str | None) -> dict[str, object]:
    """The body of a new-engine permission reply: 1.18.33's `{reply}`, 2.x's `{decision}`
    (`once` / `always` / `reject` either way), with the refusal's `message` that the model
    reads."""
    extra = {} if message is None else {"message": message}
    return {("reply" if kind.generation == 1 else "decision"): reply, **extra}


def assumed_kind(choice: str) -> ServerKind:
    """What a server is taken for before its probes answer (`--api auto|1|2`): under `auto`,
    a 1.18.33 (both), as before the client knew of 2.x servers; under `2`, a 2.x."""
    if choice == "2":
        return ServerKind(classic=False, engine=True, generation=2)
    return ServerKind(classic=True, engine=choice != "1")


def probes(choice: str) -> tuple[str, ...]:
    """The health routes to ask at every connect (a server may be upgraded in place), in
    order: `--api 1|2` decide the kind, each asks its own route for the version."""
    if choice == "1":
        return (HEALTH,)
    if choice == "2":
        return (API_INFO, HEALTH)
    return (API_INFO, HEALTH, API_HEALTH)


def kind_from_probes(choice: str, answers: Mapping[str, Probe]) -> ServerKind:
    """The kind the answers to `probes(choice)` show. A server that answers `/api/info` is a
    2.x one; else without `/api`, a 1.x server whatever its health route says (older ones
    have none); with it, the new engine's `/api` only if it lacks the 1.x health route too."""
    info = answers.get(API_INFO)
    if info is not None and info.answered:
        version, pid = _info(info.body)
        return ServerKind(classic=False, engine=True, version=version, generation=2, pid=pid)
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


def _info(body: object) -> tuple[str | None, int | None]:
    """The version and pid 2.x's `/api/info` gives; None for what it does not."""
    version, pid = (body.get("version"), body.get("pid")) if isinstance(body, dict) else (0, 0)
    return (
        version if isinstance(version, str) else None,
        pid if type(pid) is int and pid > 0 else None,
    )


def engine_of_session(kind: ServerKind, has_messages: Mapping[int, bool | None]) -> int:
    """Which engine runs a session not seen on the stream (`attach`'s look-up), from whether
    it has messages on each of `kind.telling_routes()` (None: that route did not answer it).
    Every session of a server without the 1.x routes is the new engine's (2). 1.18.33 answers
    a session of either engine on both `GET /session/{id}` and `GET /api/session/{id}`, but
    keeps each engine's messages apart (`/api/session/{id}/message` is empty for a 1.x
    session): one with messages on the `/api` route is the new engine's. One never prompted
    is taken for a 1.x one until its first event says otherwise."""
    return session_route(kind.classic, 2 if has_messages.get(2) else None)
