#!/usr/bin/env python3
"""Self-check of the local Kubernetes control plane (ray_nodeless.testing.k8s_control_plane).

    .venv/bin/python scripts/k8s/selfcheck.py          # builds the binaries first if needed (5-20 min, once)

Starts a ControlPlane in a temporary directory, creates a namespace, plays a kubelet for one Node (labels, a
NoSchedule taint, Ready status kept fresh by a heartbeat thread), creates a Pod with a nodeSelector and the
toleration, and waits (watch, bounded) until the real kube-scheduler binds it to that Node. Also checks that a Pod
without the toleration stays Pending/Unschedulable, that a ServiceAccount token authenticates and is subject to RBAC,
and that restart_apiserver() brings the API server back on the same port. Stops everything it started and checks
that no process is left. Exit code 0 on success; the temporary directory (logs) is kept on failure.
"""
from __future__ import annotations

import datetime
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from ray_nodeless.testing.k8s_control_plane import ControlPlane  # noqa: E402

NS = "selfcheck"
NODE = "nodeless-worker-1"
TAINT_KEY = "ray-nodeless.io/cluster"
TAINT_VALUE = "c1"
MACHINE_LABEL = "ray-nodeless.io/machine-id"
BIND_TIMEOUT_S = 60
HEARTBEAT_S = 5.0


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_status() -> dict:
    t = now()
    res = {"cpu": "4", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "1"}
    return {"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "played by selfcheck",
                        "lastHeartbeatTime": t, "lastTransitionTime": t}],
        "capacity": res, "allocatable": res}}


def heartbeat(core: client.CoreV1Api, stop: threading.Event) -> None:
    """Play the kubelet: keep the Node's Ready condition fresh so the node lifecycle controller never taints it."""
    while not stop.wait(HEARTBEAT_S):
        try:
            core.patch_node_status(NODE, node_status())
        except Exception as e:  # e.g. while the API server restarts
            print(f"  heartbeat: {type(e).__name__}", flush=True)


def wait_bound(core: client.CoreV1Api, name: str, timeout: float) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    w = watch.Watch()
    try:
        while time.monotonic() < deadline:
            remaining = max(1, int(deadline - time.monotonic()))
            for ev in w.stream(core.list_namespaced_pod, NS, field_selector=f"metadata.name={name}",
                               timeout_seconds=remaining, _request_timeout=remaining + 5):
                pod = ev["object"]
                if pod.spec.node_name:
                    return pod
                if time.monotonic() >= deadline:
                    break
    finally:
        w.stop()
    pod = core.read_namespaced_pod(name, NS)
    if pod.spec.node_name:
        return pod
    conds = [(c.type, c.status, c.reason, c.message) for c in (pod.status.conditions or [])]
    raise AssertionError(f"pod {name} not bound within {timeout} s; conditions: {conds}")


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="k8s-selfcheck-"))
    ok = False
    stop_hb = threading.Event()
    cp = ControlPlane(workdir)
    try:
        t0 = time.monotonic()
        cp.start()
        print(f"control plane ready in {cp.startup_seconds:.1f} s (start() incl. any build: "
              f"{time.monotonic() - t0:.1f} s) at {cp.server}; pids {cp.pids}", flush=True)
        api = cp.api_client()
        core = client.CoreV1Api(api)

        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        core.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name=NODE, labels={
                "node.kubernetes.io/instance-type": "g6.xlarge", MACHINE_LABEL: "m-1",
                "kubernetes.io/hostname": NODE}),
            spec=client.V1NodeSpec(provider_id="nodeless://m-1", taints=[
                client.V1Taint(key=TAINT_KEY, value=TAINT_VALUE, effect="NoSchedule")])))
        core.patch_node_status(NODE, node_status())
        hb = threading.Thread(target=heartbeat, args=(core, stop_hb), daemon=True)
        hb.start()
        print("node created, Ready", flush=True)

        # ServiceAccount admission is on: a Pod needs the namespace's default ServiceAccount and its token first
        t = time.monotonic()
        sa_token = cp.service_account_token(NS, "default", timeout=30)
        print(f"default ServiceAccount token in {NS} after {time.monotonic() - t:.1f} s", flush=True)

        t = time.monotonic()
        core.create_namespaced_pod(NS, client.V1Pod(
            metadata=client.V1ObjectMeta(name="ray-worker"),
            spec=client.V1PodSpec(
                node_selector={MACHINE_LABEL: "m-1"},
                tolerations=[client.V1Toleration(key=TAINT_KEY, operator="Equal", value=TAINT_VALUE,
                                                 effect="NoSchedule")],
                containers=[client.V1Container(name="ray", image="rayproject/ray:2.60.0", resources=
                    client.V1ResourceRequirements(requests={"cpu": "3", "memory": "12Gi"},
                                                  limits={"nvidia.com/gpu": "1"}))])))
        core.create_namespaced_pod(NS, client.V1Pod(
            metadata=client.V1ObjectMeta(name="intruder"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="x", image="busybox")])))
        pod = wait_bound(core, "ray-worker", BIND_TIMEOUT_S)
        assert pod.spec.node_name == NODE, pod.spec.node_name
        print(f"pod bound to {pod.spec.node_name} {time.monotonic() - t:.1f} s after creation", flush=True)

        deadline = time.monotonic() + 15
        while True:
            i = core.read_namespaced_pod("intruder", NS)
            assert not i.spec.node_name, f"untolerating pod was bound to {i.spec.node_name}"
            reasons = [c.reason for c in (i.status.conditions or []) if c.type == "PodScheduled"]
            if reasons == ["Unschedulable"]:
                break
            assert time.monotonic() < deadline, f"intruder not reported Unschedulable: {i.status.conditions}"
            time.sleep(0.3)
        print("pod without the toleration: Unschedulable", flush=True)

        # a ServiceAccount token authenticates; RBAC gives the default account nothing
        kc = cp.write_kubeconfig(workdir / "sa.kubeconfig", sa_token, user="sa")
        for sa_api in (config.new_client_from_config(config_file=str(kc)), cp.api_client(sa_token)):
            with sa_api:
                try:
                    client.CoreV1Api(sa_api).list_namespaced_pod(NS)
                    raise AssertionError("default ServiceAccount could list pods: RBAC not enforced")
                except ApiException as e:
                    assert e.status == 403, e.status
                    assert "system:serviceaccount:selfcheck:default" in (e.body or ""), e.body
        with config.new_client_from_config(config_file=str(cp.admin_kubeconfig)) as admin_api:
            names = [n.metadata.name for n in client.CoreV1Api(admin_api).list_namespace().items]
            assert NS in names, names
        print("kubeconfigs load; ServiceAccount token authenticates and RBAC forbids it (403)", flush=True)

        port, old_pid = cp.ports["kube-apiserver"], cp.pids["kube-apiserver"]
        t = time.monotonic()
        cp.restart_apiserver()
        assert cp.pids["kube-apiserver"] != old_pid and cp.ports["kube-apiserver"] == port
        assert core.read_namespaced_pod("ray-worker", NS).spec.node_name == NODE
        print(f"restart_apiserver: back on port {port} in {time.monotonic() - t:.1f} s, data kept", flush=True)

        core.delete_namespaced_pod("ray-worker", NS, grace_period_seconds=0)
        api.close()
        ok = True
    finally:
        stop_hb.set()
        pids = list(cp.pids.values())
        cp.stop()
        cp.stop()  # idempotent
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        if alive:
            print(f"FAIL: processes still alive after stop(): {alive}", flush=True)
            ok = False
        else:
            print(f"stopped {len(pids)} processes", flush=True)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}", flush=True)
    print("SELFCHECK PASSED" if ok else "SELFCHECK FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
