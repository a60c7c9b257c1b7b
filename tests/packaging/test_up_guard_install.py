"""The `ray up` start-up guard (ray_nodeless_up_guard.py with its .pth, put at the root of site-packages by
build_hooks.py) is installed both ways the project is installed: from the wheel (`make wheel`, what cloud heads
install) and editable (`pip install -e .`, what `make install` runs). In a fresh venv each way, the `ray` console
script stops a config Ray would crash on with the key named, and every other process starts as before."""
from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from tests import REPO_ROOT
from tests.config.corpus import base
from tests.packaging.wheel import fresh_venv

PTH = "ray_nodeless_up_guard.pth"


def test_the_wheel_carries_the_hook_at_its_root(plugin_wheel_dir: Path) -> None:
    [wheel] = sorted(plugin_wheel_dir.glob("ray_nodeless-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert z.read(PTH) == (REPO_ROOT / PTH).read_bytes()
        assert z.read("ray_nodeless_up_guard.py") == (REPO_ROOT / "ray_nodeless_up_guard.py").read_bytes()
        assert "build_hooks.py" not in z.namelist()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


@pytest.mark.parametrize("how", ["wheel", "editable"])
def test_the_installed_hook_stops_ray_up_and_nothing_else(how: str, plugin_wheel_dir: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    target = [str(next(plugin_wheel_dir.glob("ray_nodeless-*.whl")))] if how == "wheel" else ["-e", str(REPO_ROOT)]
    r = subprocess.run([str(python.with_name("pip")), "install", "-q", "--no-deps", *target], capture_output=True,
                       text=True, env=_env(), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, env=_env()).stdout.strip())
    assert (site / PTH).read_text() == (REPO_ROOT / PTH).read_text()
    # The `ray` console script exactly as pip writes it for Ray's entry point (the venv links Ray's packages, not
    # its bin/).
    ray = python.with_name("ray")
    ray.write_text(f"#!{python}\nimport sys\nfrom ray.scripts.scripts import main\n"
                   "if __name__ == '__main__':\n    sys.exit(main())\n")
    ray.chmod(0o755)
    cfg = base("aws")
    cfg["setup_commands"] = "pip install ray"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([str(ray), "up", "-y", "--no-config-cache", str(bad)], capture_output=True, text=True,
                       env=_env(), timeout=300, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (1, f"ray-nodeless: {bad}: setup_commands: must be a list of commands, got a "
                                           f"string 'pip install ray'\n"), r.stdout + r.stderr
    where = subprocess.run([str(python), "-c", "import ray_nodeless_up_guard as g, sys; print(g.__file__)", "up",
                            str(bad)], capture_output=True, text=True, env=_env(), timeout=60, cwd=tmp_path)
    assert where.returncode == 0 and where.stderr == "", where.stderr        # not the `ray` CLI: untouched
    expected = REPO_ROOT if how == "editable" else site
    assert Path(where.stdout.strip()).parent == expected
