"""The `local` cloud: every machine is a real Ray node process on this host.

`LocalBackend` turns launches into `ray start --block` worker processes (`LocalNodeProcesses`), and the head into a
process-less record on which Ray's updater, through `LocalCommandRunner`, runs `head_start_ray_commands` exactly as
`ray up` would over SSH. That makes the whole `ray up` -> monitor -> provider -> backend path testable on one machine.
Launches can be made to fail like a cloud without capacity (faults.py).
"""
from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from ray_nodeless.errors import ForeignMachineError
from ray_nodeless.providers.base import (
    MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, LaunchSpec, Machine, MachineBackend, Recheck,
    tag_update,
)
from ray_nodeless.providers.local.faults import FaultInjector
from ray_nodeless.providers.local.processes import LocalNodeProcesses
from ray_nodeless.providers.local.ray_start import instance_env
from ray_nodeless.providers.local.records import NodeRecord
from ray_nodeless.providers.local.runner import LocalCommandRunner, runner_marker
from ray_nodeless.providers.local.scoped_stop import end_marked_processes, marked_pids
from ray_nodeless.providers.local.settings import LocalConfig, LocalSettings, default_state_dir
from ray_nodeless.providers.local.slots import default_head_ip

logger = logging.getLogger(__name__)


class LocalBackend(LocalConfig, MachineBackend):
    """Machines are local Ray node processes; its provider-block keys are `LocalSettings` (`LocalConfig`)."""

    settings: LocalSettings

    def __init__(self, settings: LocalSettings, cluster_name: str):
        super().__init__(settings, cluster_name)
        self.state_dir = Path(self.settings.state_dir or default_state_dir(cluster_name))
        self.nodes = LocalNodeProcesses.from_settings(self.settings, self.state_dir)
        self.home = self.state_dir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        # Marker of the processes started through this cluster's command runner (the head's Ray): a test can
        # clean them up with scoped_stop.stop_marked_processes(backend.runner_marker), never `ray stop`.
        self.runner_marker = runner_marker(self.home)
        self.head_ip = self.settings.head_ip or default_head_ip()
        self.faults = FaultInjector(self.settings.local_faults, self.state_dir)

    def _mine(self, rec: NodeRecord) -> bool:
        return rec.tags.get(TAG_CLUSTER) == self.cluster_name

    def launch(self, spec: LaunchSpec) -> list[str]:
        done: list[str] = []
        if spec.request_token:
            done = [r.id for r in self.nodes.list() if r.request_token == spec.request_token and self._mine(r)]
            if len(done) >= spec.count:
                logger.info("local launch %s already done: %s", spec.request_token, done)
                return done[:spec.count]
        self.faults.check(spec)
        tags = dict(spec.tags)
        tags[TAG_CLUSTER] = self.cluster_name
        new_ids: list[str] = []
        try:
            for _ in range(spec.count - len(done)):
                machine_id = f"local-{uuid.uuid4().hex[:8]}"
                if spec.is_head or spec.boot_script:
                    # No process: `ray up` starts Ray on the head with head_start_ray_commands via
                    # LocalCommandRunner; a machine with a boot script (a Kubernetes join) gets Ray from its
                    # registration (the kubelet player runs the Ray pod), not from us.
                    self.nodes.add_placeholder(machine_id, spec.node_type, self.head_ip, tags,
                                               resources=spec.resources, request_token=spec.request_token)
                else:      # listed (pending) before its Ray is up, as a cloud lists a booting instance
                    self.nodes.start(machine_id, spec.node_type, spec.resources, spec.labels,
                                     extra_env=instance_env(spec), tags=tags, request_token=spec.request_token,
                                     on_record=lambda rec: self.created([self._machine(rec)]))
                new_ids.append(machine_id)
        except BaseException:
            # Contract: never leave a machine behind when raising.
            if new_ids:
                logger.warning("local launch failed after %d of %d nodes; stopping them", len(new_ids), spec.count)
                self.nodes.stop(new_ids)
            raise
        return done + new_ids

    @staticmethod
    def _machine(r: NodeRecord) -> Machine:
        return Machine(id=r.id, tags=dict(r.tags), state=MACHINE_RUNNING if r.ready else MACHINE_PENDING,
                       internal_ip=r.ip, external_ip=r.ip, launched_at=r.started_at)

    def list_machines(self) -> list[Machine]:
        return [self._machine(r) for r in self.nodes.list() if self._mine(r)]

    def recheck(self, machine_ids: list[str] | None) -> Recheck:
        """By id, each node's own record (read afresh from the state dir): live while its record is this
        cluster's, gone once the record was removed (the node was ended; the records tell no reason)."""
        if machine_ids is None:
            return Recheck(live=self.list_machines())
        live = {m.id: m for m in self.list_machines()}
        out = Recheck()
        for mid in machine_ids:
            rec = self.nodes.get(mid)
            if rec is None:
                out.gone[mid] = ""
            elif self._mine(rec):
                out.live.append(live.get(mid) or Machine(id=mid, tags=dict(rec.tags), state=MACHINE_PENDING,
                                                         internal_ip=rec.ip, external_ip=rec.ip,
                                                         launched_at=rec.started_at))
        return out

    def terminate(self, machine_ids: list[str]) -> None:
        # `ray down` runs `ray stop` on the head through the command runner before this, so dropping the head's
        # record is all that is left to do for it; worker process groups are stopped. The records are the cloud
        # here (read afresh from the state dir), so an id this object never listed is checked like any other.
        ids = list(dict.fromkeys(machine_ids))
        records = {i: self.nodes.get(i) for i in ids}
        found = {i: r for i, r in records.items() if r is not None}
        mine = [i for i in ids if i in found and self._mine(found[i])]
        foreign = [i for i in ids if i in found and not self._mine(found[i])]
        gone = [i for i in ids if i not in found]
        if gone:
            logger.debug("local terminate: already gone %s", gone)
        if mine:
            self.nodes.stop(mine)
        if foreign:
            raise ForeignMachineError(f"terminate: {foreign} are not machines of cluster {self.cluster_name!r}; "
                                      f"not touched", foreign)

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        tags = tag_update(self.cluster_name, machine_id, tags)
        rec = self.nodes.get(machine_id)
        if rec is None or not self.nodes.alive(rec):
            logger.info("set_tags: %s is gone; not tagging", machine_id)
            return False
        if not self._mine(rec):
            raise ForeignMachineError(f"set_tags: {machine_id} is not a machine of cluster {self.cluster_name!r}",
                                      [machine_id])
        if tags:
            self.nodes.update_tags(machine_id, tags)
        return True

    def leftovers(self) -> list[dict[str, str]]:
        """The processes this cluster's command runner started and that still run: the head's Ray (a head
        machine is a record; `ray down` stops its Ray with a scoped `ray stop` before dropping the record)."""
        return [{"kind": "process", "name": str(pid), "machine_id": "", "node_kind": "head", "state": "running"}
                for pid in marked_pids(self.runner_marker)]

    def end_leftovers(self, leftovers: list[dict[str, str]]) -> None:
        if any(d["kind"] == "process" for d in leftovers):
            end_marked_processes(self.runner_marker, self.cluster_name)

    def close(self) -> None:
        self.nodes.close()

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict, cluster_name: str,
                       process_runner: Any, use_internal_ip: bool, docker_config: dict | None = None):
        if docker_config and docker_config.get("container_name"):
            logger.warning("the local backend ignores `docker:`; commands run directly on this host")
        return LocalCommandRunner(log_prefix, node_id, self.home, process_runner=process_runner)
