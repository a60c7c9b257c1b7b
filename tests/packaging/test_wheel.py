"""The plugin reaches the head: `make wheel` builds a complete wheel, the setup commands each shipped cloud config
runs on its head install it (with the client's Ray pinned) into a fresh venv where the provider imports and plans,
`ray-nodeless convert` writes the same, and `ray up` without the wheel fails before anything launches, naming the
file_mounts key and `make wheel`."""
from __future__ import annotations

import copy
import subprocess
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.plugin_install import (WHEEL_DIR, WHEEL_MOUNT, check_file_mounts, head_install_command,
                                                plugin_version, wheel_filename)
from tests import REPO_ROOT
from tests.packaging.wheel import fresh_venv, head_commands, mount, node_env

CLOUD_CONFIGS = sorted(p.name for p in (REPO_ROOT / "cluster-configs").glob("*.yaml")
                       if p.name.startswith(("aws-", "gcp-")))
LOCAL_CONFIGS = sorted(p.name for p in (REPO_ROOT / "cluster-configs").glob("local-*.yaml"))


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "cluster-configs" / name).read_text())


def client_ray() -> str:
    return metadata.version("ray")


# ------------------------------------------------------------------------------------------------ the wheel


def test_make_wheel_writes_the_file_the_configs_install(plugin_wheel_dir: Path) -> None:
    assert sorted(p.name for p in plugin_wheel_dir.iterdir() if p.suffix == ".whl") == [wheel_filename()]
    for name in CLOUD_CONFIGS:
        cfg = load(name)
        assert cfg["file_mounts"] == {WHEEL_MOUNT: f"./{WHEEL_DIR}"}, name
        assert head_install_command(client_ray()) in cfg["head_setup_commands"], name


def test_the_wheel_holds_every_tracked_file_of_the_package(plugin_wheel_dir: Path) -> None:
    tracked = subprocess.run(["git", "ls-files", "ray_nodeless"], cwd=REPO_ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
    assert any(t.startswith("ray_nodeless/data/catalog/") for t in tracked)
    with zipfile.ZipFile(plugin_wheel_dir / wheel_filename()) as z:
        names = set(z.namelist())
        meta = z.read(f"ray_nodeless-{plugin_version()}.dist-info/METADATA").decode()
        entry_points = z.read(f"ray_nodeless-{plugin_version()}.dist-info/entry_points.txt").decode()
    missing = sorted(t for t in tracked if t not in names)
    assert missing == [], missing[:10]
    assert "ray-nodeless = ray_nodeless.cli:main" in entry_points
    assert "License-Expression: Apache-2.0" in meta
    assert f"ray_nodeless-{plugin_version()}.dist-info/licenses/LICENSE" in names
    # The head's pin is the client's Ray, and the wheel accepts it.
    # The install requirement, not an extra's (the test extra adds ray[tune] under `extra == "test"`).
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines()
            if line.startswith("Requires-Dist:")]
    [ray_req] = [r for r in reqs if r.name == "ray" and r.marker is None]
    assert ray_req.specifier.contains(client_ray()), (ray_req, client_ray())


@pytest.mark.parametrize("name", CLOUD_CONFIGS)
def test_every_node_pins_the_clients_ray(name: str) -> None:
    """Ray must be the client's version on the head and on each worker the updater sets up."""
    cfg = load(name)
    pins = [c for c in head_commands(cfg) + list(cfg["worker_setup_commands"]) if "ray[default]" in c]
    assert pins and all(f'"ray[default]=={client_ray()}"' in c for c in pins), pins
    workers_set_up = not cfg["provider"].get("disable_node_updaters")
    if workers_set_up:     # Ray's updater runs setup_commands on the workers too
        assert any(f'"ray[default]=={client_ray()}"' in c for c in cfg["setup_commands"])
    assert not any("ray-nodeless" in c.split() for c in head_commands(cfg)), "no index has ray-nodeless"


def test_local_configs_install_nothing() -> None:
    """Their head is this machine, in the venv that already has ray_nodeless: nothing to mount or install."""
    for name in LOCAL_CONFIGS:
        cfg = load(name)
        assert cfg["file_mounts"] == {} and head_commands(cfg) == [], name


# ----------------------------------------------------------------------------------- the head's setup, for real


def test_the_head_setup_commands_install_the_plugin_in_a_fresh_venv(plugin_wheel_dir: Path, tmp_path: Path) -> None:
    """The commands exactly as the YAMLs write them, run by bash in a new venv after the file_mounts are copied to
    the node's home: ray_nodeless is then importable from the venv (not from this checkout), its provider class
    loads, and its CLI plans the config from the wheel's embedded catalog. One venv for all: every config's head
    runs a subset of the same commands, and the one that installs the plugin is in each."""
    configs = {name: load(name) for name in CLOUD_CONFIGS}
    name, cfg = max(configs.items(), key=lambda kv: (len(head_commands(kv[1])), kv[0]))
    install = head_install_command(client_ray())
    for other, c in configs.items():
        assert set(head_commands(c)) <= set(head_commands(cfg)) and install in head_commands(c), other
        assert c["file_mounts"] == cfg["file_mounts"], other
    home = tmp_path / "home"
    home.mkdir()
    python = fresh_venv(tmp_path / "venv")
    env = node_env(python, home)
    before = subprocess.run([str(python), "-c", "import ray_nodeless"], env=env, cwd=home, capture_output=True,
                            text=True)
    assert before.returncode != 0, "the fresh venv must not see ray_nodeless before the setup commands"
    mount(cfg, home, plugin_wheel_dir)
    for command in head_commands(cfg):
        r = subprocess.run(["bash", "-c", command], env=env, cwd=home, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
    probe = ("import ray, ray_nodeless; from importlib.metadata import version; "
             "from ray_nodeless import NodelessProvider; "
             "print(ray_nodeless.__file__, ray.__version__, NodelessProvider.__name__, version('ray-nodeless'))")
    r = subprocess.run([str(python), "-c", probe], env=env, cwd=home, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    where, ray_version, cls, version = r.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "venv"), where
    assert (ray_version, cls, version) == (client_ray(), "NodelessProvider", plugin_version())
    yaml_path = home / name
    yaml_path.write_text((REPO_ROOT / "cluster-configs" / name).read_text())
    plan = subprocess.run([str(tmp_path / "venv" / "bin" / "ray-nodeless"), "plan", str(yaml_path)], env=env,
                          cwd=home, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0 and plan.stdout.startswith(f"cluster {cfg['cluster_name']}: "), plan.stderr


# ------------------------------------------------------------------------------------------ missing pieces


def test_a_missing_wheel_directory_names_the_mount_and_make_wheel(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)          # `ray up` run away from the checkout: ./dist/... is not there
    with pytest.raises(ConfigError) as e:
        check_file_mounts(load("aws-gpu-head.yaml"))
    assert e.value.key == f"file_mounts.{WHEEL_MOUNT}"
    assert "make wheel" in str(e.value) and str(tmp_path) in str(e.value)


def test_a_stale_wheel_names_the_command_and_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "ray_nodeless-0.0.9-py3-none-any.whl").write_bytes(b"")
    cfg = load("gcp-cpu-head.yaml")
    cfg["file_mounts"] = {WHEEL_MOUNT: str(tmp_path)}
    with pytest.raises(ConfigError) as e:
        check_file_mounts(cfg)
    assert e.value.key == "head_setup_commands[0]"
    assert wheel_filename() in str(e.value) and "ray_nodeless-0.0.9-py3-none-any.whl" in str(e.value)
    assert "make wheel" in str(e.value)


def test_errors_name_the_list_the_user_wrote_after_rays_merge(plugin_wheel_dir: Path) -> None:
    """Ray's prepare_config prepends setup_commands to head_setup_commands before bootstrap_config runs."""
    from ray.autoscaler._private.util import prepare_config

    cfg = load("aws-cpu-head.yaml")
    cfg["file_mounts"] = {WHEEL_MOUNT: str(plugin_wheel_dir)}
    cfg["setup_commands"] = ["pip install ~/ray_nodeless_wheel/nope.whl"]
    merged = prepare_config(copy.deepcopy(cfg))
    assert merged["head_setup_commands"][0] == cfg["setup_commands"][0]
    for c in (cfg, merged):
        with pytest.raises(ConfigError) as e:
            check_file_mounts(c)
        assert e.value.key == "setup_commands[0]", e.value
    cfg["setup_commands"] = []
    check_file_mounts(prepare_config(copy.deepcopy(cfg)))        # the head's install finds its wheel


def test_self_booting_workers_get_no_file_mounts(plugin_wheel_dir: Path) -> None:
    cfg = load("aws-cpu-head.yaml")
    cfg["file_mounts"] = {WHEEL_MOUNT: str(plugin_wheel_dir)}
    check_file_mounts(cfg, workers_boot_themselves=True)         # the head alone installs the wheel: fine
    cfg["worker_setup_commands"] = list(cfg["head_setup_commands"])
    with pytest.raises(ConfigError) as e:
        check_file_mounts(cfg, workers_boot_themselves=True)
    assert e.value.key == "worker_setup_commands[0]" and "disable_node_updaters" in str(e.value)
    check_file_mounts(cfg)                                       # with Ray's updater the workers get the mount


# --------------------------------------------------------------------------------- convert writes the same


def test_convert_mounts_this_checkouts_wheel_and_installs_it_on_the_head() -> None:
    from ray_nodeless.swapin.convert import convert_file

    conv = convert_file(REPO_ROOT / "tests" / "data" / "ray-examples" / "aws-example-full.yaml")
    assert conv.config["file_mounts"][WHEEL_MOUNT] == str(REPO_ROOT / WHEEL_DIR)
    assert conv.config["head_setup_commands"][-1] == load("aws-gpu-head.yaml")["head_setup_commands"][0]
    assert any(n.startswith("file_mounts: ") and "make wheel" in n for n in conv.notes), conv.notes
    assert yaml.safe_load(conv.text)["head_setup_commands"] == conv.config["head_setup_commands"]


# ------------------------------------------------------------------------------- `ray up` without the wheel


def _on_moto(moto, cfg: dict[str, Any]) -> dict[str, Any]:
    iam = moto.client("iam")
    iam.create_role(RoleName="ray-autoscaler-v1", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="ray-autoscaler-v1")
    iam.add_role_to_instance_profile(InstanceProfileName="ray-autoscaler-v1", RoleName="ray-autoscaler-v1")
    cfg["provider"].update(endpoint_url=moto.url, aws_credentials={"aws_access_key_id": "testing",
                                                                   "aws_secret_access_key": "testing"})
    cfg["provider"]["region"] = "us-west-2"
    return cfg


def _instances(moto) -> list[str]:
    return [i["InstanceId"] for r in moto.client().describe_instances()["Reservations"] for i in r["Instances"]]


def test_ray_up_without_make_wheel_fails_before_the_head_launches(moto, tmp_path: Path, monkeypatch) -> None:
    """Ray's own `ray up` (create_or_update_cluster) on moto: the plugin's bootstrap_config refuses the YAML
    naming the mount, where Ray alone would launch the head and then die reading the missing directory."""
    from ray.autoscaler._private.commands import create_or_update_cluster

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    cfg = _on_moto(moto, load("aws-cpu-head.yaml"))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as e:
        create_or_update_cluster(str(path), override_min_workers=None, override_max_workers=None, no_restart=False,
                                 restart_only=False, yes=True, override_cluster_name=None, no_config_cache=True)
    assert e.value.key == f"file_mounts.{WHEEL_MOUNT}" and "make wheel" in str(e.value)
    assert _instances(moto) == []


def test_bootstrap_config_accepts_the_built_wheel(moto, plugin_wheel_dir: Path, tmp_path: Path,
                                                  monkeypatch) -> None:
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = _on_moto(moto, load("aws-cpu-head.yaml"))
    cfg["file_mounts"] = {WHEEL_MOUNT: str(plugin_wheel_dir)}
    boot = NodelessProvider.bootstrap_config(cfg)
    assert boot["file_mounts"] == cfg["file_mounts"] and _instances(moto) == []
