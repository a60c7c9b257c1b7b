"""A pre-warmed starter: a Python process that has already imported Ray's CLI (about 0.5 s of a `ray start` on this
class of machine) and waits for one start request on stdin.

The request carries the node's full environment, log file, working directory and argv; the starter then *becomes*
that `ray start --block`, so the node keeps its own session and process group exactly as with a plain Popen. If
the owner goes away the starter reads EOF and exits. Pre-warming is an optimisation: whenever no starter is ready,
the node is started cold.
"""
from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

from ray_nodeless.providers.local.ray_start import clean_environ

logger = logging.getLogger(__name__)

_STARTER_CODE = r"""
import json, os, sys
import ray.scripts.scripts as scripts
line = sys.stdin.readline()
if not line.strip():
    sys.exit(0)
req = json.loads(line)
fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(fd, 1)
os.dup2(fd, 2)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.environ.clear()
os.environ.update(req["env"])
os.chdir(req["cwd"])
sys.argv = req["argv"]
sys.exit(scripts.main())
"""


class PrewarmedStarter:
    """At most one idle starter, for the next start of the process that owns it."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def spawn(self) -> None:
        """Have an idle starter ready (no-op if one is)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            try:
                self._proc = subprocess.Popen([sys.executable, "-c", _STARTER_CODE], stdin=subprocess.PIPE,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              env=clean_environ(), cwd=str(self.cwd), start_new_session=True,
                                              close_fds=True)
            except OSError as e:
                logger.debug("could not pre-warm a local node starter: %s", e)
                self._proc = None

    def start(self, cmd: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen | None:
        """Hand this start to the idle starter, which becomes the node's leader; None means: start cold."""
        with self._lock:
            starter, self._proc = self._proc, None
        if starter is None or starter.poll() is not None or starter.stdin is None:
            return None
        req = {"env": env, "log": log_path, "cwd": str(self.cwd), "argv": ["ray"] + cmd[1:]}
        try:
            starter.stdin.write((json.dumps(req) + "\n").encode())
            starter.stdin.close()
        except OSError as e:
            logger.debug("pre-warmed starter unusable (%s); starting cold", e)
            with contextlib.suppress(OSError):
                starter.kill()
            return None
        return starter

    def close(self) -> None:
        """Let an idle starter exit (it reads EOF)."""
        with self._lock:
            starter, self._proc = self._proc, None
        if starter is not None and starter.stdin is not None:
            with contextlib.suppress(OSError):
                starter.stdin.close()
