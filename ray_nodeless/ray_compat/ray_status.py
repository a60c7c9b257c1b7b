"""The one free-text place of `ray status`, and the path `ray exec` takes to the head.

Ray 2.60: `ray status` (scripts.py `status`) prints `commands.debug_status(status, error)`, which appends the text of
the internal-KV key `ray_constants.DEBUG_AUTOSCALING_ERROR` ("__autoscaling_error", namespace None) after the
report, under autoscaler v1 and v2 alike. Ray itself writes it only from the v1 monitor: deleted when the monitor
starts (before it builds a provider), set to "The autoscaler failed with ..." when it dies. Every driver logs the
key's text once as a warning when it connects (`_private/worker.py`, the error-listener thread), and the
dashboard's cluster-status API returns it as `autoscaling_error`. `StatusSlot` reads and writes that key.

The run a block belongs to: the head's `ray start` names the session `session_<local date>_<pid>`
(`_private/node.py`: `datetime.today().strftime("%Y-%m-%d_%H-%M-%S_%f")`) and keeps the name in the internal KV
(key "session_name", namespace `KV_NAMESPACE_SESSION`; a head restarted over a fault-tolerant GCS keeps it).
`StatusSlot.run_started` reads it back as the wall time the cluster's current run began.

`run_on_head` is `ray exec CLUSTER_YAML CMD` in-process (`commands.exec_cluster(with_output=True)`): Ray's config
bootstrap, its head lookup and its command runner for the head (our provider's `get_command_runner`: the local
backend's runner for a head on this machine, Ray's SSH runner for a VM).
"""
from __future__ import annotations

import contextlib
import datetime
import io
import re
from typing import Any

RAY_NAMES = (("ray._private.ray_constants", "DEBUG_AUTOSCALING_ERROR"), ("ray._raylet", "GcsClient"),
             ("ray._private.ray_constants", "KV_NAMESPACE_SESSION"),
             ("ray.autoscaler._private.commands", "exec_cluster"),
             ("ray.autoscaler._private.commands", "debug_status"))    # what prints the slot


class StatusSlot:
    """The text `ray status` prints after its report (DEBUG_AUTOSCALING_ERROR) of the GCS at `gcs_address`. The
    client is made at the first call (a provider object is built before the GCS answers, on `ray up`)."""

    def __init__(self, gcs_address: str, timeout_s: float = 2.0):
        self.gcs_address = gcs_address
        self.timeout_s = timeout_s
        self._client: Any = None

    def _key(self) -> bytes:
        from ray._private import ray_constants

        return ray_constants.DEBUG_AUTOSCALING_ERROR.encode()

    def _gcs(self) -> Any:
        if self._client is None:
            from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Ray 2.60's _raylet.pyi omits it

            self._client = GcsClient(address=self.gcs_address)
        return self._client

    def read(self) -> str | None:
        raw = self._gcs().internal_kv_get(self._key(), namespace=None, timeout=self.timeout_s)
        return None if raw is None else raw.decode("utf-8", errors="replace")

    def write(self, text: str) -> None:
        self._gcs().internal_kv_put(self._key(), text.encode(), True, namespace=None, timeout=self.timeout_s)

    def run_started(self) -> float | None:
        """When the cluster's current run began (its session's start, `session_started`); None when the name is
        not Ray's format. Raises when the GCS does not answer (the caller retries)."""
        from ray._private import ray_constants

        raw = self._gcs().internal_kv_get(b"session_name", namespace=ray_constants.KV_NAMESPACE_SESSION,
                                          timeout=self.timeout_s)
        return None if raw is None else session_started(raw.decode("utf-8", errors="replace"))


_SESSION = re.compile(r"session_(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d{6})_\d+")


def session_started(session_name: str) -> float | None:
    """The wall time (time.time) in a Ray session name, else None. Ray writes the head's local time without a
    zone; the monitor runs on the head, so the naive datetime is read in the same local time."""
    m = _SESSION.fullmatch(session_name.strip())
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d_%H-%M-%S_%f").timestamp()


def run_on_head(config_file: str, command: str) -> str:
    """`command`'s standard output on the head of the cluster of `config_file`, as `ray exec` runs it. Ray's own
    progress lines (printed by its CLI logger) are kept out of the result. Raises on no head or a failed command
    (Ray's errors; its CLI logger's abort as RuntimeError)."""
    from ray.autoscaler._private.commands import exec_cluster

    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            out = exec_cluster(config_file, cmd=command, with_output=True, run_env="auto",
                               _allow_uninitialized_state=True)     # a head in any state holds its log
    except SystemExit as e:       # Ray's CLI logger aborts with sys.exit: the caller reports, not exits
        said = " ".join(chatter.getvalue().split())[-300:]
        raise RuntimeError(f"`ray exec` on the head failed ({e.code}): {said}") from None
    if isinstance(out, bytes):
        out = out.decode("utf-8", errors="replace")
    return (out or "").replace("\r\n", "\n")
