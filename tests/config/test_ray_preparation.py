"""The shapes Ray 2.60's `ray up` crashes on before it imports any node provider (operate/ray_prepare.py): under
`ray up` they stay Ray's own traceback (nothing of ours runs first: the package installs no start-up hook), and
`ray-nodeless plan` names the key and what is wrong. Each case is also run through the installed Ray, in-process,
to prove Ray really crashes on it in its own code; valid configs pass untouched."""
from __future__ import annotations

import copy
import datetime
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main as nodeless_cli
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.ray_prepare import check_ray_preparation, json_fault
from tests import REPO_ROOT
from tests.config.corpus import base
from tests.config.test_ray_up_path import CASES, CRASHES, RAY_CRASHES, ray_up


def _write(cfg: Any, tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


def _plan(path: Path) -> Any:
    return CliRunner().invoke(nodeless_cli, ["plan", str(path)])


def _assert_plan_names(path: Path, key: str) -> None:
    plan = _plan(path)
    assert plan.exit_code == 2 and f"error: {key}: " in plan.output, plan.output
    assert "Traceback" not in plan.output, plan.output


RAY_CRASH_CASES = [c for c in CASES if c[2] in RAY_CRASHES]


@pytest.mark.parametrize("b,corpus,name,mutate,key", RAY_CRASH_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in RAY_CRASH_CASES])
def test_each_ray_crash_of_the_corpus_is_named_by_plan(b, corpus, name, mutate, key, tmp_path: Path) -> None:
    cfg = copy.deepcopy(base(b))
    mutate(cfg)
    _assert_plan_names(_write(cfg, tmp_path), key)


MORE: list[tuple[str, Callable[[dict], None], str, str]] = [
    ("type-missing", lambda c: c["provider"].pop("type"), "provider.type", "missing"),
    ("type-list", lambda c: c["provider"].update(type=["external"]), "provider.type", "must be a string"),
    ("name-missing", lambda c: c.pop("cluster_name"), "cluster_name", "missing"),
    ("head-setup-missing", lambda c: c.pop("head_setup_commands"), "head_setup_commands", "missing"),
    ("worker-setup-string", lambda c: c.update(worker_setup_commands="pip install x"), "worker_setup_commands",
     "must be a list of commands, got a string 'pip install x'"),
    ("setup-string", lambda c: c.update(setup_commands="pip install ray"), "setup_commands",
     "must be a list of commands, got a string 'pip install ray'"),
    ("max-workers-missing", lambda c: c.pop("max_workers"), "max_workers", "missing"),
    ("docker-no-container", lambda c: c.update(docker={"image": "rayproject/ray"}), "docker.container_name",
     "missing"),
    ("docker-no-image", lambda c: c.update(docker={"container_name": "ray"}), "docker.image", "missing"),
    ("docker-list", lambda c: c.update(docker=["rayproject/ray"]), "docker", "must be a mapping"),
    ("docker-mounts-list", lambda c: c.update(docker={"image": "r", "container_name": "c"}, file_mounts=["/a"]),
     "file_mounts", "must be a mapping of remote path to local path"),
    ("docker-mount-number", lambda c: c.update(docker={"image": "r", "container_name": "c"}, file_mounts={"~/a": 5}),
     "file_mounts.~/a", "must be a local path (a string)"),
    ("provider-int-key", lambda c: c["provider"].update({7: "x"}), "provider.7", "a key must be a string"),
    ("types-number", lambda c: c.update(available_node_types=5), "available_node_types", "must be a mapping"),
    ("node-type-string", lambda c: c["available_node_types"].update(extra="m5.large"), "available_node_types.extra",
     "must be a mapping"),
    ("date-value", lambda c: c["provider"].update(region=datetime.date(2026, 1, 2)), "provider.region",
     "cannot be written as JSON"),
    ("date-key", lambda c: c["provider"]["rules"][0].update({datetime.date(2026, 1, 2): 1}),
     "provider.rules[0].2026-01-02", "a key must be a string"),
]


@pytest.mark.parametrize("name,mutate,key,what", MORE, ids=[m[0] for m in MORE])
def test_plan_names_what_ray_crashes_on_and_ray_really_does(name, mutate, key, what, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes beyond the corpus that Ray's code before the provider import trips on: `plan` names the key with
    what is wrong, and Ray (the installed one, in-process) really does crash on each, in its own code."""
    cfg = copy.deepcopy(base("aws"))
    mutate(cfg)
    path = _write(cfg, tmp_path)
    with pytest.raises(ConfigError) as e:
        check_ray_preparation(yaml.safe_load(path.read_text()))
    assert e.value.key == key and what in str(e.value), e.value
    _assert_plan_names(path, key)
    crash = ray_up(path, monkeypatch)
    assert isinstance(crash, CRASHES), repr(crash)
    assert not [f for f in traceback.extract_tb(crash.__traceback__) if "/ray_nodeless/" in f.filename]


def _shipped() -> list[Path]:
    """The cluster YAMLs of the checkout (examples/ also holds traces and other YAML)."""
    paths = sorted([*(REPO_ROOT / "cluster-configs").glob("*.yaml"), *(REPO_ROOT / "examples").rglob("*.yaml")])
    return [p for p in paths if "\nprovider:" in p.read_text()]


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: p.name)
def test_every_shipped_config_passes(path: Path) -> None:
    """Valid configs are never refused here (only what Ray would crash on is)."""
    check_ray_preparation(yaml.safe_load(path.read_text()))


def test_a_file_that_is_not_a_mapping() -> None:
    with pytest.raises(ConfigError) as e:
        check_ray_preparation(["a"])
    assert e.value.key == "cluster"


def test_other_provider_types_get_only_the_checks_before_rays_own_preparation(tmp_path: Path) -> None:
    """Ray's own clouds fill setup commands from their defaults: not modelled, and `plan` refuses the type."""
    cfg = copy.deepcopy(base("aws"))
    cfg["provider"] = {"type": "aws", "region": "us-east-1"}
    cfg["setup_commands"] = "x"
    check_ray_preparation(cfg)
    _assert_plan_names(_write(cfg, tmp_path), "provider.type")


def test_json_faults_walk_shared_aliases_once_and_name_a_cycle() -> None:
    """YAML aliases share one object: the walk costs the distinct nodes, not the expansion (2**40 paths here)."""
    shared: Any = ["leaf"]
    for _ in range(40):
        shared = [shared, shared]
    t0 = time.perf_counter()
    assert json_fault({"provider": {"x": shared}}) is None
    assert time.perf_counter() - t0 < 0.5
    shared_bad: Any = [{"when": datetime.date(2026, 1, 2)}]
    for _ in range(40):
        shared_bad = [shared_bad, shared_bad]
    key, what = json_fault({"k": shared_bad})
    assert key == "k" + "[0]" * 41 + ".when" and "date datetime.date(2026, 1, 2) cannot be written as JSON" in what
    loop: dict = {"a": {}}
    loop["a"]["b"] = loop["a"]
    key, what = json_fault({"setup": loop})
    assert key == "setup.a.b" and "refers to itself" in what
