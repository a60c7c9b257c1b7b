"""A real, local Kubernetes control plane for tests: etcd + kube-apiserver + kube-scheduler + kube-controller-manager.

What it is
    `ControlPlane(workdir)` starts the four server processes of Kubernetes (the release of scripts/k8s/versions.env,
    1.36.x) on 127.0.0.1 (free ports, never fixed ones), with TLS and a static admin token, RBAC (and Node)
    authorization, and the ServiceAccount admission plugin enabled; ServiceAccount tokens come from the TokenRequest
    API (`service_account_token`), as `kubectl create token` gets them (1.24+ makes no token Secrets). No kubelet
    runs: tests play the kubelet by creating Nodes and patching their status; the real scheduler binds Pods to them.
    The controller-manager's node lifecycle controller removes the `node.kubernetes.io/not-ready` taint once a Node
    reports Ready (and taints it again if its Ready condition / Lease goes stale, 40 s by default).

Where the binaries come from
    `scripts/k8s/build_go.sh` (in this repository) builds them once from the Go module proxy (k8s.io/kubernetes and
    etcd by version through a wrapper module, the KubeRay operator and kwok by `go install`) into
    `$RAY_NODELESS_K8S_GO_CACHE` (default `~/.cache/ray-nodeless/k8s-go`)/v<version>/bin. The first build takes
    about 25 minutes on 2 cores; later runs return at once (the script's stamp names the recipe).
    `start()` runs the script once per process (its fast path when built; unless `build=False`); the environment
    variable `RAY_NODELESS_K8S_BUILD` may name another script.

Use
    with ControlPlane(tmp_path) as cp:
        core = kubernetes.client.CoreV1Api(cp.api_client())
        token = cp.service_account_token("default", "default")
        cp.write_kubeconfig(tmp_path / "sa.kubeconfig", token)
        cp.restart_apiserver()          # fault tests: same port, same data

Safety: every process is started in its own session (process group) and stopped by that group's id only
(SIGTERM, then SIGKILL); `stop()` is idempotent and also registered with atexit. When started from the main
thread, the children also get PR_SET_PDEATHSIG=SIGKILL, so they die with the Python process even when it is killed.
Log files (`etcd.log`, `kube-apiserver.log`, ...) and all state live in `workdir`.

Only the standard library and the `kubernetes` client are used (certificates: the `cryptography` package when it
is importable, else the `openssl` command).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

# --------------------------------------------------------------------------------------------------- constants
# Where build_go.sh puts the binaries: $ROOT/v<K8S_VERSION>/bin (keep in sync with scripts/k8s/build_go.sh).
DEFAULT_CACHE = Path.home() / ".cache" / "ray-nodeless" / "k8s-go"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "k8s"
BUILD_SCRIPT = SCRIPTS / "build_go.sh"
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "etcd")
# A first build takes about 25 min on 2 cores; this bounds a stuck one (build_go.sh bounds its own steps too).
BUILD_TIMEOUT_S = 5400.0
# The API server is ready about 4 s after start here; the default ServiceAccount and its token follow in ~2 s.
STARTUP_TIMEOUT_S = 60.0
# stop_apiserver()/restart_apiserver() alone: while the scheduler's and controller-manager's watches stay open, a
# SIGTERMed API server waits for them up to its 60 s request timeout; it keeps no state of its own (etcd does), so
# it gets SIGKILL after this short grace. (In stop(), with the controllers stopped first, it exits in about 1 s.)
APISERVER_RESTART_GRACE_S = 2.0
POLL_S = 0.2
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SA_ISSUER = "https://kubernetes.default.svc"
# TokenRequest tokens the tests ask for live a day: longer than any test run, and the API server's default cap
# (--service-account-max-token-expiration unset) allows it.
SA_TOKEN_SECONDS = 86400
# When set, every start() appends one line (pid, seconds, workdir) to this file: how a test run counts its control
# plane starts across xdist workers (tests/k8s_plane.py shares one per worker).
STARTS_LOG_ENV = "RAY_NODELESS_K8S_STARTS_LOG"

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """The build's output directory: $RAY_NODELESS_K8S_GO_CACHE/v<K8S_VERSION> (bin/, kuberay/, .stamp)."""
    return Path(os.environ.get("RAY_NODELESS_K8S_GO_CACHE") or DEFAULT_CACHE) / f"v{k8s_version()}"


def bin_dir() -> Path:
    return cache_dir() / "bin"


def binaries_present() -> bool:
    b = bin_dir()
    return (cache_dir() / ".stamp").is_file() and all(os.access(b / n, os.X_OK) for n in BINARIES)


def build_script() -> Path:
    return Path(os.environ.get("RAY_NODELESS_K8S_BUILD") or BUILD_SCRIPT)


_checked: set[Path] = set()     # build directories whose script said "built" in this process


def ensure_binaries(*, build: bool = True, timeout: float = BUILD_TIMEOUT_S) -> Path:
    """The directory holding kube-apiserver, kube-scheduler, kube-controller-manager and etcd (and kubelet, kubeadm,
    ray-operator, kwok); builds them if needed. The script runs once per process even when the binaries are there:
    only it knows whether its stamp names the current recipe (its fast path returns in well under a second)."""
    if not build:
        if binaries_present():
            return bin_dir()
        raise ControlPlaneError(
            f"Kubernetes binaries missing in {bin_dir()} and build=False; run {build_script()} first (once)")
    if cache_dir() in _checked and binaries_present():
        return bin_dir()
    script = build_script()
    if not script.is_file():
        raise ControlPlaneError(f"build script not found: {script} (set RAY_NODELESS_K8S_BUILD)")
    try:
        # stderr (the progress lines) goes to ours; the script takes a file lock, so concurrent callers build once
        subprocess.run(["bash", str(script), "all"], stdout=subprocess.DEVNULL, check=True, timeout=timeout)
    except subprocess.CalledProcessError as e:
        raise ControlPlaneError(f"{script} failed with exit {e.returncode}; see its output above and the logs in "
                                f"{cache_dir().parent}") from e
    except subprocess.TimeoutExpired as e:
        raise ControlPlaneError(f"{script} did not finish within {timeout:.0f} s") from e
    if not binaries_present():
        raise ControlPlaneError(f"{script} succeeded but {bin_dir()} lacks one of {', '.join(BINARIES)}")
    _checked.add(cache_dir())
    return bin_dir()


# --------------------------------------------------------------------------------------------------- helpers
from ray_nodeless.testing.k8s_support import (  # noqa: E402
    ControlPlaneError, _child_setup, _free_ports, _kill_group, _tail, _write_private, k8s_version, make_pki,
)


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager on 127.0.0.1; see the module docstring.

    Attributes after start(): server (https URL), ca_file, admin_token, admin_kubeconfig, ports, startup_seconds.
    extra_args maps a component name ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager") to
    additional command-line flags, e.g. {"kube-controller-manager": ["--node-monitor-grace-period=10s"]}.
    node_joins=True readies it for real kubelets joining with a bootstrap token (testing/real_kubelet.py): the API
    server authenticates bootstrap tokens (--enable-bootstrap-token-auth), the controller-manager runs the
    bootstrapsigner (signs the cluster-info ConfigMap kubeadm's token discovery checks) and tokencleaner, and signs
    the kubelets' CSRs with the cluster CA (csrsigning, off otherwise; --cluster-signing-cert/key-file).
    """

    starts = 0       # start()s completed in this process (all instances)

    def __init__(self, workdir: str | os.PathLike, *, build: bool = True,
                 startup_timeout: float = STARTUP_TIMEOUT_S,
                 extra_args: dict[str, list[str]] | None = None, node_joins: bool = False) -> None:
        self.workdir = Path(workdir).resolve()
        self.node_joins = node_joins
        self.build = build
        self.startup_timeout = startup_timeout
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        unknown = set(self.extra_args) - set(BINARIES)
        if unknown:
            raise ValueError(f"extra_args for unknown components: {sorted(unknown)}")
        self.pki = self.workdir / "pki"
        self.ca_file = self.pki / "ca.crt"
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self.admin_token = ""
        self.server = ""
        self.ports: dict[str, int] = {}
        self.startup_seconds: float | None = None
        self._bin: Path | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._argv: dict[str, list[str]] = {}
        self._lock = threading.RLock()
        self._atexit = False
        self._started = False

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ public API
    def start(self) -> "ControlPlane":
        with self._lock:
            if self._started:
                return self
            self._bin = ensure_binaries(build=self.build)
            t0 = time.monotonic()
            self.workdir.mkdir(parents=True, exist_ok=True)
            if not self._atexit:
                atexit.register(self.stop)
                self._atexit = True
            self._started = True
            try:
                self._prepare()
                self._start_etcd()
                self._start_apiserver()
                self._wait_apiserver_ready(self.startup_timeout)
                self._start("kube-scheduler", self._scheduler_argv())
                self._start("kube-controller-manager", self._controller_manager_argv())
                self._wait_default_service_account(t0 + self.startup_timeout)
                # a component that rejects its flags exits within a moment: do not report such a plane as started
                for name in BINARIES:
                    self._check_alive(name)
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.monotonic() - t0
            self._count_start()
            return self

    def _count_start(self) -> None:
        ControlPlane.starts += 1
        logger.info("control plane started in %.1f s (start %d of this process): %s", self.startup_seconds,
                    ControlPlane.starts, self.workdir)
        path = os.environ.get(STARTS_LOG_ENV)
        if path:
            with open(path, "a") as f:     # one short write: lines of concurrent workers do not interleave
                f.write(f"{os.getpid()} {self.startup_seconds:.1f} {self.workdir}\n")

    def stop(self) -> None:
        """Stop every process this object started (by process group), newest first. Safe to call twice."""
        with self._lock:
            for name in reversed(list(self._procs)):
                _kill_group(self._procs.pop(name))
            self._started = False
            if self._atexit:
                try:
                    atexit.unregister(self.stop)
                except Exception:  # pragma: no cover - interpreter shutting down
                    pass
                self._atexit = False

    def restart_apiserver(self, *, down_seconds: float = 0.0) -> None:
        """Stop the API server process only, optionally stay down a while, start it again on the same port."""
        with self._lock:
            if not self._started or "kube-apiserver" not in self._procs:
                raise ControlPlaneError("restart_apiserver: the control plane is not running")
            self.stop_apiserver()
            if down_seconds > 0:
                time.sleep(down_seconds)
            self.start_apiserver()

    def stop_apiserver(self) -> None:
        """Stop the API server process only (the other servers keep running and retry)."""
        with self._lock:
            proc = self._procs.pop("kube-apiserver", None)
            if proc is not None:
                _kill_group(proc, grace=APISERVER_RESTART_GRACE_S)

    def start_apiserver(self) -> None:
        """Start the API server again after stop_apiserver(), same port and flags; waits until ready."""
        with self._lock:
            if not self._started:
                raise ControlPlaneError("start_apiserver: the control plane is not running")
            if "kube-apiserver" in self._procs:
                return
            # keep the order of _procs: the API server stops before etcd and after the controllers
            others: dict[str, subprocess.Popen] = {
                n: self._procs.pop(n) for n in ("kube-scheduler", "kube-controller-manager") if n in self._procs}
            self._start_apiserver(self._argv["kube-apiserver"])
            self._procs.update(others)
            self._wait_apiserver_ready(self.startup_timeout)

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self._procs.items()}

    def log_file(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def write_kubeconfig(self, path: str | os.PathLike, token: str, *, user: str = "user") -> Path:
        """Write a kubeconfig for `token` against this API server (JSON, which every YAML loader reads)."""
        if not self.server:
            raise ControlPlaneError("write_kubeconfig: the control plane has not been started")
        path = Path(path)
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                        "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, (json.dumps(cfg, indent=2) + "\n").encode())
        return path

    def api_client(self, token: str | None = None) -> k8s_client.ApiClient:
        """A kubernetes ApiClient for the admin (or for `token`). The caller may close() it."""
        if not self.server:
            raise ControlPlaneError("api_client: the control plane has not been started")
        cfg = k8s_client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        # the whole header value under "authorization", no prefix: kubernetes<36 looks the key up as
        # "authorization", >=36 as "BearerToken" with "authorization" as alias (but the prefix only as "BearerToken")
        cfg.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return k8s_client.ApiClient(cfg)

    def service_account_token(self, namespace: str, name: str, timeout: float = 30) -> str:
        """A token of ServiceAccount namespace/name from the TokenRequest API (what `kubectl create token` does;
        valid a day). Waits up to `timeout` seconds for the account to exist."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        body = {"spec": {"audiences": [SA_ISSUER], "expirationSeconds": SA_TOKEN_SECONDS}}
        with self.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            while True:
                try:
                    return str(core.create_namespaced_service_account_token(name, namespace, body).status.token)
                except ApiException as e:
                    last = (f"ServiceAccount {namespace}/{name} not found" if e.status == 404
                            else f"API error {e.status}: {e.reason}")
                except Exception as e:  # connection refused while the API server restarts
                    last = f"{type(e).__name__}: {e}"
                if time.monotonic() >= deadline:
                    raise ControlPlaneError(f"no token for ServiceAccount {namespace}/{name} within {timeout:.0f} s: "
                                            f"{last}")
                time.sleep(POLL_S)

    def apply_manifest(self, path: str | os.PathLike) -> None:
        """Create every object of a multi-document YAML manifest (as `kubectl create -f`); objects that exist
        already (409) are kept as they are, any other refusal raises."""
        import yaml
        from kubernetes import utils
        with self.api_client() as api:
            for doc in yaml.safe_load_all(Path(path).read_text()):
                try:
                    utils.create_from_dict(api, doc)
                except utils.FailToCreateError as e:
                    if not all(getattr(x, "status", None) == 409 for x in e.api_exceptions):
                        raise

    def service_account_kubeconfig(self, namespace: str, name: str, path: str | os.PathLike) -> Path:
        """A kubeconfig acting as ServiceAccount namespace/name (created by a manifest), once the namespace's
        default account exists too (pods cannot be created in a namespace before it has one)."""
        self.service_account_token(namespace, "default")
        return self.write_kubeconfig(path, self.service_account_token(namespace, name))

    # ------------------------------------------------------------------ internals
    def _prepare(self) -> None:
        for d in ("etcd-data", "pki", "apiserver-certs"):
            shutil.rmtree(self.workdir / d, ignore_errors=True)
        make_pki(self.pki)
        self.admin_token = secrets.token_hex(16)
        comp_tokens = {c: secrets.token_hex(16) for c in ("kube-scheduler", "kube-controller-manager")}
        # token,user,uid,"group1,group2"; the components run as members of system:masters (the controller-manager
        # runs every controller with its own credentials: --use-service-account-credentials=false)
        lines = [f'{self.admin_token},admin,admin-uid,"system:masters"']
        lines += [f'{t},{c},{c}-uid,"system:masters"' for c, t in comp_tokens.items()]
        _write_private(self.pki / "tokens.csv", ("\n".join(lines) + "\n").encode())
        etcd_client, etcd_peer, api = _free_ports(3)
        self.ports = {"etcd": etcd_client, "etcd-peer": etcd_peer, "kube-apiserver": api}
        self.server = f"https://127.0.0.1:{api}"
        self.write_kubeconfig(self.admin_kubeconfig, self.admin_token, user="admin")
        for c, t in comp_tokens.items():
            self.write_kubeconfig(self.workdir / f"{c}.kubeconfig", t, user=c)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        no_proxy = ",".join(x for x in (env.get("NO_PROXY") or env.get("no_proxy"), "127.0.0.1,localhost") if x)
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        return env

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        assert self._bin is not None
        argv = [str(self._bin / name), *argv, *self.extra_args.get(name, [])]
        self._argv[name] = argv[1:len(argv) - len(self.extra_args.get(name, []))]
        log = open(self.log_file(name), "ab")
        try:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv, cwd=self.workdir, env=self._env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_child_setup(threading.current_thread() is threading.main_thread()))
        finally:
            log.close()
        self._procs[name] = proc
        return proc

    def _check_alive(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            raise ControlPlaneError(f"{name} exited (code {code}); last log lines of {self.log_file(name)}:\n"
                                    f"{_tail(self.log_file(name))}")

    def _start_etcd(self) -> None:
        c, p = self.ports["etcd"], self.ports["etcd-peer"]
        self._start("etcd", [
            "--name=default", f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
            f"--initial-cluster=default=http://127.0.0.1:{p}", "--initial-cluster-state=new",
            "--log-level=warn", "--logger=zap",
        ])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + self.startup_timeout
        while True:
            self._check_alive("etcd")
            try:
                with opener.open(f"http://127.0.0.1:{c}/health", timeout=2) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise ControlPlaneError(f"etcd not healthy within {self.startup_timeout:.0f} s:\n"
                                        f"{_tail(self.log_file('etcd'))}")
            time.sleep(POLL_S)

    def _apiserver_argv(self) -> list[str]:
        p = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['kube-apiserver']}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", f"--token-auth-file={p / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}", "--endpoint-reconciler-type=none",
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount",
            f"--cert-dir={self.workdir / 'apiserver-certs'}", "--profiling=false",
            *(["--enable-bootstrap-token-auth"] if self.node_joins else []),
        ]

    def _start_apiserver(self, argv: list[str] | None = None) -> None:
        self._start("kube-apiserver", argv or self._apiserver_argv())

    def _wait_apiserver_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
        req = urllib.request.Request(f"{self.server}/readyz",
                                     headers={"Authorization": f"Bearer {self.admin_token}"})
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            self._check_alive("kube-apiserver")
            try:
                with opener.open(req, timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except OSError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise ControlPlaneError(f"kube-apiserver not ready within {timeout:.0f} s ({last}):\n"
                                        f"{_tail(self.log_file('kube-apiserver'))}")
            time.sleep(POLL_S)

    def _common_component_argv(self, name: str) -> list[str]:
        kc = self.workdir / f"{name}.kubeconfig"
        return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false"]

    def _scheduler_argv(self) -> list[str]:
        return self._common_component_argv("kube-scheduler")

    def _controller_manager_argv(self) -> list[str]:
        return [*self._common_component_argv("kube-controller-manager"),
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=false",
                *(["--controllers=*,bootstrapsigner,tokencleaner", f"--cluster-signing-cert-file={self.ca_file}",
                   f"--cluster-signing-key-file={self.pki / 'ca.key'}"] if self.node_joins
                  else ["--controllers=*,-csrsigning"])]

    def _wait_default_service_account(self, deadline: float) -> None:
        """Pods can be created in `default` once its ServiceAccount exists (ServiceAccount admission)."""
        while True:
            for n in ("kube-scheduler", "kube-controller-manager"):
                self._check_alive(n)
            try:
                remaining = max(0.0, deadline - time.monotonic())
                self.service_account_token("default", "default", timeout=min(2.0, remaining))
                return
            except ControlPlaneError as e:
                if time.monotonic() >= deadline:
                    raise ControlPlaneError(
                        f"the default ServiceAccount (and its token) did not appear within {self.startup_timeout:.0f} s"
                        f" ({e}); controller-manager log:\n{_tail(self.log_file('kube-controller-manager'))}") from e
