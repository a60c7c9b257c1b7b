"""The project's one way to write a file that other processes read: atomically.

Every file that a reader may open while it is being written (catalog files and caches, the local backend's
records, slots and fault lists, ...) goes through `write_atomic`. `ray_nodeless.core.catalog` re-exports it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str, *, mode: int | None = None, durable: bool = False) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never half of one.

    The bytes go to a temporary file in the same directory, which then replaces `path` (`os.replace`, atomic on
    POSIX and Windows). A `str` is written as UTF-8. Parent directories are created. `mode`: the new file's
    permission bits (default: those of the file it replaces, else 0o600, what `tempfile.mkstemp` gives).
    `durable`: also fsync the file before the rename and the directory after it, so that a power loss leaves one of
    the two versions on disk (about 10 ms per write here, so off by default: every current caller writes a cache or
    a file that only matters while this machine is up).
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except OSError:
            mode = None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if mode is not None:
                os.fchmod(fh.fileno(), mode) if hasattr(os, "fchmod") else os.chmod(tmp, mode)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort: not every OS or file system can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
