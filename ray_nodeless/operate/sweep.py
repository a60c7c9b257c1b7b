"""`ray-nodeless sweep`: list, then end, everything a cluster left running after its head died.

What it ends: the machines the backend lists as this cluster's (tag `ray-cluster-name`), workers first, then the
head; what the registration keeps for them or for machines already gone (Kubernetes Nodes and Ray pods, local
players: `Registration.leftovers` / `sweep`, the registration's own clean-up); what the backend keeps besides
(the local backend's head processes: `MachineBackend.leftovers` / `end_leftovers`).

- Never plans: only the provider block's keys are checked (the backend must be built), as `ray down` does
  (`ray_compat.in_teardown`), so a rule tightened since launch cannot keep machines running. No Ray needed.
- Only this cluster's: the backend lists by the cluster tag and its terminate skips foreign ids; every listed
  machine's tag is checked again here before it is ended.
- "Nothing left" is confirmed, never a page's silence: the machines to end are the listing's and a second query's
  by the cluster tag (`MachineBackend.recheck`), so an empty or short page cannot make the sweep skip machines.
- What was launched just before and is not listed yet is ended too: once a head was ended, the cluster is
  listed again for `ttls.TEARDOWN_WATCH_S` (at most verify_s), and machines that appear are ended.
- Every step that fails is recorded (what, why) and the rest still runs; then every machine ended is asked about
  again by id, and anything targeted that is not confirmed gone is a failure too. A rerun picks up what is left.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ray_nodeless.core.documents import Document
from ray_nodeless.core import ttls
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.operate.status import price_of
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, TAG_TERMINATING,
    TAG_ZONE, Machine, Recheck,
)

logger = logging.getLogger(__name__)



@dataclass
class Target:
    """One thing a sweep lists: a machine, or a leftover (k8s-node, k8s-pod, player, process)."""

    kind: str
    id: str
    node_kind: str = ""
    node_type: str = ""
    instance_type: str = ""
    zone: str = ""
    capacity: str = ""
    state: str = ""
    uptime_s: float | None = None
    hourly_price: float | None = None
    machine_id: str = ""
    source: str = "backend"           # who ends it: "backend" | "registration"

    def to_dict(self) -> Document:
        d = asdict(self)
        d.pop("source")
        return d


@dataclass
class SweepResult:
    cluster_name: str
    dry_run: bool
    workers_only: bool
    targets: list[Target]
    kept: list[Target]
    ended: list[str] = field(default_factory=list)              # "kind id"
    failures: list[dict[str, str]] = field(default_factory=list)  # {kind, id, error}

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> Document:
        return {"cluster_name": self.cluster_name, "dry_run": self.dry_run, "workers_only": self.workers_only,
                "targets": [t.to_dict() for t in self.targets], "kept": [t.to_dict() for t in self.kept],
                "hourly_cost": round(sum(t.hourly_price or 0.0 for t in self.targets), 6),
                "ended": list(self.ended), "failures": list(self.failures), "ok": self.ok}


class Sweep:
    """One sweep of one cluster. `targets()` lists; `run()` ends. Build, use, `close()`."""

    def __init__(self, cluster_config: Document, *, workers_only: bool = False,
                 progress: Callable[[str], None] = lambda _msg: None, verify_s: float | None = None):
        name = cluster_config.get("cluster_name")
        if not isinstance(name, str) or not name:
            raise ConfigError("cluster_name", "missing: a sweep ends only what is tagged with the cluster's name")
        bundle = load_provider(cluster_config.get("provider"), planning=False)   # keys only: never plans
        self.cluster_name = name
        self.workers_only = workers_only
        self.progress = progress
        self.verify_s = ttls.SWEEP_VERIFY_S if verify_s is None else verify_s
        self.backend = bundle.make_backend(name)
        try:
            self.registration = bundle.registration_for_sweep(name)
        except BaseException:
            self.backend.close()
            raise

    def close(self) -> None:
        try:
            self.registration.close()
        finally:
            self.backend.close()

    # ----- listing ---------------------------------------------------------------------------------------------

    def _machines(self) -> list[Machine]:
        """This cluster's machines, by the listing and a second query by the cluster tag (`recheck(None)`): a page
        that comes back short or empty by glitch must not read as "nothing to end". A listing error raises."""
        out: dict[str, Machine] = {}
        for m in [*self.backend.list_machines(), *self.backend.recheck(None).live]:
            if m.tags.get(TAG_CLUSTER) != self.cluster_name:
                logger.error("backend listed %s, which is not tagged %s=%s: left alone", m.id, TAG_CLUSTER,
                             self.cluster_name)
                continue
            out.setdefault(m.id, m)
        return [out[i] for i in sorted(out)]

    def targets(self, now: float | None = None) -> tuple[list[Target], list[Target], list[dict[str, str]]]:
        """(to end, kept by --workers-only, listing failures of the leftovers). Workers first, then the head."""
        now = time.time() if now is None else now
        machines = [_machine_target(m, now) for m in self._machines()]
        failures: list[dict[str, str]] = []
        leftovers: list[Target] = []
        for source, lister in (("registration", self.registration.leftovers), ("backend", self.backend.leftovers)):
            try:
                leftovers += [_leftover_target(d, source) for d in lister()]
            except Exception as e:
                failures.append({"kind": f"{source} leftovers", "id": "", "error": str(e)})
        every = sorted(machines, key=_order) + sorted(leftovers, key=_order)
        kept = [t for t in every if self.workers_only and t.node_kind == "head"]
        return [t for t in every if t not in kept], kept, failures

    # ----- ending ----------------------------------------------------------------------------------------------

    def run(self, dry_run: bool = False,
            listed: tuple[list[Target], list[Target], list[dict[str, str]]] | None = None) -> SweepResult:
        """End `listed` (a `targets()` answer: what the user was shown), else what a listing finds now."""
        targets, kept, failures = listed if listed is not None else self.targets()
        failures = list(failures)
        result = SweepResult(self.cluster_name, dry_run, self.workers_only, targets, kept, failures=failures)
        if dry_run or not targets:
            return result
        machines = [t for t in targets if t.kind == "machine"]
        workers = [t.id for t in machines if t.node_kind != "head"]
        heads = [t.id for t in machines if t.node_kind == "head"]
        ended_workers = self._terminate(workers, result)
        # The registration's side of every worker ended now, and of machines already gone (orphan Nodes, pods,
        # players whose machine is not listed any more).
        machine_ids = {t.id for t in machines}
        orphans = sorted({t.machine_id or t.id for t in targets if t.source == "registration"
                          and (t.machine_id or t.id) not in machine_ids})
        self._registration_sweep(ended_workers + orphans, targets, result)
        backend_leftovers = [t for t in targets if t.kind != "machine" and t.source == "backend"]
        if backend_leftovers:
            self.progress(f"stopping {len(backend_leftovers)} leftover(s): "
                          + ", ".join(f"{t.kind} {t.id}" for t in backend_leftovers))
            try:
                self.backend.end_leftovers([_leftover_dict(t) for t in backend_leftovers])
                result.ended += [f"{t.kind} {t.id}" for t in backend_leftovers]
            except Exception as e:
                result.failures += [{"kind": t.kind, "id": t.id, "error": str(e)} for t in backend_leftovers]
        ended_heads = self._terminate(heads, result)
        self._registration_sweep(ended_heads, [], result)    # a head has no Node; its player/records go
        late = self._late_launches(set(workers + heads), result) if ended_heads else []
        self._verify(workers + heads + late, result)
        return result

    def _late_launches(self, targeted: set[str], result: SweepResult) -> list[str]:
        """A head was ended: its monitor may have launched a worker just before, not listed yet (EC2's listing
        lags RunInstances). Listed again until `ttls.TEARDOWN_WATCH_S` (at most verify_s) have passed; whatever
        appears is ended too. The ids ended here."""
        end = time.monotonic() + min(self.verify_s, ttls.TEARDOWN_WATCH_S)
        ended: list[str] = []
        while time.monotonic() < end:
            time.sleep(min(ttls.TEARDOWN_WATCH_POLL_S, max(0.0, end - time.monotonic())))
            try:
                new = [m for m in self._machines() if m.id not in targeted]
            except Exception as e:  # noqa: BLE001 - a failed look: the next poll (or the verify step) tells
                logger.warning("sweep: listing for late launches failed: %s", e)
                continue
            if not new:
                continue
            now = time.time()
            result.targets += [_machine_target(m, now) for m in new]
            ids = sorted(m.id for m in new)
            self.progress(f"{len(ids)} machine(s) appeared after the head was ended (launched just before): "
                          f"{', '.join(ids)}")
            targeted |= set(ids)
            ended += self._terminate(ids, result)
        return ended

    def _terminate(self, ids: list[str], result: SweepResult) -> list[str]:
        """Terminate in one batched call; the TAG_TERMINATING mark first (best effort) tells any provider object
        of the cluster still alive that these were ended, not interrupted."""
        if not ids:
            return []
        self.progress(f"terminating {len(ids)} machine(s): {', '.join(ids)}")
        for mid in ids:
            try:
                self.backend.set_tags(mid, {TAG_TERMINATING: "1"})
            except Exception as e:
                logger.debug("could not mark %s as terminating: %s", mid, e)
        try:
            self.backend.terminate(ids)
        except Exception as e:
            result.failures += [{"kind": "machine", "id": mid, "error": f"terminate failed: {e}"} for mid in ids]
            self.progress(f"terminate failed: {e}")
            return []
        result.ended += [f"machine {mid}" for mid in ids]
        return ids

    def _registration_sweep(self, machine_ids: list[str], targets: list[Target], result: SweepResult) -> None:
        if not machine_ids:
            return
        mine = [t for t in targets if t.source == "registration"]
        if mine:
            self.progress(f"ending {len(mine)} registration leftover(s): "
                          + ", ".join(f"{t.kind} {t.id}" for t in mine))
        try:
            self.registration.sweep(machine_ids)
        except Exception as e:
            result.failures += [{"kind": t.kind, "id": t.id, "error": str(e)} for t in mine] or \
                [{"kind": "registration", "id": ",".join(machine_ids), "error": str(e)}]

    def _verify(self, machine_ids: list[str], result: SweepResult) -> None:
        """Ask again: what was ended and is not confirmed gone did not end (waits up to verify_s for a lagging
        cloud; what already failed is reported once, not waited for). "Gone" is the backend's second look by id
        (`recheck`), not a listing's silence: an empty page must not confirm a sweep that left machines running."""
        failed = {(f["kind"], f["id"]) for f in result.failures}
        wanted = set(machine_ids) - {mid for kind, mid in failed if kind == "machine"}
        deadline = time.monotonic() + self.verify_s
        while True:
            try:
                rc = self.backend.recheck(sorted(wanted)) if wanted else Recheck()
                still = wanted - set(rc.gone)
                left = [d for d in self.registration.leftovers() + self.backend.leftovers()
                        if not (self.workers_only and d.get("node_kind") == "head")
                        and (d["kind"], d["name"]) not in failed]
            except Exception as e:
                result.failures.append({"kind": "listing", "id": "", "error": f"could not check the result: {e}"})
                return
            if (not still and not left) or time.monotonic() >= deadline:
                break
            time.sleep(ttls.SWEEP_VERIFY_POLL_S)
        live = {m.id for m in rc.live}
        result.failures += [{"kind": "machine", "id": mid, "error": "still listed after terminate" if mid in live
                             else "not confirmed ended (the cloud does not show it)"} for mid in sorted(still)]
        result.failures += [{"kind": d["kind"], "id": d["name"], "error": f"still there ({d['state']})"}
                            for d in left]
        not_ended = {f"{f['kind']} {f['id']}" for f in result.failures}
        result.ended = [e for e in result.ended if e not in not_ended]


def _machine_target(m: Machine, now: float) -> Target:
    return Target(kind="machine", id=m.id, node_kind=m.tags.get(TAG_RAY_NODE_KIND, ""),
                  node_type=m.tags.get(TAG_RAY_USER_NODE_TYPE, ""), instance_type=m.tags.get(TAG_INSTANCE_TYPE, ""),
                  zone=m.tags.get(TAG_ZONE, ""), capacity=m.tags.get(TAG_CAPACITY, ""), state=m.state,
                  uptime_s=round(max(0.0, now - m.launched_at), 1) if m.launched_at else None,
                  hourly_price=price_of(m.tags), machine_id=m.id)


def _leftover_target(d: dict[str, str], source: str) -> Target:
    return Target(kind=d["kind"], id=d["name"], node_kind=d.get("node_kind", ""), state=d.get("state", ""),
                  machine_id=d.get("machine_id", ""), source=source)


def _leftover_dict(t: Target) -> dict[str, str]:
    return {"kind": t.kind, "name": t.id, "machine_id": t.machine_id, "node_kind": t.node_kind, "state": t.state}


def _order(t: Target) -> tuple[bool, str, str]:
    return (t.node_kind == "head", t.kind, t.id)
