"""A REAL kubelet (on containerd + runc) for one local machine: the machine image of the local backend when
`local_real_kubelet` is set (players.py KubeletPlay hands it the machines of one node type, one at a time).

A VM boots its image and runs its user data; here `RealKubeletMachine.boot(machine_id, user_data)` does, on this
host, what such an image does with the join user data the Kubernetes registration wrote (registrations/kubernetes/
join.py), unchanged:
  1. containerd starts (own root, state and socket under `workdir`, runc, cgroupfs, `restrict_oom_score_adj`, the
     locally built pause image as sandbox image, a CNI bridge config written before it starts) and the node's images
     are imported (no registry here);
  2. the user data runs under bash with MACHINE_ID set (as the instance metadata would). Its `kubeadm` is a shim
     that adds `--rootfs <workdir>/kroot --ignore-preflight-errors=all` to `kubeadm join` (kubeadm writes
     /etc/kubernetes and /var/lib/kubelet: with --rootfs they land under the machine's own root);
  3. systemd's part (there is none here): once kubeadm wrote `kubeadm-flags.env`, the kubelet is started with the
     flags of kubeadm's systemd drop-in; it TLS-bootstraps with the bootstrap token and kubeadm finishes the join.
`stop()` is the machine vanishing: kubeadm, kubelet, the pods' containers and containerd are stopped by PID (pid
files under `workdir`, each checked against /proc/<pid>/cmdline before a signal), the 3 sysctls the kubelet changes
restored, everything mounted under `workdir` unmounted, and the host paths the kubelet and the shims hard-code
emptied. Every step of a boot has a timeout and fails with the log tail that says why.

Pitfalls of this host kind (all measured, see ../shared/k8s/kubelet/README.md): no CAP_SYS_RESOURCE (negative
oom_score_adj is refused: restrict_oom_score_adj), crun refuses cgroup hybrid mode (runc), a CNI config must exist
before containerd starts, the kubelet's Node IP cannot be loopback (the Node gets the host's interface address; a
hostNetwork Ray pod is started with an explicit --node-ip-address=127.0.0.N), kubeadm reads kubelet.conf's
absolute host paths inside its chroot (the symlink <kroot><kroot> -> /), and some paths ignore --root-dir
(/var/lib/kubelet/device-plugins, /var/log/pods, /run/containerd/{s,runc,fifo}, cgroups /kubepods): ONE real kubelet
per host.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from ray_nodeless.errors import BackendError

logger = logging.getLogger(__name__)

# build_node.sh's output (keep in sync with scripts/k8s/build_node.sh).
DEFAULT_NODE_DIR = Path.home() / ".cache" / "ray-nodeless" / "k8s-node"
NODE_DIR_ENV = "RAY_NODELESS_K8S_NODE"
# The sysctls the kubelet sets at start with no opt-out (vm.overcommit_memory 0->1, kernel.panic 1->10,
# kernel.panic_on_oops 0->1), and three it may touch: saved before it starts, restored on stop.
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
IMAGES = ("pause.tar", "ray-host.tar")
SANDBOX_IMAGE = "local/pause:3.4"
STOP_GRACE_S = 10.0
CONTAINERD_START_S = 20.0
# Host paths the kubelet and containerd's shims use whatever --root-dir says (emptied on stop).
HOST_DIRS = ("/var/lib/kubelet/device-plugins", "/var/log/pods", "/run/containerd/runc/k8s.io", "/run/containerd/runc",
             "/run/containerd/s", "/run/containerd/fifo", "/run/containerd", "/var/lib/kubelet")
JOIN_ETC = "/etc/ray-nodeless"     # where the kubeadm user data writes its JoinConfiguration (core/kube_join.py)


def node_dir() -> Path:
    return Path(os.environ.get(NODE_DIR_ENV) or DEFAULT_NODE_DIR)


def cri_socket(workdir: str | os.PathLike) -> str:
    """containerd's socket of a machine at `workdir` (what `join.cri_socket` must say for its kubeadm join)."""
    return str(Path(workdir) / "run" / "containerd.sock")


def _tail(path: Path, n: int = 2500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


class RealKubeletMachine:
    """containerd + kubelet (+ kubeadm join) of one machine, all state under `workdir`; see the module docstring.
    Any process may stop what another started: everything it needs is in `workdir`."""

    def __init__(self, workdir: str | os.PathLike, node: str | os.PathLike | None = None):
        self.w = Path(workdir).resolve()
        self.node = Path(node or node_dir())
        self.bin = self.node / "bin"
        self.run = self.w / "run"
        self.kroot = self.w / "kroot"
        self.logs = self.w / "logs"
        self.pids = self.w / "pids"
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen] = {}     # the ones this object started

    # ------------------------------------------------------------------------------------------------ state

    @property
    def machine_file(self) -> Path:
        return self.w / "machine-id"

    def machine_id(self) -> str | None:
        """The machine this workdir boots (None: free)."""
        try:
            return self.machine_file.read_text().strip() or None
        except OSError:
            return None

    def pid(self, name: str) -> int | None:
        """The live pid of `name` (containerd, kubelet, join) started for this workdir, else None."""
        proc = self._procs.get(name)
        if proc is not None:     # ours: its cmdline may still be ours (fork before exec), poll() knows
            return proc.pid if proc.poll() is None else None
        try:
            pid = int((self.pids / f"{name}.pid").read_text())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        # a recycled pid runs something else: ours all name a path under the workdir
        return pid if str(self.w).encode() in cmd else None

    def live(self) -> dict[str, int]:
        return {n: p for n in ("join", "kubelet", "containerd") if (p := self.pid(n)) is not None}

    # ------------------------------------------------------------------------------------------------ boot

    def boot(self, machine_id: str, user_data: str, timeout_s: float = 180.0) -> None:
        """Boot this machine from its user data: returns once the kubelet runs (the join goes on: the Node registers
        a few seconds later). BackendError with the log tail of the step that failed; what started is stopped."""
        with self._lock:
            if self.machine_id() not in (None, machine_id):
                raise BackendError(f"{self.w} already boots machine {self.machine_id()} (one real kubelet per host)")
            missing = [f for f in ("kubelet", "kubeadm", "containerd", "runc", "ctr") if not (self.bin / f).exists()]
            if missing:
                self.machine_file.unlink(missing_ok=True)     # free the host's kubelet slot again
                raise BackendError(f"real kubelet: {', '.join(missing)} missing in {self.bin}; run "
                                   f"scripts/k8s/build_node.sh (make k8s)")
            for d in (self.run, self.logs, self.pids, self.kroot / "etc/kubernetes/manifests",
                      self.kroot / "var/lib/kubelet", self.w / "kubelet-root", self.w / "shim"):
                d.mkdir(parents=True, exist_ok=True)
            self.machine_file.write_text(machine_id + "\n")
            deadline = time.monotonic() + timeout_s
            try:
                self._start_containerd(deadline)
                self._save_sysctls()
                self._run_user_data(machine_id, user_data)
                self._start_kubelet(deadline)
            except BaseException:
                self._stop_locked()
                raise

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env or self._env(), cwd=self.w, start_new_session=True)
        finally:
            log.close()
        (self.pids / f"{name}.pid").write_text(str(proc.pid))
        self._procs[name] = proc
        return proc

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KUBECONFIG"))}
        env["PATH"] = f"{self.w / 'shim'}:{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def _ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "ctr"), "--address", cri_socket(self.w), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout)

    def _start_containerd(self, deadline: float) -> None:
        cni = self.w / "cni"
        (cni / "conf").mkdir(parents=True, exist_ok=True)
        # A CNI config must exist before containerd starts (the Node stays NotReady otherwise), even though the Ray
        # pods are hostNetwork; containerd did not pick up one written later.
        (cni / "conf" / "10-bridge.conflist").write_text(
            '{"cniVersion": "0.4.0", "name": "rnk", "plugins": [\n'
            '  {"type": "bridge", "bridge": "rnkbr0", "isGateway": true, "ipMasq": false,\n'
            '   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.77.0/24"}]], '
            f'"dataDir": "{cni / "ipam"}"}}}},\n  {{"type": "loopback"}}]}}\n')
        sock = cri_socket(self.w)
        (self.w / "containerd.toml").write_text(f"""version = 2
root = "{self.w / 'containerd/root'}"
state = "{self.w / 'containerd/state'}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = "{self.run / 'containerd-debug.sock'}"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{self.bin / 'runc'}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{self.node / 'cni/bin'}"
    conf_dir = "{cni / 'conf'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.w / 'containerd/opt'}"
""")
        proc = self._spawn("containerd", [str(self.bin / "containerd"), "--config", str(self.w / "containerd.toml")])
        until = min(deadline, time.monotonic() + CONTAINERD_START_S)
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > until:
                raise BackendError(f"containerd did not start (socket {sock}):\n{_tail(self.logs / 'containerd.log')}")
            time.sleep(0.1)
        for image in IMAGES:
            r = self._ctr("images", "import", str(self.node / "images" / image))
            if r.returncode != 0:
                raise BackendError(f"ctr images import {image} failed: {r.stderr.strip()[-1000:]}")

    def _save_sysctls(self) -> None:
        saved = self.w / "sysctl.saved"
        if saved.exists():      # from a boot whose stop never ran: those are the host's values
            return
        lines = []
        for k in SYSCTLS:
            try:
                lines.append(f"{k} {Path('/proc/sys', k).read_text().strip()}")
            except OSError:
                pass
        saved.write_text("\n".join(lines) + "\n")

    def _write_shims(self) -> None:
        # `kubeadm join` on this machine: its files under the machine's root; --config names a host file (the user
        # data wrote it), which --rootfs reads inside the chroot: copy it there.
        shim = self.w / "shim" / "kubeadm"
        shim.write_text(f"""#!/bin/bash
# kubeadm of machine {self.w} (written by ray_nodeless/providers/local/real_kubelet.py)
set -eu
REAL={shlex.quote(str(self.bin / 'kubeadm'))}
KROOT={shlex.quote(str(self.kroot))}
if [ "${{1:-}}" = join ]; then
  prev=""
  for a in "$@"; do
    case "$a" in --config=*) cfg=${{a#--config=}};; *) [ "$prev" = --config ] && cfg=$a;; esac
    prev=$a
  done
  if [ -n "${{cfg:-}}" ]; then mkdir -p "$KROOT$(dirname "$cfg")"; cp "$cfg" "$KROOT$cfg"; fi
  exec "$REAL" "$@" --rootfs "$KROOT" --ignore-preflight-errors=all -v=2
fi
exec "$REAL" "$@"
""")
        shim.chmod(0o755)
        # kubelet.conf (written by the kubelet, outside the chroot) holds absolute host paths: make them resolve
        # inside kubeadm's chroot
        link = Path(str(self.kroot) + str(self.kroot))
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to("/")

    def _run_user_data(self, machine_id: str, user_data: str) -> None:
        self._write_shims()
        for f in ("var/lib/kubelet/kubeadm-flags.env", "etc/kubernetes/kubelet.conf",
                  "etc/kubernetes/bootstrap-kubelet.conf"):
            (self.kroot / f).unlink(missing_ok=True)
        # a new machine, a new identity: the previous machine's client certificate would register as that one
        # (the Node authorizer then refuses the new Node's Lease: "system:node:<old> cannot get leases")
        shutil.rmtree(self.kroot / "var/lib/kubelet/pki", ignore_errors=True)
        script = self.w / "user-data"
        script.write_text(user_data)
        env = dict(self._env(), MACHINE_ID=machine_id, RAY_CLOUD_INSTANCE_ID=machine_id)
        self._spawn("join", ["/bin/bash", str(script)], env)

    def _start_kubelet(self, deadline: float) -> None:
        flags_env = self.kroot / "var/lib/kubelet/kubeadm-flags.env"
        while not flags_env.exists():
            if self.pid("join") is None:
                raise BackendError(f"the join script exited before kubeadm configured the kubelet:\n"
                                   f"{_tail(self.logs / 'join.log')}")
            if time.monotonic() > deadline:
                raise BackendError(f"kubeadm wrote no {flags_env} in time:\n{_tail(self.logs / 'join.log')}")
            time.sleep(0.1)
        time.sleep(0.2)     # kubeadm writes the file in one go; let it close it
        # KUBELET_KUBEADM_ARGS="--flag=v --flag=v" (an environment file: one quoted value)
        value = flags_env.read_text().split("=", 1)[-1]
        args = shlex.split(" ".join(shlex.split(value)))
        k = self.kroot
        # what kubeadm's systemd drop-in (10-kubeadm.conf) runs
        argv = [str(self.bin / "kubelet"),
                f"--bootstrap-kubeconfig={k / 'etc/kubernetes/bootstrap-kubelet.conf'}",
                f"--kubeconfig={k / 'etc/kubernetes/kubelet.conf'}", f"--config={k / 'var/lib/kubelet/config.yaml'}",
                f"--cert-dir={k / 'var/lib/kubelet/pki'}", f"--root-dir={self.w / 'kubelet-root'}", "-v=2", *args]
        self._spawn("kubelet", argv)
        time.sleep(0.5)
        if self.pid("kubelet") is None:
            raise BackendError(f"the kubelet exited at once:\n{_tail(self.logs / 'kubelet.log')}")
        logger.info("real kubelet started for machine %s (%s)", self.machine_id(), self.w)

    # ------------------------------------------------------------------------------------------------ stop

    def stop(self) -> None:
        """The machine vanishes: see the module docstring. Idempotent; safe from any process."""
        with self._lock:
            self._stop_locked()

    def _kill(self, name: str, grace: float = STOP_GRACE_S) -> None:
        pid = self.pid(name)
        if pid is None:
            self._procs.pop(name, None)
            (self.pids / f"{name}.pid").unlink(missing_ok=True)
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + grace
            while time.monotonic() < end and Path(f"/proc/{pid}").exists():
                try:    # reap it if it is our child
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:
                    pass
                time.sleep(0.1)
            if not Path(f"/proc/{pid}").exists():
                break
        proc = self._procs.pop(name, None)
        if proc is not None:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        (self.pids / f"{name}.pid").unlink(missing_ok=True)

    def _stop_locked(self) -> None:
        # The host-wide paths are this machine's only if it booted here (it holds the host's one kubelet slot)
        booted = self.machine_id() is not None or bool(self.live())
        self._kill("join", grace=2.0)
        self._kill("kubelet")
        self._restore_sysctls()
        if self.pid("containerd") is not None:
            # the pods' containers outlive the kubelet and containerd (their shims keep them)
            try:
                tasks = self._ctr("tasks", "ls", "-q", timeout=20).stdout.split()
                for t in tasks:
                    self._ctr("tasks", "kill", "-s", "SIGKILL", t, timeout=20)
                end = time.monotonic() + 10
                while tasks and time.monotonic() < end:
                    time.sleep(0.3)
                    for t in tasks:
                        self._ctr("tasks", "rm", "-f", t, timeout=20)
                    tasks = self._ctr("tasks", "ls", "-q", timeout=20).stdout.split()
                for c in self._ctr("containers", "ls", "-q", timeout=20).stdout.split():
                    self._ctr("containers", "rm", c, timeout=20)
            except (OSError, subprocess.TimeoutExpired) as e:
                logger.warning("real kubelet %s: removing containers: %s", self.w, e)
        self._kill("containerd")
        self._unmount()
        if booted:
            self._clean_host_paths()
        self.machine_file.unlink(missing_ok=True)

    def _restore_sysctls(self) -> None:
        saved = self.w / "sysctl.saved"
        if not saved.exists():
            return
        for line in saved.read_text().splitlines():
            k, _, v = line.partition(" ")
            try:
                Path("/proc/sys", k).write_text(v + "\n")
            except OSError as e:
                logger.warning("cannot restore sysctl %s=%s: %s", k, v, e)
        saved.unlink()

    def _unmount(self) -> None:
        try:
            out = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True,
                                 timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        prefix = str(self.w) + "/"
        for m in sorted((ln for ln in out.splitlines() if ln.startswith(prefix)), reverse=True):
            if subprocess.run(["umount", m], capture_output=True, timeout=20).returncode != 0:
                subprocess.run(["umount", "-l", m], capture_output=True, timeout=20)

    def _clean_host_paths(self) -> None:
        for f in ("/var/lib/kubelet/device-plugins/kubelet.sock", "/var/lib/kubelet/device-plugins/DEPRECATION",
                  f"{JOIN_ETC}/kubeadm-join.yaml"):
            Path(f).unlink(missing_ok=True)
        logs = Path("/var/log/pods")
        if logs.is_dir():    # the pods this kubelet ran (ours: every pod dir; one real kubelet per host)
            for d in logs.iterdir():
                subprocess.run(["rm", "-rf", str(d)], timeout=30)
        for empty_dir in (*HOST_DIRS, JOIN_ETC):
            try:
                os.rmdir(empty_dir)
            except OSError:
                pass
        for h in Path("/sys/fs/cgroup").glob("*/kubepods"):
            for sub in sorted((p for p in h.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                try:
                    os.rmdir(sub)
                except OSError:
                    pass
            try:
                os.rmdir(h)
            except OSError:
                pass
