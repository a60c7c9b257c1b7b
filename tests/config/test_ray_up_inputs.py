"""`ray up` reads its cluster YAML from whatever the shell hands it: a pipe on stdin (`cat c.yaml | ray up
/dev/stdin`), bash process substitution (`ray up <(...)`), a FIFO. Nothing of ray_nodeless reads the file before Ray
does (the package installs no start-up hook), so each is read once, by Ray.

The `.pth` start-up hook that ray_nodeless once installed read the YAML itself first: on a pipe or a process
substitution Ray then got an empty file and crashed, and on a FIFO Ray's own open waited for a writer forever. Each
case here is the real `ray up -y` of the venv, through bash, on a local-backend config (cluster-configs/
local-cpu-head.yaml) whose head start command only echoes a marker: Ray reads the file, our `bootstrap_config`
runs, the head record is made and Ray's updater runs the head's commands through the local command runner. No Ray
process starts (seconds per case, no e2e lock needed); the head record is ended afterwards.
"""
from __future__ import annotations

import os
import signal
import site
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from ray_nodeless.providers.local.backend import LocalBackend
from tests import REPO_ROOT

RAY = Path(sys.executable).with_name("ray")
TIMEOUT_S = 120          # a hang (the old hook on a FIFO) ends here; a case takes ~4 s on this machine
INPUTS = {
    "stdin-pipe": "cat {src} | {ray} up -y --no-config-cache /dev/stdin",
    "process-substitution": "{ray} up -y --no-config-cache <(cat {src})",
    "fifo": "mkfifo {fifo} && {{ cat {src} > {fifo} & }} && {ray} up -y --no-config-cache {fifo}",
}


def stale_start_up_hook() -> str | None:
    """What to say when this environment was installed before the hook's removal and still has its .pth (a `make
    install` removes it: pip uninstalls the files the old install recorded), else None."""
    for d in site.getsitepackages():
        if Path(d, "ray_nodeless_up_guard.pth").exists():
            return f"{Path(d, 'ray_nodeless_up_guard.pth')}: the removed start-up hook is still installed here; " \
                   "run `make install`"
    return None


@pytest.fixture(scope="module", autouse=True)
def no_start_up_hook() -> None:
    """Say so instead of failing obscurely (or hanging on the FIFO case until TIMEOUT_S)."""
    stale = stale_start_up_hook()
    if stale:
        pytest.fail(stale)


def _config(tmp_path: Path) -> tuple[dict, str]:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-cpu-head.yaml").read_text())
    marker = f"head-commands-ran-{uuid.uuid4().hex[:8]}"
    cfg["cluster_name"] = f"inputs-{uuid.uuid4().hex[:6]}"
    cfg["provider"]["state_dir"] = str(tmp_path / "state")
    cfg["head_start_ray_commands"] = [f"echo {marker}"]
    return cfg, marker


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`command` under bash in its own process group, all of which is killed at TIMEOUT_S."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_AUTH_MODE": "disabled", "HOME": str(cwd), "PATH": f"{RAY.parent}:{os.environ.get('PATH', '')}"}
    p = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"`{command}` still running after {TIMEOUT_S} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(command, p.returncode, out, "")


@pytest.mark.parametrize("how", sorted(INPUTS))
def test_ray_up_reads_the_yaml_from(how: str, tmp_path: Path) -> None:
    cfg, marker = _config(tmp_path)
    src = tmp_path / "cluster.yaml"
    src.write_text(yaml.safe_dump(cfg))
    command = INPUTS[how].format(src=src, ray=RAY, fifo=tmp_path / "cluster.fifo")
    try:
        r = _run(command, tmp_path)
        assert r.returncode == 0, r.stdout[-3000:]
        assert marker in r.stdout, r.stdout[-3000:]             # Ray's updater ran the head's commands
        # What Ray wrote to the head (~ is the state dir's home) is the whole config, after our bootstrap_config.
        boot = yaml.safe_load((tmp_path / "state" / "home" / "ray_bootstrap_config.yaml").read_text())
        assert boot["cluster_name"] == cfg["cluster_name"]
        assert boot["head_start_ray_commands"] == cfg["head_start_ray_commands"]
        assert boot["provider"]["module"] == "ray_nodeless.NodelessProvider"
        assert "ray-nodeless:" not in r.stdout and "Traceback" not in r.stdout, r.stdout[-3000:]
    finally:
        backend = LocalBackend.from_provider(dict(cfg["provider"]), cfg["cluster_name"])
        ids = [m.id for m in backend.list_machines()]
        if ids:
            backend.terminate(ids)


def test_a_yaml_ray_cannot_read_from_a_pipe_is_rays_own_error(tmp_path: Path) -> None:
    """A pipe holding a config Ray refuses itself (an unknown provider type): Ray's message, read from the pipe."""
    cfg, _ = _config(tmp_path)
    cfg["provider"]["type"] = "nope"
    src = tmp_path / "cluster.yaml"
    src.write_text(yaml.safe_dump(cfg))
    r = _run(INPUTS["stdin-pipe"].format(src=src, ray=RAY), tmp_path)
    assert r.returncode != 0 and "Unknown provider type" in r.stdout and "nope" in r.stdout, r.stdout[-3000:]
    assert not (tmp_path / "state").exists()
