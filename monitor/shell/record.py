"""`--record`: every frame appended, as it came, to a file only its owner can read."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TextIO

import structlog

from monitor.core.frames import encode_sse
from monitor.errors import ConfigError

__all__ = ["Recorder", "open_record"]

log = structlog.get_logger("monitor.shell.watch")


def open_record(path: Path) -> TextIO:
    """Open the recording for appending: it holds raw tool arguments and outputs, so it is
    created readable by its owner only, and a symlink at `path` is refused rather than
    followed (it could point anywhere the monitor may write)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        reason = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"record {path}: cannot append ({reason})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"record {path}: cannot append (not a regular file)")
    return open(fd, "a", encoding="utf-8", newline="\n")


class Recorder:
    """Writes frames to the open recording until a write fails."""

    def __init__(self, path: Path, file: TextIO) -> None:
        self._path = path
        self._file: TextIO | None = file

    def write(self, data: str) -> None:
        file = self._file
        if file is None:
            return
        try:
            file.write(encode_sse(data))
            # Flushed per frame: a recording that stops short of the crash it should explain
            # is worthless, and a write per frame is cheap next to the network read.
            file.flush()
        except OSError as exc:
            # A full disk must not stop the guard: recording stops, watching goes on.
            log.error("record.failed", path=str(self._path), error=exc.strerror)
            self._file = None
