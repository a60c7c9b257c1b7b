"""Installing the plugin's wheel changes nothing outside the package: `pip install --no-deps` of the wheel `make
wheel` builds (`pip wheel --no-deps`) into a plain new venv adds `ray_nodeless/`, its `.dist-info` and the
`ray-nodeless` console script, and nothing else: no `.pth` (nothing runs at every Python start-up), no top-level
module, no file of the venv changed. The wheel is built with no custom build step (pyproject.toml has no setuptools
cmdclass), so it holds only the package."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from ray_nodeless.operate.plugin_install import plugin_version, wheel_filename
from tests import REPO_ROOT


def _tree(root: Path) -> dict[str, str]:
    """Every file (and symlink) under `root`, relative, with a digest of its content (a link: its target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if "__pycache__" in p.parts:
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_the_wheel_holds_only_the_package(plugin_wheel_dir: Path) -> None:
    with zipfile.ZipFile(plugin_wheel_dir / wheel_filename()) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
    assert tops == {"ray_nodeless", f"ray_nodeless-{plugin_version()}.dist-info"}, tops
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "cmdclass" not in setuptools and "py-modules" not in setuptools, setuptools


def test_installing_the_wheel_adds_the_package_and_nothing_else(plugin_wheel_dir: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    before = _tree(venv)
    # This environment's pip installing into the new venv's interpreter (`pip --python`): the plain venv needs no
    # pip of its own, and --no-deps keeps the index out of it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-index", str(plugin_wheel_dir / wheel_filename())], capture_output=True, text=True,
                       env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    after = _tree(venv)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert changed == [], changed
    added = sorted(set(after) - set(before))
    site_rel = str(site.relative_to(venv))
    dist_info = f"ray_nodeless-{plugin_version()}.dist-info"
    outside = [a for a in added if not (a.startswith((f"{site_rel}/ray_nodeless/", f"{site_rel}/{dist_info}/"))
                                        or a == "bin/ray-nodeless")]
    assert outside == [], outside
    assert "bin/ray-nodeless" in added and f"{site_rel}/ray_nodeless/__init__.py" in added
    assert not [a for a in added if a.endswith(".pth")]
    # The installed package imports from the venv, and a plain start-up of the venv's Python runs nothing of it.
    where = subprocess.run([str(python), "-c", "import ray_nodeless; print(ray_nodeless.__file__)"],
                           capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path, check=False)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.splitlines()[0]).is_relative_to(site)
    probe = "import sys; print(sorted(m for m in sys.modules if 'nodeless' in m))"
    untouched = subprocess.run([str(python), "-c", probe, "up", "cluster.yaml"], capture_output=True, text=True,
                               env=env, timeout=60, cwd=tmp_path, check=False)
    assert (untouched.returncode, untouched.stdout, untouched.stderr) == (0, "[]\n", "")
