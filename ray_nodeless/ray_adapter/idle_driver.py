"""What the monitor's learned idle release (launch/idle_release.py) reads: Ray's nodes' idle times from the GCS, and
each worker type's idle timeout and `min_workers` from the cluster config file the monitor re-reads.

Ray 2.60: the cluster status's resource state (ray_compat/demand.py, what `ray status` and autoscaler v2 read, under
v1 as well) gives each live node's status; an IDLE one its `idle_duration_ms`, the same figure v2's idle
termination compares with the type's `idle_timeout_s`. Nodes are keyed by `instance_id`, the RAY_CLOUD_INSTANCE_ID
their `ray start` was given: our machine ids.
"""
from __future__ import annotations

from typing import Any, Mapping

import yaml

from ray_nodeless.errors import DrainError
from ray_nodeless.core.idle import cluster_idle_s
from ray_nodeless.launch.idle_release import TypeIdle
from ray_nodeless.launch.open_types import is_open_type
from ray_nodeless.ray_compat import demand as ray_demand
from ray_nodeless.ray_adapter.open_driver import YamlFileStore
from ray_nodeless.ray_compat import gcs

GCS_TIMEOUT_S = 10


class GcsIdleSource:
    def __init__(self, gcs_address: str):
        self.gcs_address = gcs_address
        self._client: Any = None

    def idle_seconds(self) -> dict[str, float | None]:
        try:
            if self._client is None:
                self._client = gcs.gcs_client(self.gcs_address)
            state = ray_demand.read_state(self._client, GCS_TIMEOUT_S)
        except Exception as e:       # the GCS is restarting or slow: the caller tries at its next pass
            self._client = None
            raise DrainError(f"reading Ray's nodes from {self.gcs_address} failed: {e}") from None
        # A draining node is Ray's already (its own idle termination, or a preemption): not ours to judge.
        return {n["instance_id"]: n["idle_s"] for n in state.get("nodes", [])
                if n.get("instance_id") and not n.get("draining")}


class ConfigIdlePlan:
    """Each worker type's idle release from the config file at `path` (read again when it changes): its own
    `idle_timeout_s` (bootstrap_config writes the break-even there), else `idle_timeout_minutes`; `learn` for the
    types `learnable` names (bootstrap_config's record; None: not recorded) and the shape-open generated types."""

    def __init__(self, path: str, head_node_type: str | None, learnable: list[str] | None):
        self.store = YamlFileStore(path)             # the file the shape-open driver rewrites, read the same way
        self.path = self.store.path
        self.learnable = frozenset(learnable or ())
        self.head_node_type = head_node_type
        self._stamp: tuple[int, int] | None = None
        self._types: dict[str, TypeIdle] = {}

    def types(self) -> Mapping[str, TypeIdle]:
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                cfg = self.store.read()
            except yaml.YAMLError as e:      # being rewritten by hand: the idle release waits for the next pass
                raise ValueError(f"{self.path}: not YAML now ({e})") from None
            self._types = self._read(cfg if isinstance(cfg, dict) else {})
            self._stamp = stamp
        return self._types

    def _read(self, cfg: Mapping[str, Any]) -> dict[str, TypeIdle]:
        cluster_s = cluster_idle_s(cfg)
        head = cfg.get("head_node_type", self.head_node_type)
        out: dict[str, TypeIdle] = {}
        for name, nt in (cfg.get("available_node_types") or {}).items():
            if name == head or not isinstance(nt, Mapping):
                continue
            own = nt.get("idle_timeout_s")
            timeout = float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) else cluster_s
            out[str(name)] = TypeIdle(timeout_s=timeout, min_workers=int(nt.get("min_workers") or 0),
                                      learn=name in self.learnable or is_open_type(nt))
        return out
