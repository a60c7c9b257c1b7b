"""cluster-configs/kuberay/Dockerfile, the KubeRay autoscaler image (Ray's image + the plugin's wheel). No Docker
daemon runs here, so the file is checked as a builder would read it and its steps are run as a container would run
them: its base image is Ray's at the version ray_nodeless runs with, and its RUN steps, in a fresh venv with the
built wheel where the COPY puts it, install a ray_nodeless whose bridge command and provider class work."""
from __future__ import annotations

import re
import shlex
import subprocess
from importlib import metadata
from pathlib import Path

from tests import REPO_ROOT
from tests.packaging.wheel import fresh_venv, node_env

DOCKERFILE = REPO_ROOT / "cluster-configs" / "kuberay" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(instruction, its argument) per line, comments and blank lines left out (no continuation lines here)."""
    out = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args() -> dict[str, str]:
    return dict(a.split("=", 1) for w, a in instructions() if w == "ARG")


def test_the_base_image_is_rays_at_the_version_ray_nodeless_runs_with():
    [base] = [a for w, a in instructions() if w == "FROM"]
    image = base.replace("${RAY_VERSION}", args()["RAY_VERSION"])
    assert image == f"rayproject/ray:{metadata.version('ray')}", image
    # pyproject's pin and the image agree: the head, the workers and the autoscaler run one Ray
    pin = re.search(r'"ray\[default\]==([0-9.*]+)"|"ray==([0-9.*]+)"', (REPO_ROOT / "pyproject.toml").read_text())
    assert pin is not None
    assert metadata.version("ray").startswith((pin.group(1) or pin.group(2)).rstrip("*"))


def test_its_steps_install_a_working_bridge_from_the_wheel(plugin_wheel_dir: Path, tmp_path: Path):
    [(src, dest)] = [tuple(a.split()) for w, a in instructions() if w == "COPY"]
    assert src == "${WHEEL_DIR}/ray_nodeless-*.whl" and "WHEEL_DIR" in args()
    root = tmp_path / "image"                     # the container's filesystem: the COPY's destination under it
    target = root / dest.lstrip("/")
    target.mkdir(parents=True)
    [wheel] = plugin_wheel_dir.glob("ray_nodeless-*.whl")
    (target / wheel.name).write_bytes(wheel.read_bytes())
    python = fresh_venv(tmp_path / "venv")
    env = node_env(python, tmp_path)
    before = subprocess.run([str(python), "-c", "import ray_nodeless"], env=env, cwd=tmp_path, capture_output=True,
                            text=True)
    assert before.returncode != 0, "the fresh venv must not see ray_nodeless before the image's steps"
    for w, step in instructions():
        if w != "RUN":
            continue
        step = step.replace(dest.rstrip("/"), str(target))    # the COPY's destination, where this test put it
        r = subprocess.run(["bash", "-c", step], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{step}\n{r.stdout}\n{r.stderr}"
    assert not target.exists()                    # the step cleans up after itself
    probe = ("import ray_nodeless, ray; from ray_nodeless.kuberay.provider import KubeRayNodelessProvider; "
             "print(ray_nodeless.__file__, ray.__version__)")
    r = subprocess.run([str(python), "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    where, ray_version = r.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "venv") and ray_version == metadata.version("ray")


def test_make_kuberay_image_builds_with_this_file():
    make = (REPO_ROOT / "Makefile").read_text()
    [recipe] = re.findall(r"^kuberay-image: wheel\n\t(.+)$", make, re.M)
    argv = shlex.split(recipe)
    assert argv[:2] == ["docker", "build"] and argv[argv.index("-f") + 1] == "cluster-configs/kuberay/Dockerfile"
    assert "WHEEL_DIR=$(WHEEL_DIR)" in argv and argv[-1] == "."
