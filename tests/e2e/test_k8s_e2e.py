"""`registration: kubernetes` end to end: `ray up` with the real Ray autoscaler, the AWS backend under moto (eks join
user data), a REAL Kubernetes control plane (API server, scheduler, controller-manager, RBAC on; the provider runs
as the ServiceAccount of cluster-configs/kubernetes-rbac.yaml), and every machine's kubelet played
(`kubernetes.played: true`): a {GPU: 1} task brings up the planned instance, its Node registers Ready with the labels
and taint, the scheduler binds the Ray pod there, the task runs in it (RAY_CLOUD_INSTANCE_ID = the EC2 id), the idle
node goes (pod, Node, instance, process), and `ray down` leaves no Node, pod or process.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes import client

from ray_nodeless.providers.local.runner import runner_marker
from ray_nodeless.providers.local.scoped_stop import stop_marked_processes
from ray_nodeless.providers.local.settings import default_state_dir
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.testing.moto_server import MotoServer
from tests.e2e.clusters import RAY_ENV, k8s_cluster_copy, processes_of, ray_down, ray_up, write_config
from tests.registrations.kubernetes.conftest import cp, wait_for  # noqa: F401  (module-scoped control plane)

pytestmark = pytest.mark.e2e


def test_ray_up_gpu_task_on_a_kubernetes_node_and_ray_down(moto: MotoServer, cp, tmp_path: Path) -> None:  # noqa: F811
    cfg = k8s_cluster_copy("k8s", cp, moto=moto, join={"method": "eks", "cluster": "test-eks", "endpoint": cp.server,
                                                       "ca": "Y2E=", "cidr": "10.100.0.0/16"})
    cluster = cfg["cluster_name"]
    path = write_config(cfg, tmp_path)
    env = RAY_ENV
    ec2 = moto.client()
    core = client.CoreV1Api(cp.api_client())
    sel = L.cluster_selector(cluster)
    marker = runner_marker(default_state_dir(cluster, "-kubelet") / "home")   # the played head's runner

    def instances() -> dict[str, str]:
        r = ec2.describe_instances(Filters=[{"Name": "tag:ray-cluster-name", "Values": [cluster]}])
        return {i["InstanceId"]: i["State"]["Name"] for res in r["Reservations"] for i in res["Instances"]}

    worker = None
    try:
        ray_up(path, env)
        t0 = time.time()
        driver = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, ray
            ray.init(address="{cfg['provider']['gcs_address']}", logging_level="ERROR", log_to_driver=False)
            @ray.remote(num_gpus=1)
            def f():
                return os.environ["RAY_CLOUD_INSTANCE_ID"]
            print("RESULT", ray.get(f.remote()))
        """)], env=env, capture_output=True, text=True, timeout=300)
        task_s = time.time() - t0
        assert driver.returncode == 0, driver.stderr[-3000:]
        worker = next(line.split()[1] for line in driver.stdout.splitlines() if line.startswith("RESULT "))
        assert instances()[worker] == "running"
        [node] = core.list_node(label_selector=f"{L.MACHINE_ID}={worker}").items
        labels = node.metadata.labels
        assert labels[L.CLUSTER] == cluster and labels[L.NODE_TYPE] == "gpu_worker"
        assert labels[L.CAPACITY_TYPE] in ("spot", "on-demand") and labels[L.INSTANCE_TYPE]
        assert any(t.key == L.TAINT_KEY and t.value == cluster for t in node.spec.taints)
        [pod] = core.list_namespaced_pod("ray", label_selector=f"{L.MACHINE_ID}={worker}").items
        assert pod.spec.node_name == node.metadata.name and pod.status.phase == "Running"
        print(f"\nFIGURES e2e: pending GPU task -> result {task_s:.1f} s")
        # idle scale-down: pod, Node, instance and Ray process all go
        wait_for(lambda: not core.list_namespaced_pod("ray", label_selector=sel).items
                 and not core.list_node(label_selector=sel).items, 180, "idle worker's pod and Node gone", interval=1)
        wait_for(lambda: instances()[worker] in ("terminated", "shutting-down"), 60, "instance terminated", interval=1)
        wait_for(lambda: not processes_of(worker), 30, "worker Ray process gone", interval=1)

        ray_down(path, env)
        assert set(instances().values()) <= {"terminated", "shutting-down"}
        assert not core.list_node(label_selector=sel).items
        assert not core.list_namespaced_pod("ray", label_selector=sel).items
        assert stop_marked_processes(marker) == 0, "ray down left the head's processes behind"
    finally:
        ids = [i for i, s in instances().items() if s not in ("terminated", "shutting-down")]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
        for pid in processes_of(worker) if worker else []:
            try:
                os.killpg(pid, 9)
            except OSError:
                pass
        stop_marked_processes(marker, force=True)
        for n in core.list_node(label_selector=sel).items:
            core.delete_node(n.metadata.name)
        core.delete_collection_namespaced_pod("ray", label_selector=sel, grace_period_seconds=0)
        # the played kubelets' records (default_state_dir(cluster, "-kubelet")): empty by now
        shutil.rmtree(default_state_dir(cluster, "-kubelet"), ignore_errors=True)
