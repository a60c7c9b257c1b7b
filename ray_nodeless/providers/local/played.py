"""Played machines: a decorator around any MachineBackend, the way Karpenter wraps its CloudProvider.

The inner backend's control plane is real code against a fake cloud (EC2 under moto, GCE under a fake server, or
the local backend's records); nothing boots there. `PlayedBackend(inner, player)` is itself a MachineBackend: after
`inner` launched worker machines, its `Player` starts on this host what would run on each of them (players.py: the
VM's own Ray node, or its kubelet); after `inner` terminated them, or they left the listing (`forget`), it stops
that. Everything else is the inner backend's, unchanged: tags, request tokens, errors, the listing (with each
played machine's address put in). So the registration (how a machine joins Ray) does not know whether its machines
are played, and nothing in `registrations/` imports this package.

Which player plays, if any, is said by the provider block (`settings.player_of`; the registry's `make_backend`
applies it): `registration: local-player` -> the Ray-node player, `registration: kubernetes` with
`kubernetes.played: true` -> the kubelet player.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, ClassVar

from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND

from ray_nodeless.providers.base import MACHINE_PENDING, LaunchSpec, Machine, MachineBackend, Reservation
from ray_nodeless.providers.local.runner import LocalCommandRunner, runner_marker
from ray_nodeless.providers.local.scoped_stop import end_marked_processes, marked_pids

logger = logging.getLogger(__name__)

HEAD_PROCESS = "process"     # leftover kind: a process the head's command runner started (the head's Ray)


class Player(abc.ABC):
    """What stands in, on this host, for what would run on each machine of the inner backend."""

    kind: ClassVar[str] = "player"      # the `kind` of its leftovers (see MachineBackend.leftovers)

    def __init__(self, home: Path, head_ip: str):
        self.home = home                # where the head's commands run (LocalCommandRunner)
        self.home.mkdir(parents=True, exist_ok=True)
        self.head_ip = head_ip          # the address the head's raylet reports (its Ray runs on this host)
        # Marks the processes started through the command runner of `home` (the head's Ray, when the inner backend
        # has no runner of its own): listed as leftovers, and a test's scoped clean-up (scoped_stop), never `ray stop`.
        self.runner_marker = runner_marker(home)

    @abc.abstractmethod
    def play(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        """Start what runs on these new worker machines. A retried launch names machines already played: play
        each once. Raise BackendError naming the machines that could not be played."""

    def adopt(self, machine_ids: list[str]) -> None:
        """The inner backend lists these worker machines: play those this process did not start and whose player
        is gone (its process was killed; a real machine's kubelet would not have stopped). Cheap: called for every
        listing. Default: nothing to adopt."""

    def ip(self, machine_id: str) -> str | None:
        """The address a played worker's Ray node reports (what v1 matches Ray nodes by), None to keep the
        listing's. Cheap: called for every machine per listing."""
        return None

    @abc.abstractmethod
    def stop(self, machine_ids: list[str]) -> None:
        """The machines are gone: stop what played them. Ids never played here are ignored."""

    def leftovers(self) -> list[dict[str, str]]:
        """What plays this cluster's machines now (kind `kind`), listed afresh. Default: nothing to list."""
        return []

    def close(self) -> None:
        """Release threads and handles; what plays machines keeps running (another process may own them)."""


class PlayedBackend(MachineBackend):
    """`inner`'s machines, each played on this host by `player`. Keeps the contract of providers/base.py: a launch
    whose machines cannot be played raises only after terminating every machine of that call."""

    def __init__(self, inner: MachineBackend, player: Player):
        super().__init__(inner.settings, inner.cluster_name)
        self.inner = inner
        self.player = player
        self.runner_marker = player.runner_marker

    # ----- the four calls --------------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> list[str]:
        ids = self.inner.launch(spec)
        if spec.is_head:
            return ids      # the head's Ray is started by `ray up` through the command runner, not played
        # The cloud made them: listed now, before their players start Ray (MachineBackend.on_created).
        self.created([Machine(id=mid, tags=dict(spec.tags), state=MACHINE_PENDING, launched_at=time.time())
                      for mid in ids])
        try:
            self.player.play(spec, ids)
        except BaseException:
            logger.error("%s: machines %s could not be played; terminating them", spec.node_type, ids)
            self._end(ids)
            raise
        return ids

    def _end(self, ids: list[str]) -> None:
        """Terminate a failed launch's machines and stop what played some of them (best effort: the launch's own
        error is what the caller sees)."""
        try:
            self.inner.terminate(ids)
        except Exception as e:
            logger.error("terminating unplayed machines %s failed: %s", ids, e)
        try:
            self.player.stop(ids)
        except Exception as e:
            logger.error("stopping the players of %s failed: %s", ids, e)

    def list_machines(self) -> list[Machine]:
        machines = self.inner.list_machines()
        self.player.adopt([m.id for m in machines if m.tags.get(TAG_RAY_NODE_KIND) != NODE_KIND_HEAD])
        return [self._played(m) for m in machines]

    def _played(self, machine: Machine) -> Machine:
        if machine.tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            ip: str | None = self.player.head_ip
        else:
            ip = self.player.ip(machine.id)
        if ip is None:
            return machine      # not played (yet, or not any more): no raylet will claim the cloud's address
        return dataclasses.replace(machine, internal_ip=ip, external_ip=ip)

    def terminate(self, machine_ids: list[str]) -> None:
        self.inner.terminate(machine_ids)     # raises when the cloud refused: the machines, and their players, stay
        self.player.stop(list(machine_ids))

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        return self.inner.set_tags(machine_id, tags)

    # ----- the rest of the contract ----------------------------------------------------------------------------

    def vanished_reasons(self, machine_ids: list[str]) -> dict[str, str]:
        return self.inner.vanished_reasons(machine_ids)

    def reservations(self) -> list[Reservation]:
        return self.inner.reservations()

    def forget(self, machine_ids: list[str]) -> None:
        """They left the listing (a preemption emulated in the fake cloud, or ended by another process): what
        played them goes too."""
        self.inner.forget(machine_ids)
        self.player.stop(list(machine_ids))

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict, cluster_name: str,
                       process_runner: Any, use_internal_ip: bool, docker_config: dict | None = None):
        """Every played machine is this host: the inner backend's runner if it has one, else a local one (instead
        of Ray's SSH runner, e.g. for the head)."""
        runner = self.inner.command_runner(log_prefix, node_id, auth_config, cluster_name, process_runner,
                                           use_internal_ip, docker_config)
        return runner or LocalCommandRunner(log_prefix, node_id, self.player.home, process_runner=process_runner)

    def leftovers(self) -> list[dict[str, str]]:
        """The inner backend's, the live players (a player outlives its machine when nothing saw the machine go),
        and the processes our command runner started that still run (the head's Ray; none when the inner backend
        ran the head's commands with its own runner)."""
        return (self.inner.leftovers() + self.player.leftovers()
                + [{"kind": HEAD_PROCESS, "name": str(pid), "machine_id": "", "node_kind": "head", "state": "running"}
                   for pid in marked_pids(self.runner_marker)])

    def end_leftovers(self, leftovers: list[dict[str, str]]) -> None:
        """Ours (players, our runner's processes) here, the rest by the inner backend. Raises BackendError if our
        runner's processes survive SIGKILL."""
        ours = {str(pid) for pid in marked_pids(self.runner_marker)}
        players = [d for d in leftovers if d["kind"] == self.player.kind]
        heads = [d for d in leftovers if d["kind"] == HEAD_PROCESS and d["name"] in ours]
        rest = [d for d in leftovers if d not in players and d not in heads]
        if rest:
            self.inner.end_leftovers(rest)
        if players:
            self.player.stop(sorted(d["machine_id"] for d in players))
        if heads:
            end_marked_processes(self.runner_marker, self.cluster_name)

    def close(self) -> None:
        try:
            self.player.close()
        finally:
            self.inner.close()
