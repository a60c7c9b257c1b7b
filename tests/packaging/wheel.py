"""The plugin's wheel as `make wheel` builds it, and a fresh venv that runs a cluster YAML's head setup commands."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ray_nodeless.operate.plugin_install import WHEEL_DIR, WHEEL_MOUNT
from tests import REPO_ROOT


def build_wheel(out_dir: Path) -> Path:
    """`make wheel WHEEL_DIR=out_dir` in the checkout (the target users run); returns the one wheel it wrote."""
    r = subprocess.run(["make", "-s", "wheel", f"WHEEL_DIR={out_dir}"], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = sorted(out_dir.glob("ray_nodeless-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def fresh_venv(path: Path) -> Path:
    """A new venv that sees the packages of this interpreter's environment but not ray_nodeless: a directory of
    links to everything in site-packages except ray_nodeless's own entries, on the new venv's path after its own
    site-packages. So Ray and the cloud SDKs count as installed (pip downloads nothing) while ray_nodeless can only
    come from what the setup commands install. Its `pip` is this environment's pip run by the new interpreter
    (what `pip` on a node is: it installs into the venv it runs in), which spares ensurepip's copy. Returns the
    venv's python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True,
                   timeout=300)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    view = path / "client-packages"
    view.mkdir()
    for entry in sorted(ours.iterdir(), key=lambda p: p.name):
        name = entry.name.lower()
        if "ray_nodeless" in name or "ray-nodeless" in name or name.endswith(".pth"):
            continue
        (view / entry.name).symlink_to(entry)
    (site / "zz-client-packages.pth").write_text(f"{view}\n")
    pip = path / "bin" / "pip"
    pip.write_text(f"#!{python}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n")
    pip.chmod(0o755)
    return python


def mount(config: dict[str, Any], home: Path, wheel_dir: Path) -> None:
    """What Ray's updater does with `file_mounts` before the setup commands, into `home` (the node's ~): each
    source copied to its remote path; the plugin's wheel directory taken from `wheel_dir` (built for the test)."""
    for remote, local in sorted((config.get("file_mounts") or {}).items()):
        assert remote.startswith("~/"), remote
        src = wheel_dir if remote == WHEEL_MOUNT and local.rstrip("/").endswith(WHEEL_DIR) else REPO_ROOT / local
        dst = home / remote[2:]
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)


def head_commands(config: dict[str, Any]) -> list[str]:
    """What the head runs, in Ray's order: setup_commands, then head_setup_commands."""
    return [str(c) for c in (config.get("setup_commands") or []) + (config.get("head_setup_commands") or [])]


def node_env(python: Path, home: Path) -> dict[str, str]:
    """The head's shell as the setup commands see it: the venv's `pip` first on PATH, the node's home, and none of
    this test process's PYTHONPATH (which would import the checkout instead of what was installed). PIP_NO_INDEX:
    the commands must install from the mounted wheel and what is already installed, never from an index."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PATH=f"{python.parent}:{env.get('PATH', '/usr/bin:/bin')}",
               VIRTUAL_ENV=str(python.parent.parent), PIP_NO_INDEX="1")
    return env
