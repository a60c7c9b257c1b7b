#!/usr/bin/env python3
"""The provider's listing and the Kubernetes registration's housekeeping per autoscaler loop at 100 and 1,000 kwok
Nodes (issue 27), with Ray's KubeRay node provider's listing of the same pods beside it, in one run.

    .venv/bin/python benches/bench_kwok_scale.py                              # 100 and 1,000 Nodes, 12 loops of 5 s
    .venv/bin/python benches/bench_kwok_scale.py --sizes 100,1000 --loops 12 --interval-s 5 --json

Setup, per size N (a fresh control plane each, so that one size's Nodes do not load the next):
- a REAL control plane (ray_nodeless/testing/k8s_control_plane.py: etcd, kube-apiserver, kube-scheduler,
  kube-controller-manager v1.36.x on 127.0.0.1) with cluster-configs/kubernetes-rbac.yaml applied, and
  `kwok` (sigs.k8s.io/kwok, from the same build) playing the kubelets of the Nodes annotated
  `kwok.x-k8s.io/node=fake`: it keeps them Ready (Leases) and runs the pods bound to them (phase Running, a pod IP).
- NodelessProvider on the in-memory backend (ray_nodeless.testing.fake_backend), `registration: kubernetes`
  (kubeadm join, not played), as the ServiceAccount, built with a MonitorContext that acts on the cluster (as Ray's
  monitor builds it), `list_cache_s: 0`. The N machines are launched through Ray's `create_node` (one call, N
  workers of type `w`): the registration writes each launch's join user data and tracks the machines (after_launch).
- The machines "boot": the bench registers each machine's Node as the played kubelet of providers/local/kubelet.py
  does (labels and taints parsed from the user data the backend was given, capacity from the instance type), plus
  kwok's annotation. From there on it is the production path: the registration's Node watch sees each Node Ready
  and creates its Ray pod (`_ensure_pod`), the real scheduler binds it, kwok runs it, the pod watch records its IP.
  The pod template carries KubeRay's labels (ray.io/cluster, ray.io/node-type, ray.io/group) so that the KubeRay
  peer lists the very same pods.
Setup figures: time to create the N Nodes, until all are Ready (kwok), until all pods are Running (API), until Ray's
listing sees all N machines running (the registration's describe); the bench process's peak RSS (getrusage).

Measured over `--loops` loops, one every `--interval-s` (5 s: Ray's AUTOSCALER_UPDATE_INTERVAL_S), wall clock:
- "ray update": Ray's listing call `non_terminated_nodes` (the loop's snapshot) and then `node_tags` / `is_running` /
  `internal_ip` of every node, as Ray's update calls them (bench_listing.py's timed_update);
- "lane pass": one pass of the provider's listing lane (`loop.run_once("listing")`: the cloud listing, the
  registration's `describe` of each machine, `observe_listing`, `machines_to_end`), what the loop does per listing;
- the registration's own parts, each timed alone on the same listing: describe x N, observe_listing + machines_to_end,
  and `housekeeping()` (orphan Nodes, pod retries, overdue joins; its thread runs it every 5 s);
- the registration's background threads (Node watch, pod watch, housekeeping): their CPU time per loop, from
  /proc/self/task/<tid>/stat (what handling the watch events costs, decoding included);
- API server requests the registration's client made per loop (counted on its ApiClient's REST client, by verb).
After the loops, once: a resync (what a 410 or a restart costs): list this cluster's Nodes / pods as the watches do
and run each item through the watch handler (`_resync`), timed.
Peer: Ray's `KubeRayNodeProvider` (ray.autoscaler._private.kuberay.node_provider), unpatched, pointed at this API
server through its own out-of-cluster settings (KUBERNETES_SERVICE_HOST / _PORT_HTTPS, RAY_KUBERAY_CLIENT_CERT_PATH /
_KEY_PATH / _CA_CERT_PATH; a client certificate of the plane's CA, group system:masters), a RayCluster `bench-kr-N`
(CRD only; no operator): each of its listing calls GETs the RayCluster and lists its pods (the N pods above); timed
the same way ("ray update"), giving kuberay / ours ratios.
Clean-up: provider stopped, registration closed, kwok and the control plane stopped by their process groups, in
`finally` blocks.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402

import bench_listing as listing_bench  # noqa: E402  (benches/ siblings: the timing helpers)
from bench_listing import timed_update  # noqa: E402
from ray_nodeless.core import kube_join  # noqa: E402
from ray_nodeless.providers.local.kubelet import node_capacity  # noqa: E402
from ray_nodeless.ray_adapter.context import MonitorContext  # noqa: E402
from ray_nodeless.ray_adapter.provider import NodelessProvider  # noqa: E402
from ray_nodeless.registrations.kubernetes import labels as L  # noqa: E402
from ray_nodeless.testing import fake_backend  # noqa: E402
from ray_nodeless.testing.k8s_control_plane import ControlPlane, bin_dir, cache_dir  # noqa: E402
from ray_nodeless.testing.k8s_support import _child_setup, _kill_group  # noqa: E402
from ray_nodeless.testing.kuberay import crd_files  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RBAC = ROOT / "cluster-configs" / "kubernetes-rbac.yaml"
NS = "ray"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
MONITOR = MonitorContext(gcs_address="127.0.0.1:1", acts_on_cluster=True)   # no GCS is reached: nothing here needs one
WORKER_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "w", "ray-node-name": "w",
               "ray-node-status": "up-to-date", "ray-launch-config": "kwok"}
TICK_S = os.sysconf("SC_CLK_TCK")


def provider_config(cluster: str, kuberay_name: str, sa_kubeconfig: Path, server: str) -> dict:
    return {
        "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
        "region": "us-west-2", "list_cache_s": 0, "metrics_port": None, "ray_status_events": 0,
        "reversion": {"enabled": False}, "head_ip": "127.0.0.1", "gcs_address": "127.0.0.1:6399",
        "rules": [{"name": "all", "match": {}, "capacity": ["on-demand"]}],
        "node_type_resources": {"w": {"CPU": 2}},
        "registration": "kubernetes",
        "kubernetes": {
            "kubeconfig": str(sa_kubeconfig), "namespace": NS, "played": False, "pod_grace_s": 0,
            "join": {"method": "kubeadm", "endpoint": server, "token": "abcdef.0123456789abcdef",
                     "ca_cert_hash": "sha256:" + "0" * 64},
            # KubeRay's pod labels, so that the KubeRay peer lists these very pods
            "pod_template": {"metadata": {"labels": {"ray.io/cluster": kuberay_name, "ray.io/node-type": "worker",
                                                     "ray.io/group": "w"}},
                             "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]}},
        },
    }


# ------------------------------------------------------------------------------------------------ figures

def figures(ms: list[float]) -> dict:
    return listing_bench.figures(ms, count_key="n")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def rss_mib() -> dict:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    now = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) / 1024
    return {"peak_rss_mib": round(peak, 1), "rss_now_mib": round(now, 1)}


def thread_cpu_s(threads: list[threading.Thread]) -> float:
    """User + system CPU seconds of these threads so far (Linux /proc/self/task/<tid>/stat)."""
    total = 0
    for t in threads:
        try:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])        # utime, stime (fields 14, 15 of stat)
    return total / TICK_S


class RequestCounter:
    """Counts the requests an ApiClient sends (its REST client's `request`, which every verb goes through)."""

    def __init__(self, api: client.ApiClient):
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        rest = api.rest_client
        inner = rest.request

        def request(method, url, *a, **kw):
            with self._lock:
                query = f"{url} {kw.get('query_params') or ''}".lower()
                key = f"{method} watch" if "watch" in query else method
                self.counts[key] = self.counts.get(key, 0) + 1
            return inner(method, url, *a, **kw)
        rest.request = request

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b.get(k, 0) - a.get(k, 0) for k in sorted(set(a) | set(b)) if b.get(k, 0) - a.get(k, 0)}


# ------------------------------------------------------------------------------------------------ processes

def kwok_stages(work: Path) -> Path:
    """kwok's own stages (its module's kustomize/stage, as build_go.sh fetched it), in one config file: Nodes
    initialised Ready at once and kept so by Lease renewals (heartbeat-with-lease), pods Running once bound (and
    completed / deleted as kwok's `fast` pod stages do). kwok 0.8 without stages refuses to start."""
    mods = sorted((cache_dir().parent / "gopath" / "pkg" / "mod" / "sigs.k8s.io").glob("kwok@v*"))
    if not mods:
        raise RuntimeError(f"kwok's module (its stage files) not found under {cache_dir().parent}/gopath")
    stage = mods[-1] / "kustomize" / "stage"
    files = [stage / "node" / "fast" / "node-initialize.yaml",
             stage / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
             *(stage / "pod" / "fast" / f for f in ("pod-ready.yaml", "pod-complete.yaml", "pod-delete.yaml"))]
    out = work / "kwok-stages.yaml"
    out.write_text("\n---\n".join(f.read_text().strip() for f in files) + "\n")
    return out


def start_kwok(cp: ControlPlane, work: Path):
    stages = kwok_stages(work)
    log = open(work / "kwok.log", "ab")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    try:
        return subprocess.Popen(
            [str(bin_dir() / "kwok"), f"--kubeconfig={cp.admin_kubeconfig}", f"--config={stages}",
             f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake", "--cidr=10.64.0.0/10",
             "--node-ip=127.0.0.1", "--server-address=127.0.0.1:0", "--node-lease-duration-seconds=40"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_child_setup(True))
    finally:
        log.close()


def client_cert(cp: ControlPlane, work: Path) -> tuple[Path, Path]:
    """A client certificate of the plane's CA (CN kuberay-bench, O system:masters), for the KubeRay peer."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate((cp.pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((cp.pki / "ca.key").read_bytes(), None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kuberay-bench"),
                                     x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    crt, pem = work / "kuberay-client.crt", work / "kuberay-client.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
    os.chmod(pem, 0o600)
    return crt, pem


def install_raycluster(api: client.ApiClient, name: str, n: int) -> None:
    """KubeRay's RayCluster CRD (from the operator's module) and a RayCluster with one worker group `w` of N."""
    ext = client.ApiextensionsV1Api(api)
    [crd_path] = [p for p in crd_files() if "rayclusters" in p.name]
    crd = yaml.safe_load(crd_path.read_text())
    ext.create_custom_resource_definition(crd)
    deadline = time.monotonic() + 60
    while not any(c.type == "Established" and c.status == "True"
                  for c in ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []):
        if time.monotonic() > deadline:
            raise RuntimeError("the RayCluster CRD was not established within 60 s")
        time.sleep(0.2)
    tmpl = {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]}}
    rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": NS},
          "spec": {"headGroupSpec": {"rayStartParams": {}, "template": tmpl},
                   "workerGroupSpecs": [{"groupName": "w", "replicas": n, "minReplicas": 0, "maxReplicas": n,
                                         "rayStartParams": {}, "template": tmpl}]}}
    client.CustomObjectsApi(api).create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)


def kuberay_provider(cp: ControlPlane, work: Path, name: str):
    """Ray's KubeRayNodeProvider, configured out of cluster through its own environment variables (read when its
    module is imported: this is its first import in the process)."""
    crt, key = client_cert(cp, work)
    host, port = cp.server.removeprefix("https://").rsplit(":", 1)
    os.environ.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT_HTTPS=port,
                      RAY_KUBERAY_CLIENT_CERT_PATH=str(crt), RAY_KUBERAY_CLIENT_KEY_PATH=str(key),
                      RAY_KUBERAY_CA_CERT_PATH=str(cp.ca_file))
    from ray.autoscaler._private.kuberay import node_provider as kr
    if kr.KUBERNETES_HOST.rsplit(":", 1)[-1] != port or kr.KUBERAY_CLIENT_CERT_PATH != str(crt):
        raise RuntimeError("Ray's kuberay module was imported before the bench set its environment")
    cfg = {"namespace": NS, "disable_node_updaters": True, "disable_launch_config_check": True,
           "foreground_node_launch": True, "worker_liveness_check": False}
    return kr.KubeRayNodeProvider(cfg, name)


# ------------------------------------------------------------------------------------------------ one size

def node_body(mid: str, spec) -> dict:
    """The machine's Node as its kubelet registers it from the user data (providers/local/kubelet.py's played
    kubelet does the same), with kwok's annotation and the capacity of its instance type."""
    joined = kube_join.parse_user_data(spec.boot_script, mid)
    name = joined.name or f"{kube_join.dns_name(mid)}.{spec.offering.region}.compute.internal"
    labels = dict(joined.labels)
    labels.setdefault(kube_join.HOSTNAME, name)
    labels.setdefault("kubernetes.io/os", "linux")
    cap = node_capacity(spec.offering)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": [dict(t) for t in joined.taints]},
            "status": {"capacity": cap, "allocatable": cap}}


def wait_until(what: str, cond, timeout_s: float, interval_s: float = 1.0) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)
    return time.monotonic()


def ready(node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def run_size(n: int, loops: int, interval_s: float, peer: bool, root: Path, setup_timeout_s: float) -> dict:
    work = root / f"n{n}"
    work.mkdir(parents=True)
    cp = ControlPlane(work / "cp")
    kwok = None
    p: NodelessProvider | None = None
    t = time.monotonic()
    cp.start()
    try:
        plane_s = time.monotonic() - t
        cp.apply_manifest(RBAC)
        sa = cp.service_account_kubeconfig(NS, "ray-nodeless", work / "sa.kubeconfig")
        kwok = start_kwok(cp, work)
        admin = cp.api_client()
        core = client.CoreV1Api(admin)
        cluster, kr_name = f"kwok{n}-{uuid.uuid4().hex[:4]}", f"bench-kr-{n}"
        sel = L.cluster_selector(cluster)
        cloud = fake_backend.reset()
        p = NodelessProvider(provider_config(cluster, kr_name, sa, cp.server), cluster, context=MONITOR)
        reg = p.registration
        counter = RequestCounter(reg.api)
        assert p.non_terminated_nodes({}) == []         # the loop's first snapshot
        t_launch = time.monotonic()
        p.create_node({}, dict(WORKER_TAGS), n)
        launch_s = time.monotonic() - t_launch
        specs = {mid: spec for spec in cloud.launches for mid in cloud.tokens.get(spec.request_token, [])}
        if len(specs) != n:      # a backend answer without the token map: the spec of each launched machine
            specs = {m.id: cloud.launches[-1] for m in p.backend.list_machines()}
        assert len(specs) == n, f"{len(specs)} machines launched, not {n}"
        bodies = [node_body(mid, spec) for mid, spec in specs.items()]
        # the Nodes register (their kubelets, as the admin), 8 at a time
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(core.create_node, bodies))
        t_created = time.monotonic()
        print(f"# n={n}: {n} Nodes created in {t_created - t0:.1f} s", file=sys.stderr, flush=True)
        t_ready = wait_until("all Nodes Ready", lambda: sum(
            ready(x) for x in core.list_node(label_selector=sel).items) == n, setup_timeout_s)
        print(f"# n={n}: all Nodes Ready at {t_ready - t0:.1f} s", file=sys.stderr, flush=True)
        t_pods = wait_until("all Ray pods Running", lambda: sum(
            (x.status.phase == "Running") for x in core.list_namespaced_pod(NS, label_selector=sel).items) == n,
            setup_timeout_s)
        t_ray = wait_until("Ray's listing shows every machine running", lambda: (
            p.loop.run_once("listing"), sum(p.is_running(m) for m in p.non_terminated_nodes({})))[1] == n,
            setup_timeout_s, 0.5)
        setup = {"control_plane_s": round(plane_s, 1), "create_node_call_s": round(launch_s, 2),
                 "nodes_created_s": round(t_created - t0, 2), "nodes_ready_s": round(t_ready - t0, 2),
                 "pods_running_s": round(t_pods - t0, 2), "ray_sees_running_s": round(t_ray - t0, 2),
                 "registration_requests_in_setup": counter.snapshot()}
        print(f"# n={n}: setup {setup}", file=sys.stderr, flush=True)
        threads = [th for th in reg._threads if th.is_alive()]
        machines = list(p.backend.list_machines())
        ids = {m.id for m in machines}
        kr_p = None
        if peer:
            try:
                install_raycluster(admin, kr_name, n)
                kr_p = kuberay_provider(cp, work, kr_name)
                assert timed_update(kr_p, True)[2] == n, "KubeRay's provider does not list the N pods"
            except Exception as e:      # reported, not fatal: the figures of our side stand
                print(f"# n={n}: KubeRay peer skipped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                kr_p, peer = None, f"skipped: {type(e).__name__}: {e}"
        m = {k: [] for k in ("listing", "update", "lane_pass", "describe_all", "observe_and_end", "housekeeping",
                             "threads_cpu", "kr_listing", "kr_update")}
        requests: list[dict[str, int]] = []
        started = time.monotonic()
        for i in range(loops):
            due = started + i * interval_s
            time.sleep(max(0.0, due - time.monotonic()))
            c0, cpu0 = counter.snapshot(), thread_cpu_s(threads)
            ms, whole, count = timed_update(p)
            assert count == n
            m["listing"].append(ms)
            m["update"].append(whole)
            m["lane_pass"].append(timed(lambda: p.loop.run_once("listing")))
            m["describe_all"].append(timed(lambda: [reg.describe(x) for x in machines]))
            m["observe_and_end"].append(timed(lambda: (reg.observe_listing(ids), reg.machines_to_end())))
            m["housekeeping"].append(timed(reg.housekeeping))
            if kr_p is not None:
                ms, whole, count = timed_update(kr_p, True)
                assert count == n
                m["kr_listing"].append(ms)
                m["kr_update"].append(whole)
            time.sleep(max(0.0, due + interval_s - time.monotonic()))    # the rest of the loop: the watches' share
            m["threads_cpu"].append((thread_cpu_s(threads) - cpu0) * 1000)
            requests.append(diff(c0, counter.snapshot()))
        window_s = time.monotonic() - started
        # a resync, as after a 410 or a restart: list, then every item through the watch handler
        resync = {}
        for kind, list_fn, handler in (("nodes", reg._list_nodes, reg._on_node), ("pods", reg._list_pods, reg._on_pod)):
            t0 = time.perf_counter()
            items = list_fn().items
            t1 = time.perf_counter()
            reg._resync(kind, items, handler)
            t2 = time.perf_counter()
            resync[kind] = {"items": len(items), "list_ms": round((t1 - t0) * 1000, 1),
                            "handlers_ms": round((t2 - t1) * 1000, 1),
                            "per_event_us": round((t2 - t1) * 1e6 / max(1, len(items)), 1)}
        totals: dict[str, int] = {}
        for r in requests:
            for k, v in r.items():
                totals[k] = totals.get(k, 0) + v
        out = {"nodes": n, "loops": loops, "interval_s": interval_s, "window_s": round(window_s, 1), "setup": setup,
               "ray_update": {"listing": figures(m["listing"]), "update": figures(m["update"])},
               "lane_pass": figures(m["lane_pass"]),
               "registration": {"describe_all": figures(m["describe_all"]),
                                "observe_listing_and_machines_to_end": figures(m["observe_and_end"]),
                                "housekeeping": figures(m["housekeeping"]),
                                "threads_cpu_ms_per_loop": figures(m["threads_cpu"]),
                                "requests_per_loop": {k: round(v / loops, 2) for k, v in totals.items()},
                                "requests_in_window": totals, "resync": resync},
               "rss": rss_mib(), "kuberay_peer": peer}
        if m["kr_listing"]:
            out["kuberay"] = {"listing": figures(m["kr_listing"]), "update": figures(m["kr_update"])}
            out["kuberay_over_ours_listing_p50"] = round(
                out["kuberay"]["listing"]["p50_ms"] / max(out["ray_update"]["listing"]["p50_ms"], 1e-6), 1)
        admin.close()
        return out
    finally:
        if p is not None:
            p.stop()
            p.registration.close()
        if kwok is not None:
            _kill_group(kwok)
        cp.stop()


def print_table(runs: list[dict]) -> None:
    print("Provider listing and registration housekeeping per loop, kwok Nodes on a real API server; wall ms "
          "p50 / p99 / max")
    for r in runs:
        s, g = r["setup"], r["registration"]
        print(f"\n== {r['nodes']} Nodes, {r['loops']} loops of {r['interval_s']:g} s; rss peak "
              f"{r['rss']['peak_rss_mib']} MiB")
        print(f"  setup: Nodes created {s['nodes_created_s']} s, all Ready {s['nodes_ready_s']} s, pods Running "
              f"{s['pods_running_s']} s, Ray sees all running {s['ray_sees_running_s']} s (from the first create)")

        def row(name, f):
            print(f"  {name:<42} {f['p50_ms']:>10.3f} {f['p99_ms']:>10.3f} {f['max_ms']:>10.3f}")
        row("ray update: non_terminated_nodes", r["ray_update"]["listing"])
        row("ray update: + node_tags/is_running/internal_ip", r["ray_update"]["update"])
        row("lane pass (list + describe + observe + end)", r["lane_pass"])
        row("registration: describe x N", g["describe_all"])
        row("registration: observe_listing+machines_to_end", g["observe_listing_and_machines_to_end"])
        row("registration: housekeeping()", g["housekeeping"])
        row("registration threads CPU per loop", g["threads_cpu_ms_per_loop"])
        if "kuberay" in r:
            row("KubeRay: non_terminated_nodes", r["kuberay"]["listing"])
            row("KubeRay: + node_tags/internal_ip", r["kuberay"]["update"])
            print(f"  KubeRay / ours, listing call p50: {r['kuberay_over_ours_listing_p50']}x")
        else:
            print(f"  KubeRay peer: {r['kuberay_peer']}")
        print(f"  registration API requests per loop: {g['requests_per_loop'] or 'none'}")
        for kind, x in g["resync"].items():
            print(f"  resync {kind}: {x['items']} items, list {x['list_ms']} ms, handlers {x['handlers_ms']} ms "
                  f"({x['per_event_us']} us per event)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000", help="comma-separated numbers of Nodes (one run each)")
    ap.add_argument("--loops", type=int, default=12)
    ap.add_argument("--interval-s", type=float, default=5.0, help="one loop every this many seconds (Ray's 5 s)")
    ap.add_argument("--no-peer", action="store_true", help="leave out KubeRay's provider")
    ap.add_argument("--setup-timeout-s", type=float, default=600.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # a TERMed run still stops what it started
    sizes = [int(x) for x in a.sizes.split(",") if x]
    if len(sizes) > 1:
        # One process per size: Ray's kuberay module reads its API server from the environment when it is imported,
        # and each size has its own control plane; the peak RSS is then each size's own.
        runs = []
        for n in sizes:
            argv = [sys.executable, __file__, "--sizes", str(n), "--loops", str(a.loops), "--interval-s",
                    str(a.interval_s), "--setup-timeout-s", str(a.setup_timeout_s), "--json"]
            out = subprocess.run(argv + (["--no-peer"] if a.no_peer else []), stdout=subprocess.PIPE, check=True)
            runs += json.loads(out.stdout)["runs"]
    else:
        events = tempfile.TemporaryDirectory(prefix="bench-kwok-events-")
        os.environ["RAY_NODELESS_EVENTS_DIR"] = events.name        # the monitor's event log, not the user's
        root = Path(tempfile.mkdtemp(prefix="bench-kwok-"))
        try:
            runs = [run_size(sizes[0], a.loops, a.interval_s, not a.no_peer, root, a.setup_timeout_s)]
        finally:
            events.cleanup()
    doc = {"sizes": sizes, "runs": runs}
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
