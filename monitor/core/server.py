"""What a server serves, as the API client found it (`EngineAPI.detect`): which routes, which
stream, which version. The core keeps it; the shell reads it back only to say it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerKind"]


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
