"""Shape-open provisioning in the monitor: at each pass of the provider's listing lane (ray_adapter/loop.py), read
Ray's pending demands from the GCS, let `launch/open_types.py` pack them into generated node types, and keep those
in the config file the monitor re-reads.

Runs only where the provider's MonitorContext (ray_adapter/context.py) acts on the cluster and names a config file:
Ray's monitor of a `ray up` cluster (`--autoscaling-config`, ~/ray_bootstrap_config.yaml) and the KubeRay bridge
(the config file it writes in the session dir and hands Ray each loop, kuberay/bridge.py). `ray up` and `ray down`
build provider objects too and must neither read a GCS nor write a config. Never raises into the loop: a GCS that
does not answer, or a config file that cannot be written, is logged and tried again at the next pass.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from ray_nodeless.core.demand import Constraint, Demand, Selector, canonical_resources
from ray_nodeless.launch.open_types import Opening, OpenTypes, RayNode, Snapshot, StepResult
from ray_nodeless.providers.base import TAG_UNSERVED_MAX, Machine
from ray_nodeless.ray_compat import demand as ray_demand

logger = logging.getLogger(__name__)

GCS_TIMEOUT_S = 5.0
PG_RESOURCE = re.compile(r"_group_([0-9]+_)?[0-9a-f]{16,}$")
MIN_INTERVAL_S = 1.0     # Ray v1 lists several times per loop: pack at most once a second


class YamlFileStore:
    """The monitor's cluster config file, replaced atomically (the monitor may read it at any moment)."""

    def __init__(self, path: str):
        self.path = Path(os.path.expanduser(path))

    def read(self) -> dict[str, Any]:
        return yaml.safe_load(self.path.read_text()) or {}

    def write(self, config: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=str(self.path.parent), prefix=".nodeless-", suffix=".yaml")
        try:
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(config, f, sort_keys=False)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def snapshot_of(state: Mapping[str, Any]) -> Snapshot:
    """compat's plain reading of ClusterResourceState -> core demands (gang bundles tagged with their group)."""

    # compat's selectors: one list per selector of (label key, operator, label values) triples.
    def selectors(raw: Iterable[Iterable[tuple[str, str, Iterable[str]]]]) -> tuple[Selector, ...]:
        return tuple(Selector(tuple(Constraint(k, op, tuple(v)) for k, op, v in s)) for s in raw)

    demands = [Demand(canonical_resources(r["resources"]), selectors(r["selectors"]), max(1, int(r["count"])))
               for r in state.get("requests", [])]
    for g in state.get("gangs", []):
        for b in g["bundles"]:
            demands.append(Demand(canonical_resources(b["resources"]), selectors(b["selectors"]), 1, str(g["id"]),
                                  spread=bool(b["spread"]), packed=bool(b["packed"])))
    nodes = [RayNode(n["instance_id"], n["node_type"], dict(n["total"]), dict(n["available"]), dict(n["labels"]))
             for n in state.get("nodes", [])]
    requested = state.get("requested") or {}
    # A task of a placement group asks for the group's resources (`CPU_group_<id>`): the gang request itself
    # holds that capacity, so such demands are not machines to plan.
    demands = [d for d in demands if d.resources and not any(PG_RESOURCE.search(k) for k, _ in d.resources)]
    constraints = [Demand(canonical_resources(r["resources"]), selectors(r["selectors"]), max(1, int(r["count"])))
                   for r in state.get("constraints", [])]
    return Snapshot(demands, nodes, dict(requested.get("types") or {}),
                    [(str(t), str(i)) for t, i in requested.get("instances") or []],
                    [d for d in constraints if d.resources])


def unserved_summary(result: StepResult) -> str:
    """The demands nothing allowed can serve, each with its reason, in one short line ('' when none)."""
    parts = [f"{d.describe()}: {why.removeprefix(d.describe() + ': ')}" for d, why in
             sorted(result.packing.infeasible.items(), key=lambda kv: kv[0].describe())]
    text = "; ".join(parts)
    return text if len(text) <= TAG_UNSERVED_MAX else text[:TAG_UNSERVED_MAX - 3] + "..."


class OpenDriver:
    def __init__(self, open_types: OpenTypes, gcs_address: str, logs_dir: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_unserved: Callable[[str, Mapping[str, Machine]], None] | None = None,
                 on_opened: Callable[[Opening], None] | None = None):
        self.open_types = open_types
        self._on_opened = on_opened          # the provider records it as a decision event (metrics/wiring.py)
        self._on_unserved = on_unserved      # the provider records the summary on the head (TAG_UNSERVED)
        self._unserved = ""
        self.gcs_address = gcs_address
        self._client: Any = None      # Ray's GcsClient (ray_compat.gcs): compiled in _raylet, which mypy skips
        self._sink: Callable[[str], None] | None = None
        self._logs_dir = logs_dir
        self._clock = clock
        self._last = -1e18
        self._lock = threading.Lock()
        self.last: StepResult | None = None

    def tick(self, machines: Mapping[str, Machine]) -> StepResult | None:
        if not self._lock.acquire(blocking=False):
            return None          # another thread's listing is packing right now
        try:
            now = self._clock()
            if now - self._last < MIN_INTERVAL_S:
                return None
            self._last = now
            try:
                state = ray_demand.read_state(self._gcs(), GCS_TIMEOUT_S)
            except Exception as e:     # the GCS is restarting or slow: next loop
                logger.warning("shape-open: could not read Ray's pending demands (%s); trying next loop", e)
                self._client = None
                return None
            try:
                result = self.open_types.step(snapshot_of(state), machines)
            except Exception:
                logger.exception("shape-open: planning the pending demands failed; trying next loop")
                return None
            for line in result.reports:
                logger.error("%s", line)
                self._event(line)
            for opening in result.opened:
                self._opened(opening)
            self._record_unserved(result, machines)
            self.last = result
            return result
        finally:
            self._lock.release()

    def _record_unserved(self, result: StepResult, machines: Mapping[str, Machine]) -> None:
        summary = unserved_summary(result)
        if summary == self._unserved or self._on_unserved is None:
            return
        try:
            self._on_unserved(summary, machines)
            self._unserved = summary
        except Exception as e:      # a tag write that failed: tried again next loop
            logger.warning("shape-open: could not record the unserved demands on the head (%s)", e)

    def _opened(self, opening: Opening) -> None:
        """A machine on its way for a shape-open demand: a decision event, else a line in Ray's event channel."""
        logger.info("%s", opening.message())
        try:
            if self._on_opened is not None:
                self._on_opened(opening)
            else:
                self._event(opening.message())
        except Exception as e:      # an event must never stop the packing
            logger.warning("shape-open: could not record %s: %s", opening.node_type, e)

    def _gcs(self) -> Any:     # Ray's GcsClient, untyped to mypy (see _client)
        if self._client is None:
            from ray_nodeless.ray_compat.gcs import gcs_client
            self._client = gcs_client(self.gcs_address)
        return self._client

    def _event(self, line: str) -> None:
        sink = self._sink
        if sink is None:
            sink = self._sink = ray_demand.autoscaler_event_sink(self._logs_dir)
        sink(f"ray_nodeless: {line}")
