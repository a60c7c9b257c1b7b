"""The real Prometheus of the tests: installed and cached by scripts/prometheus/install.sh (Debian's package,
unpacked into ~/.cache/ray-nodeless/prometheus), started on 127.0.0.1 against the targets a test names."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from ray_nodeless.testing.clock import wait_for
from ray_nodeless.testing.ray_processes import free_port
from tests import REPO_ROOT

INSTALL = REPO_ROOT / "scripts" / "prometheus" / "install.sh"


def prometheus_bin(name: str = "prometheus") -> Path:
    """The cached binary (installed by the project's script on first use: `make test` runs it first)."""
    out = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    path = Path(out.stdout.strip().splitlines()[-1]).parent / name
    assert path.is_file(), path
    return path


class Prometheus:
    """One Prometheus server scraping `targets` every `interval_s`, its data in `home`."""

    def __init__(self, home: Path, targets: list[str], interval_s: float = 1.0):
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
                  "scrape_configs": [{"job_name": "ray-nodeless", "static_configs": [{"targets": targets}]}]}
        (home / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(home / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [str(prometheus_bin()), f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._ready, 60, "Prometheus to be ready", interval=0.5)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, (self.home / "prometheus.log").read_text()[-3000:]
        try:
            return urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector: [{"metric": {labels}, "value": [ts, "v"]}]."""
        q = urllib.parse.urlencode({"query": expr})
        doc = json.loads(urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10).read())
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def targets_up(self) -> bool:
        doc = json.loads(urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10).read())
        active = doc["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()
