"""The `local` cloud: every machine is a real Ray node process on this host.

`LocalBackend` turns launches into `ray start --block` worker processes (`LocalNodeProcesses`), and the head into a
process-less record on which Ray's updater, through `LocalCommandRunner`, runs `head_start_ray_commands` exactly as
`ray up` would over SSH. That makes the whole `ray up` -> monitor -> provider -> backend path testable on one machine.

Faults can be injected to exercise the provider's fallback: `provider.local_faults` in the YAML and/or
`<state_dir>/faults.json` (re-read at every launch, so a test can add faults while a cluster runs), each a list of
    {"instance_type": ..., "zone": ..., "capacity": ..., "node_type": ..., "code": ..., "message": ..., "times": n}
Omitted match fields are wildcards; `code` defaults to InsufficientInstanceCapacity; `times` omitted (or null) means
every matching launch fails, otherwise the entry fails that many launches and is then spent.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import click
from ray.autoscaler._private.cli_logger import cli_logger
from ray.autoscaler._private.command_runner import _with_environment_variables
from ray.autoscaler._private import subprocess_output_util as cmd_output_util
from ray.autoscaler._private.subprocess_output_util import ProcessRunnerError
from ray.autoscaler.command_runner import CommandRunnerInterface

from ray_nodeless.errors import CapacityError
from ray_nodeless.providers.base import (
    MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, LaunchSpec, Machine, MachineBackend,
)
from ray_nodeless.providers.local.processes import (
    DEFAULT_MIN_FREE_MEMORY_MB, DEFAULT_OBJECT_STORE_MEMORY, DEFAULT_PORT_BASE, DEFAULT_START_TIMEOUT_S, MARKER_ENV,
    LocalNodeProcesses, NodeRecord, _FileLock,
)

logger = logging.getLogger(__name__)

DEFAULT_GCS_ADDRESS = "127.0.0.1:6379"
DEFAULT_FAULT_CODE = "InsufficientInstanceCapacity"
FAULT_FIELDS = ("instance_type", "zone", "capacity", "node_type")


def default_state_dir(cluster_name: str, suffix: str = "") -> Path:
    return Path(tempfile.gettempdir()) / "ray_nodeless" / f"{cluster_name}{suffix}"


def default_head_ip() -> str:
    """The IP the head's raylet will report. Ray rewrites `--node-ip-address=127.0.0.1` (and the default) to the
    host's routable address, so the head record must carry that, or v1's IP-keyed accounting misses the head."""
    try:
        from ray._private.services import resolve_ip_for_localhost
        return resolve_ip_for_localhost("127.0.0.1")
    except Exception:  # no network at all: Ray then falls back to loopback as well
        return "127.0.0.1"


def node_processes_from_config(provider_config: dict[str, Any], state_dir: Path) -> LocalNodeProcesses:
    """The LocalNodeProcesses for `provider_config` (shared by LocalBackend and LocalPlayer)."""
    return LocalNodeProcesses(
        state_dir,
        gcs_address=str(provider_config.get("gcs_address", DEFAULT_GCS_ADDRESS)),
        object_store_memory=int(provider_config.get("local_object_store_memory", DEFAULT_OBJECT_STORE_MEMORY)),
        port_base=int(provider_config.get("local_port_base", DEFAULT_PORT_BASE)),
        start_timeout_s=float(provider_config.get("local_start_timeout_s", DEFAULT_START_TIMEOUT_S)),
        min_free_memory_mb=int(provider_config.get("local_min_free_memory_mb", DEFAULT_MIN_FREE_MEMORY_MB)),
        extra_ray_start_args=list(provider_config.get("local_ray_start_args", [])),
        prewarm=bool(provider_config.get("local_prewarm", True)),
    )


def launch_env(spec: LaunchSpec) -> dict[str, str]:
    """Extra env of a node process: what ThreadedRayInstaller would export beside the instance id and type."""
    env: dict[str, str] = {}
    it = getattr(getattr(spec, "offering", None), "instance_type", None)
    name = getattr(it, "name", "")
    if name:
        env["RAY_CLOUD_INSTANCE_TYPE_NAME"] = name
    return env


class LocalBackend(MachineBackend):
    """Machines are local Ray node processes. Provider config keys (all optional):

    state_dir, gcs_address (default 127.0.0.1:6379), head_ip, local_faults, local_object_store_memory,
    local_port_base, local_start_timeout_s, local_min_free_memory_mb, local_ray_start_args.
    """

    cloud = "local"

    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        super().__init__(provider_config, cluster_name)
        self.state_dir = Path(provider_config.get("state_dir") or default_state_dir(cluster_name))
        self.nodes = node_processes_from_config(provider_config, self.state_dir)
        self.home = self.state_dir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        # Marker of the processes started through this cluster's command runner (the head's Ray): a test can
        # clean them up with local_processes.stop_marked_processes(backend.runner_marker), never `ray stop`.
        self.runner_marker = runner_marker(self.home)
        self.head_ip = str(provider_config.get("head_ip") or default_head_ip())
        self._config_faults: list[dict[str, Any]] = [dict(f) for f in provider_config.get("local_faults", [])]
        self._faults_lock = _FileLock(self.state_dir / "faults.lock")
        self._mem_lock = threading.Lock()

    # ---------------------------------------------------------------- faults

    @staticmethod
    def _fault_matches(fault: dict[str, Any], spec: LaunchSpec) -> bool:
        offering = spec.offering
        actual = {
            "instance_type": getattr(getattr(offering, "instance_type", None), "name", None),
            "zone": getattr(offering, "zone", None),
            "capacity": getattr(offering, "capacity", None),
            "node_type": spec.node_type,
        }
        if any(fault.get(k) is not None and fault[k] != actual[k] for k in FAULT_FIELDS):
            return False
        times = fault.get("times")
        return times is None or int(times) > 0

    @staticmethod
    def _raise_fault(fault: dict[str, Any], spec: LaunchSpec) -> None:
        code = str(fault.get("code") or DEFAULT_FAULT_CODE)
        offering = spec.offering
        where = "/".join(str(x) for x in (getattr(getattr(offering, "instance_type", None), "name", "?"),
                                          getattr(offering, "zone", "?"), getattr(offering, "capacity", "?")))
        msg = fault.get("message") or f"injected fault {code} for {where}"
        logger.info("local backend: %s", msg)
        raise CapacityError(str(msg), category=code)

    def _check_faults(self, spec: LaunchSpec) -> None:
        with self._mem_lock:
            for fault in self._config_faults:
                if self._fault_matches(fault, spec):
                    if fault.get("times") is not None:
                        fault["times"] = int(fault["times"]) - 1
                    self._raise_fault(fault, spec)
        path = self.state_dir / "faults.json"
        if not path.exists():
            return
        # The file is shared by every process on this state dir; decrement under its lock so a `times: 1` fault
        # fires exactly once machine-wide.
        with self._faults_lock():
            try:
                faults = json.loads(path.read_text() or "[]")
            except (OSError, ValueError) as e:
                logger.warning("ignoring unreadable %s: %s", path, e)
                return
            for fault in faults:
                if isinstance(fault, dict) and self._fault_matches(fault, spec):
                    if fault.get("times") is not None:
                        fault["times"] = int(fault["times"]) - 1
                        tmp = path.with_suffix(".tmp")
                        tmp.write_text(json.dumps(faults, indent=1))
                        os.replace(tmp, path)
                    self._raise_fault(fault, spec)

    # ---------------------------------------------------------------- contract

    def _mine(self, rec: NodeRecord) -> bool:
        return rec.tags.get(TAG_CLUSTER) == self.cluster_name

    def launch(self, spec: LaunchSpec) -> list[str]:
        if spec.request_token:
            done = [r.id for r in self.nodes.list() if r.request_token == spec.request_token and self._mine(r)]
            if len(done) >= spec.count:
                logger.info("local launch %s already done: %s", spec.request_token, done)
                return done[:spec.count]
        else:
            done = []
        self._check_faults(spec)
        tags = dict(spec.tags)
        tags[TAG_CLUSTER] = self.cluster_name
        new_ids: list[str] = []
        try:
            for _ in range(spec.count - len(done)):
                machine_id = f"local-{uuid.uuid4().hex[:8]}"
                if spec.is_head:
                    # No process: `ray up` starts Ray on it with head_start_ray_commands via LocalCommandRunner.
                    self.nodes.add_placeholder(machine_id, spec.node_type, self.head_ip, tags,
                                               resources=spec.resources, request_token=spec.request_token)
                else:
                    self.nodes.start(machine_id, spec.node_type, spec.resources, spec.labels,
                                     extra_env=launch_env(spec), tags=tags, request_token=spec.request_token)
                new_ids.append(machine_id)
        except BaseException:
            # Contract: never leave a machine behind when raising.
            if new_ids:
                logger.warning("local launch failed after %d of %d nodes; stopping them", len(new_ids), spec.count)
                self.nodes.stop(new_ids)
            raise
        return done + new_ids

    def list_machines(self) -> list[Machine]:
        return [
            Machine(id=r.id, tags=dict(r.tags), state=MACHINE_RUNNING if r.ready else MACHINE_PENDING,
                    internal_ip=r.ip, external_ip=r.ip, launched_at=r.started_at)
            for r in self.nodes.list() if self._mine(r)
        ]

    def terminate(self, machine_ids: list[str]) -> None:
        # `ray down` runs `ray stop` on the head through the command runner before this, so dropping the head's
        # record is all that is left to do for it; worker process groups are stopped.
        mine = [i for i in machine_ids if (r := self.nodes.get(i)) is not None and self._mine(r)]
        if len(mine) != len(machine_ids):
            logger.debug("local terminate: ignoring unknown/foreign ids %s", sorted(set(machine_ids) - set(mine)))
        if mine:
            self.nodes.stop(mine)

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> None:
        rec = self.nodes.get(machine_id)
        if rec is not None and self._mine(rec):
            self.nodes.update_tags(machine_id, tags)

    def close(self) -> None:
        self.nodes.close()

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict, cluster_name: str,
                       process_runner: Any, use_internal_ip: bool, docker_config: dict | None = None):
        if docker_config and docker_config.get("container_name"):
            logger.warning("the local backend ignores `docker:`; commands run directly on this host")
        return LocalCommandRunner(log_prefix, node_id, self.home, process_runner=process_runner)


def runner_marker(home: Path | str) -> str:
    """The marker of processes started through the LocalCommandRunner of the cluster whose home is `home`."""
    return f"runner@{Path(home)}"


# Prepended to every command: `ray stop` -> scoped stop (see LocalCommandRunner); any other `ray ...` unchanged.
_SCOPED_RAY_STOP = (
    'ray() {{ if [ "${{1:-}}" = stop ]; then shift; '
    '"{python}" -m ray_nodeless.providers.local.processes stop-marked "$NODELESS_LOCAL_NODE" "$@"; '
    'else command ray "$@"; fi; }}\n'
)


class LocalCommandRunner(CommandRunnerInterface):
    """Ray's command runner for a node that is this host: commands run under bash with HOME = the cluster's home
    directory, so everything Ray puts in `~` (ray_bootstrap_config.yaml, ray_bootstrap_key.pem, `~/...` file mounts)
    lands there and not in the user's home. Absolute remote paths are used as they are (like on a VM).

    Every process started through it carries `NODELESS_LOCAL_NODE=runner@<home>` (`self.marker`), and inside its
    commands `ray stop` is a shell function that stops only those processes: `ray down` runs a literal `ray stop`
    on the head, which on a shared host would otherwise kill every Ray cluster of the user. Worker nodes started
    by the backend carry their own marker, so (as on VMs) the head's `ray stop` leaves them to `terminate`.
    """

    def __init__(self, log_prefix: str, node_id: str, home: Path | str, process_runner: Any = subprocess):
        self.log_prefix = log_prefix
        self.node_id = node_id
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.process_runner = process_runner if process_runner is not None else subprocess
        self.marker = runner_marker(self.home)

    # What a fresh SSH session would not have: the CLI's own Ray address must not leak into commands on the node.
    _SCRUBBED_ENV = ("RAY_ADDRESS",)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in self._SCRUBBED_ENV}
        env["HOME"] = str(self.home)
        env[MARKER_ENV] = self.marker
        # The venv's bin first, so `ray` (and `python`) resolve to the interpreter running the autoscaler.
        venv_bin = str(Path(sys.executable).parent)
        path = env.get("PATH", "")
        if venv_bin not in path.split(os.pathsep):
            env["PATH"] = venv_bin + (os.pathsep + path if path else "")
        return env

    def remote_path(self, path: str) -> str:
        """Where a path on 'the node' is on this host: `~` is the cluster home, relative paths are under it."""
        if path == "~" or path.startswith("~/"):
            return str(self.home) + path[1:]
        if not os.path.isabs(path):
            return os.path.join(str(self.home), path)
        return path

    def run(self, cmd: str | None = None, timeout: int = 120, exit_on_fail: bool = False,
            port_forward: Any = None, with_output: bool = False,
            environment_variables: dict[str, object] | None = None, run_env: str = "auto",
            ssh_options_override_ssh_key: str = "", shutdown_after_run: bool = False,
            silent: bool = False) -> Any:
        # `timeout` is SSH's connect timeout in Ray's runner, not a command time limit: nothing to connect to here.
        if port_forward:
            logger.info("%slocal node: port forwarding %s is a no-op (same host)", self.log_prefix, port_forward)
        if shutdown_after_run:
            # On a VM this appends `sudo shutdown -h now`; here that would be the developer's machine.
            logger.warning("%sshutdown_after_run ignored for a local node", self.log_prefix)
        if not cmd:
            return b"" if with_output else ""
        if environment_variables:
            # Same encoding as Ray's SSH runner (JSON values, shell-quoted): RAY_OVERRIDE_RESOURCES etc.
            cmd = _with_environment_variables(cmd, environment_variables)
        # A login shell would source /etc/profile, which on Debian resets PATH and loses the venv: use a plain one.
        script = 'cd "$HOME" || exit 1\n' + _SCOPED_RAY_STOP.format(python=sys.executable) + cmd
        final = ["bash", "-c", script]
        logger.debug("%srunning locally: %s", self.log_prefix, cmd)
        env = self._env()
        interactive = sys.stdin is not None and sys.stdin.isatty()
        stdin = (None if interactive and cmd_output_util.does_allow_interactive()
                 and not cmd_output_util.is_output_redirected() else subprocess.DEVNULL)
        # Without a terminal, give the command its own session: what it daemonises (the head's Ray processes) must
        # not live in the caller's process group (pytest's, the CLI's), where signals meant for the caller land.
        # With a terminal (`ray attach`, `ray exec` by hand) keep the foreground job so the shell is usable.
        kw: dict[str, Any] = dict(env=env, stdin=stdin, start_new_session=not interactive)
        try:
            if with_output:
                return self.process_runner.check_output(final, **kw)
            if silent and cli_logger.verbosity < 1:
                self.process_runner.check_call(final, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
            elif cmd_output_util.is_output_redirected():
                out_path = os.path.join(tempfile.gettempdir(), f"ray-up-local-{time.time()}.txt")
                with open(out_path, "w") as out:
                    self.process_runner.check_call(final, stdout=out, stderr=out, **kw)
            else:
                # Inherit our stdout/stderr (`ray up` shows the output), as Ray's runner does with sys.stdout.
                self.process_runner.check_call(final, **kw)
        except subprocess.CalledProcessError as e:
            if exit_on_fail:
                raise click.ClickException(f"Command failed:\n\n  {cmd}\n") from None
            # What the updater catches to say "Setup command failed" (Ray's non-login-shell path raises the same).
            raise ProcessRunnerError("Command failed", "ssh_command_failed", code=e.returncode,
                                     command=cmd) from None
        return ""

    def _copy(self, source: str, target: str, options: dict[str, Any] | None) -> None:
        options = options or {}
        excludes = list(options.get("rsync_exclude") or [])
        filters = list(options.get("rsync_filter") or [])
        Path(target.rstrip("/") or "/").parent.mkdir(parents=True, exist_ok=True)
        rsync = shutil.which("rsync")
        if rsync:
            cmd = [rsync, "-a"]
            for e in excludes:
                cmd += ["--exclude", e]
            for f in filters:
                cmd += ["--filter", f"dir-merge,- {f}"]
            subprocess.run(cmd + [source, target], check=True, stdout=subprocess.DEVNULL)
            return
        if filters:
            logger.debug("rsync not installed: rsync_filter %s not applied to %s", filters, source)
        src = source.rstrip("/") or "/"
        if os.path.isdir(src):
            # rsync "a/" "b/" semantics (what Ray's updater passes for directories): contents of a into b.
            dst = target if source.endswith("/") else os.path.join(target, os.path.basename(src))
            shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True,
                            ignore=(lambda d, names: [n for n in names if any(fnmatch.fnmatch(n, e) for e in excludes)])
                            if excludes else None)
        else:
            dst = os.path.join(target, os.path.basename(src)) if target.endswith("/") or os.path.isdir(target) \
                else target
            shutil.copy2(src, dst)

    def run_rsync_up(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        self._copy(source, self.remote_path(target), options)

    def run_rsync_down(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        self._copy(self.remote_path(source), target, options)

    def remote_shell_command_str(self) -> str:
        home = str(self.home)
        venv_bin = str(Path(sys.executable).parent)
        return f'cd {home!r} && HOME={home!r} PATH={venv_bin!r}:"$PATH" exec bash'

    def run_init(self, *, as_head: bool, file_mounts: dict[str, str], sync_run_yet: bool) -> bool | None:
        # Nothing to initialise (no container). Must not return True: the updater would then invalidate the runtime
        # hash and redo all setup on every `ray up`.
        return None
