"""A machine launched by ray_nodeless joins Kubernetes through a REAL kubelet (1.36.x on containerd 1.6 + runc,
built by scripts/k8s/build_node.sh), and a Ray task runs in the pod that kubelet runs.

`ray up` of a temp copy of cluster-configs/local-k8s-cpu-head.yaml (local backend, `registration: kubernetes`,
autoscaler v2) against a real control plane (`ControlPlane(node_joins=True)`: bootstrap tokens, bootstrapsigner,
CSR signing) readied for kubeadm joins by the real kubeadm's own init phases. The node type `real_worker` has
`local_real_kubelet` (providers/local/real_kubelet.py): its machine boots the join user data the registration
generated, unchanged: a `kubeadm join` whose JoinConfiguration is kubeadm.k8s.io/v1beta4 (picked from the API
server's 1.36; v1beta4 from 1.31) with criSocket = the machine's containerd; kubeadm discovers the
cluster with the bootstrap token, the kubelet TLS-bootstraps (its CSR approved and signed by the real
controller-manager) and registers the Node with the labels and taint of the user data. The registration then creates
the Ray pod (pods.ray_pod(), the template of testing/real_kubelet.py: a locally built image, hostNetwork, the venv
hostPath-mounted), the real scheduler binds it, the real kubelet runs it in a container, the Ray worker inside joins
the head on 127.0.0.1 and runs the task (it sees the pod's cgroup). Idle removal ends pod, Node and machine, and the
machine's kubelet, containers and containerd stop, the kubelet's sysctls restored. `ray down` leaves nothing.

Selected by `pytest -k real_kubelet`; needs root (a kubelet mounts, creates cgroups and sets sysctls) and one real
kubelet per host: it holds the host's kubelet paths for its duration. FIGURES: launch -> Node registered -> Ready
-> pod bound -> Running, and the kubelet's own boot.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.real_kubelet import SYSCTLS, RealKubeletMachine, node_dir
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.testing.clock import wait_for
from ray_nodeless.testing.k8s_control_plane import k8s_version
from tests.e2e.clusters import RAY_ENV, k8s_cluster_copy, ray_down, ray_up, write_config
from tests.e2e.test_k8s_local_e2e import Timeline, cleanup, scheduled_by
from tests.registrations.kubernetes.conftest import RBAC, SA

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="a real kubelet needs root (mounts, cgroups, sysctls)")]

NODE_IP = "127.0.0.77"          # the Ray node inside the hostNetwork pod (the Node's own IP is the host's eth0)
PORT_BASE = 24500               # its ports (a block no played node of the suite uses: they start at 20000 + 50 k)
REAL_TYPE = "real_worker"


def sysctls() -> dict[str, str]:
    return {k: Path("/proc/sys", k).read_text().strip() for k in SYSCTLS if Path("/proc/sys", k).exists()}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A control plane readied for kubeadm joins, and the real kubelet's workdir (short: sockets live there)."""
    from ray_nodeless.testing.k8s_control_plane import ControlPlane
    from ray_nodeless.testing.real_kubelet import ensure_node_binaries, prepare_kubeadm_cluster, stop_real_kubelet
    if Path("/var/lib/kubelet/device-plugins/kubelet.sock").exists():
        pytest.fail("another kubelet runs on this host (/var/lib/kubelet/device-plugins/kubelet.sock): one per host")
    ensure_node_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="rnk-", dir="/tmp"))
    plane = ControlPlane(tmp_path_factory.mktemp("k8s-real"), node_joins=True)
    plane.start()
    try:
        plane.apply_manifest(RBAC)
        plane.sa_kubeconfig = plane.service_account_kubeconfig(*SA, Path(plane.workdir) / "sa.kubeconfig")
        keys = prepare_kubeadm_cluster(plane, workdir)
        yield plane, workdir, keys
    finally:
        stop_real_kubelet(workdir)
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def real_config(tmp_path: Path, plane, workdir: Path, keys) -> tuple[dict, Path]:
    from ray_nodeless.testing.real_kubelet import ray_host_pod_template
    # the join: kubeadm_api auto (the server says v1.36.x -> v1beta4)
    cfg = k8s_cluster_copy("rk", plane, keys.join_block(), state_dir=str(tmp_path / "state"),
                           local_real_kubelet={"node_type": REAL_TYPE, "workdir": str(workdir), "boot_timeout_s": 180,
                                               # explicit: the head's command runner gives the monitor its own HOME
                                               "node_dir": str(node_dir())})
    k = cfg["provider"]["kubernetes"]
    k["join_timeout_s"] = 240
    k["pod_template"] = ray_host_pod_template(node_ip=NODE_IP, port_base=PORT_BASE)
    cfg["available_node_types"][REAL_TYPE] = {"min_workers": 0, "max_workers": 1, "node_config": {},
                                              "resources": {"CPU": 1, "real_kubelet": 1}}
    return cfg, write_config(cfg, tmp_path)


def diagnose(workdir: Path) -> str:
    """The machine's logs, for a failure message."""
    out = []
    for name in ("join", "kubelet", "containerd"):
        p = workdir / "logs" / f"{name}.log"
        if p.exists():
            lines = p.read_text(errors="replace").splitlines()
            out.append(f"--- {name}.log (last 25 of {len(lines)} lines)\n" + "\n".join(lines[-25:]))
    return "\n".join(out) or f"(no logs in {workdir})"


def test_real_kubelet_kubeadm_join_runs_the_ray_pod_and_teardown_leaves_nothing(real, tmp_path: Path) -> None:
    plane, workdir, keys = real
    cfg, path = real_config(tmp_path, plane, workdir, keys)
    cluster = cfg["cluster_name"]
    admin = plane.api_client()
    core = client.CoreV1Api(admin)
    sel = L.cluster_selector(cluster)
    backend = LocalBackend.from_provider(dict(cfg["provider"]), cluster)
    machine = RealKubeletMachine(workdir)
    before = sysctls()
    timeline = Timeline(admin, cluster)
    worker = None
    try:
        ray_up(path)
        t0 = time.time()
        driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, socket, time, ray
            ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR", log_to_driver=False)
            @ray.remote(resources={{"real_kubelet": 1}}, num_cpus=0)
            def f():
                cg = open("/proc/self/cgroup").read()
                return time.time(), os.environ["RAY_CLOUD_INSTANCE_ID"], ray.util.get_node_ip_address(), \\
                    "kubepods" in cg
            print("RESULT", *ray.get(f.remote()))
        """)], env=RAY_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        claimed = None
        deadline = time.monotonic() + 420
        while driver.poll() is None:
            # fail fast when the machine's boot failed (the player frees the host's kubelet slot again)
            claimed = claimed or machine.machine_id()
            if (claimed and machine.machine_id() is None) or time.monotonic() > deadline:
                driver.kill()
                pytest.fail(f"the task did not run ({'the boot of ' + claimed + ' failed' if claimed else 'timeout'})"
                            f"; see the head's monitor.log:\n{diagnose(workdir)}")
            time.sleep(1)
        out, err = driver.communicate()
        assert driver.returncode == 0, err[-3000:] + "\n" + diagnose(workdir)
        started, worker, ip, in_pod = next(ln.split()[1:] for ln in out.splitlines() if ln.startswith("RESULT "))
        task_s = float(started) - t0
        assert ip == NODE_IP, "the task ran on another Ray node than the pod's"
        assert in_pod == "True", "the task's process is not in a kubepods cgroup: not in the kubelet's container"

        # The machine booted the real kubelet (the one of this host), from its kubeadm user data.
        assert machine.machine_id() == worker and {"kubelet", "containerd"} <= set(machine.live())
        join_doc = yaml.safe_load((workdir / "kroot" / "etc" / "ray-nodeless" / "kubeadm-join.yaml").read_text())
        assert join_doc["apiVersion"] == "kubeadm.k8s.io/v1beta4"
        assert join_doc["nodeRegistration"]["criSocket"] == keys.cri_socket
        assert "This node has joined the cluster" in (workdir / "logs" / "join.log").read_text()

        # Its Node: the real kubelet's (version, runtime), named and labelled as the user data says, Ready.
        node = core.read_node(worker)
        info = node.status.node_info
        assert info.kubelet_version == f"v{k8s_version()}" and info.container_runtime_version.startswith("containerd://")
        lab = node.metadata.labels
        assert {k: lab.get(k) for k in (L.MACHINE_ID, L.NODE_TYPE, L.CLUSTER, L.JOIN_METHOD)} == {
            L.MACHINE_ID: worker, L.NODE_TYPE: REAL_TYPE, L.CLUSTER: cluster, L.JOIN_METHOD: "kubeadm"}
        assert (L.TAINT_KEY, cluster, "NoSchedule") in {(t.key, t.value, t.effect) for t in node.spec.taints or []}
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        # TLS bootstrap: the kubelet's client certificate came from a CSR of the bootstrap token's user, approved
        # and signed by the controller-manager.
        csrs = client.CertificatesV1Api(admin).list_certificate_signing_request().items
        mine = [c for c in csrs if c.spec.username == f"system:bootstrap:{keys.token.split('.')[0]}"]
        assert mine and all(c.status.certificate for c in mine), [c.metadata.name for c in csrs]
        assert any(cond.type == "Approved" for c in mine for cond in c.status.conditions or [])

        # Its Ray pod: bound by the real scheduler, run by the real kubelet in a containerd container.
        [pod] = core.list_namespaced_pod("ray", label_selector=f"{L.MACHINE_ID}={worker}").items
        assert pod.spec.node_name == worker and pod.status.phase == "Running"
        assert "default-scheduler" in scheduled_by(core, pod.metadata.name)
        assert pod.status.container_statuses[0].container_id.startswith("containerd://")

        launched = next(m.launched_at for m in backend.list_machines() if m.id == worker)
        steps = timeline.steps(worker, launched)
        print(f"\nFIGURES real kubelet e2e (kubeadm join): pending task -> running {task_s:.1f} s; "
              + "; ".join(f"{k} {v:.2f} s" for k, v in steps.items()))
        assert {"node_added", "node_ready", "pod_bound", "pod_running"} <= set(timeline.of(worker))

        # Idle removal: pod, Node and machine go, and with the machine its kubelet, containers and containerd.
        wait_for(lambda: not core.list_namespaced_pod("ray", label_selector=sel).items
                 and not core.list_node(label_selector=sel).items, 180, "the idle worker's pod and Node gone",
                 interval=1)
        wait_for(lambda: worker not in {m.id for m in backend.list_machines()}, 60, "the idle machine terminated",
                 interval=1)
        wait_for(lambda: not machine.live() and machine.machine_id() is None, 60,
                 "the machine's kubelet, containerd and join stopped", interval=0.5)
        assert sysctls() == before, "the kubelet's sysctls were not restored"
        assert not [m for m in Path("/proc/self/mounts").read_text().splitlines() if str(workdir) in m]

        ray_down(path)
        assert backend.list_machines() == []
        assert not core.list_node(label_selector=sel).items
    finally:
        timeline.close()
        try:
            cleanup(backend, core, cluster, [worker] if worker else [])
        finally:
            machine.stop()
            admin.close()
