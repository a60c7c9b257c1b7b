"""Support for the test control plane (k8s_control_plane.py): its error type, process-group helpers (free ports,
log tails, start in a new session with a parent-death signal, kill by group), and its certificates and keys (a CA,
the API server's serving certificate, client certificates, the ServiceAccount signing key), from the
`cryptography` package when it is installed, else from the `openssl` command line; and the versions the tests
build (`versions`, `k8s_version`: scripts/k8s/versions.env)."""
from __future__ import annotations

import ctypes
import datetime
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable

KILL_GRACE_S = 10.0          # SIGTERM, then this long for a server's group to exit, then SIGKILL
LOG_TAIL_CHARS = 3000        # how much of a failed server's log an error shows
# The Kubernetes release and its companions the tests build and run (scripts/k8s/build_go.sh reads the same file).
VERSIONS_FILE = Path(__file__).resolve().parents[2] / "scripts" / "k8s" / "versions.env"


def versions() -> dict[str, str]:
    """scripts/k8s/versions.env as a dict (K8S_VERSION, ETCD_VERSION, ...); the environment overrides each, as in
    build_go.sh."""
    out: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            out[key] = os.environ.get(key) or value
    return out


def k8s_version() -> str:
    return versions()["K8S_VERSION"]


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or queried."""


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ; a tiny race remains)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The end of the last run's part of a log, preceded by its first error lines (a flag error comes before a
    long usage text, a fatal klog line may be followed by a goroutine dump)."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    run = text[text.rfind("\n==== ") + 1:]
    errors = [ln for ln in run.splitlines() if _ERROR_LINE.match(ln)][:10]
    head = ("first error lines:\n" + "\n".join(errors) + "\n... last lines:\n") if errors else ""
    return head + run[-chars:]


# cobra's "Error: unknown flag", klog's E/F lines ("E1130 21:21:32.17 ..."), etcd's zap JSON at level error/fatal
_ERROR_LINE = re.compile(r'^(Error: |[EF]\d{4} |\{"level":"(error|fatal|panic)")')
_PR_SET_PDEATHSIG = 1


def _child_setup(pdeathsig: bool) -> Callable[[], None] | None:
    if not pdeathsig:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def setup() -> None:  # runs in the child between fork and exec: no locks, no allocation-heavy work
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return setup


def _kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group led by proc (its own session), wait, then SIGKILL; reap proc."""
    pgid = proc.pid
    if proc.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # the leader may be gone while members of its group live on: SIGKILL the group in any case
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


# ----------------------------------------------------------------------------------------------- certificates


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _make_pki_cryptography(pki: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def key() -> Any:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def pem_key(k: Any) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                               serialization.NoEncryption())

    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=3650)
    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ray-nodeless-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    srv_key = key()
    sans = [x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
           .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(now).not_valid_after(later)
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
           .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
           .sign(ca_key, hashes.SHA256()))
    sa_key = key()
    _write_private(pki / "ca.key", pem_key(ca_key))
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(pki / "apiserver.key", pem_key(srv_key))
    (pki / "apiserver.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    _write_private(pki / "sa.key", pem_key(sa_key))
    (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def _make_pki_openssl(pki: Path) -> None:
    openssl = shutil.which("openssl")
    if not openssl:
        raise ControlPlaneError("neither the `cryptography` package nor the `openssl` command is available")

    def run(*args: str) -> None:
        r = subprocess.run([openssl, *args], cwd=pki, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed: {r.stderr.strip()[-1000:]}")

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
        "-subj", "/CN=ray-nodeless-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
        "-subj", "/CN=kube-apiserver")
    (pki / "apiserver.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "apiserver.crt", "-days", "3650", "-extfile", "apiserver.ext")
    run("genrsa", "-out", "sa.key", "2048")
    run("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def make_pki(pki: Path) -> None:
    """CA, API server serving certificate (127.0.0.1/localhost), ServiceAccount signing key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _make_pki_openssl(pki)
    else:
        _make_pki_cryptography(pki)


# ------------------------------------------------------------------------------------------------ the servers
