"""The provider's state files on the head (the decision log, the cost state) are its servants, not its master: one
that cannot be used (unreadable bytes, a directory where a file belongs, a file where the directory belongs, numbers
that cannot be true) is logged and set aside, renamed `<name>.aside-<UTC time>` next to where it was (kept for a
look, never deleted), and a fresh one is started. Nothing here raises: the monitor must come up and every launch go
on, whatever is on the disk."""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

logger = logging.getLogger(__name__)

ASIDE = ".aside-"


def set_aside(path: Path, why: str) -> Path | None:
    """Rename what is at `path` to `<name>.aside-<UTC time>[-n]` and log why; the new name, or None when even the
    rename failed (logged too: the caller goes on without the file)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}{ASIDE}{stamp}")
    n = 1
    while target.exists() or target.is_symlink():
        target = path.with_name(f"{path.name}{ASIDE}{stamp}-{n}")
        n += 1
    try:
        path.rename(target)
    except OSError as e:
        logger.error("state: %s %s, and cannot be set aside (%s): going on without it", path, why, e)
        return None
    logger.warning("state: %s %s: set aside as %s; starting afresh", path, why, target.name)
    return target


def directory_ready(directory: Path) -> bool:
    """`directory` exists as a directory (created; something else in its place set aside first). Never raises."""
    try:
        if (directory.exists() or directory.is_symlink()) and not directory.is_dir():
            if set_aside(directory, "is not a directory (it is where the state files go)") is None:
                return False
        directory.mkdir(parents=True, exist_ok=True)
        return True
    except OSError as e:
        logger.error("state: cannot create the directory %s: %s", directory, e)
        return False


def file_ready(path: Path) -> bool:
    """Nothing at `path` but a regular file (or nothing at all): a directory or other non-file there is set aside.
    Never raises."""
    try:
        if (path.exists() or path.is_symlink()) and not path.is_file():
            return set_aside(path, "is not a regular file") is not None
        return True
    except OSError as e:
        logger.error("state: cannot look at %s: %s", path, e)
        return False


def amount(value: object, name: str) -> float:
    """A number read back from a state file: finite and non-negative, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} is not a number: {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be finite and non-negative, not {value!r}")
    return v
