"""ray_nodeless_up_guard (the `ray up` start-up hook): it reads the command line exactly as Ray's click command does,
stays out of the way of every valid config and every command that is not `ray up FILE`, and names the key for each
shape Ray's own code crashes on (test_ray_up_path.RAY_CRASHES), the same key `ray-nodeless plan` names."""
from __future__ import annotations

import copy
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

import ray_nodeless_up_guard as guard
from ray_nodeless.cli import main as nodeless_cli
from tests import REPO_ROOT
from tests.config.corpus import base
from tests.config.test_ray_up_path import CASES, RAY_CRASHES


def _ray_commands() -> tuple[click.Group, click.Command]:
    from ray.scripts.scripts import cli, up
    return cli, up


def test_the_option_tables_are_rays() -> None:
    """Every option of the installed Ray's `ray` group and `ray up` command is in the guard's tables, as a flag or as
    an option with a value, and nothing else is (an option it does not know makes the guard stand aside)."""
    cli, up = _ray_commands()
    flags, valued = set(), set()
    for p in up.params:
        if isinstance(p, click.Option):
            names = set(p.opts) | set(p.secondary_opts)
            (flags if p.is_flag or p.count else valued).update(names)
    assert flags == guard.UP_FLAGS
    assert valued == set(guard.UP_VALUE_OPTIONS)
    assert {c for c in guard.UP_SHORT_FLAGS} == {n[1] for n in flags if len(n) == 2}
    group_valued = {n for p in cli.params if isinstance(p, click.Option) and not (p.is_flag or p.count)
                    for n in p.opts}
    assert group_valued == guard.GROUP_VALUE_OPTIONS


UP_ARGS = [
    ["c.yaml"], ["-y", "c.yaml"], ["c.yaml", "-y", "--no-config-cache"], ["-yv", "c.yaml"], ["-vvv", "c.yaml"],
    ["-n", "other", "c.yaml"], ["-nother", "c.yaml"], ["-yn", "other", "c.yaml"], ["--cluster-name=o", "c.yaml"],
    ["--cluster-name", "o", "c.yaml"], ["--max-workers", "3", "c.yaml"], ["--min-workers=2", "c.yaml"],
    ["--max-workers", "x", "c.yaml"], ["--log-style", "record", "c.yaml"], ["--log-style", "fancy", "c.yaml"],
    ["--log-color=TRUE", "c.yaml"], ["--", "c.yaml"], ["-y", "--", "-odd.yaml"], ["c.yaml", "d.yaml"], [],
    ["--help"], ["c.yaml", "--help"], ["--unknown", "c.yaml"], ["-x", "c.yaml"], ["-n"], ["c.yaml", "--max-workers"],
    ["--restart-only", "--no-restart", "c.yaml"], ["--restart-only", "c.yaml"], ["--use-normal-shells", "c.yaml"],
    ["--yes=1", "c.yaml"], ["-n", "--", "c.yaml"], ["--disable-usage-stats", "--redirect-command-output", "c.yaml"],
]


@pytest.mark.parametrize("args", UP_ARGS, ids=[" ".join(a) or "nothing" for a in UP_ARGS])
def test_up_arguments_parse_as_click_parses_them(args: list[str]) -> None:
    """The guard's reading of `ray up ARGS` against click's own parse of the installed `ray up` command: the same
    file and overrides, or the guard stands aside (None) wherever click refuses, answers --help, or Ray's command
    asserts first (--restart-only with --no-restart)."""
    _cli, up = _ray_commands()
    ours = guard.parse_up_args(["/venv/bin/ray", "up", *args])
    try:
        ctx = up.make_context("up", list(args))
    except (click.exceptions.Exit, click.UsageError):
        assert ours is None
        return
    p = ctx.params
    if p["restart_only"] and p["no_restart"]:
        assert ours is None
        return
    overrides = {k: p[k] for k in ("min_workers", "max_workers", "cluster_name") if p[k] is not None}
    assert ours == (p["cluster_config_file"], overrides)


@pytest.mark.parametrize("argv", [
    ["ray", "down", "c.yaml"], ["ray", "--version", "up", "c.yaml"], ["ray", "--help"], ["ray"],
    ["python", "up", "c.yaml"], ["ray", "exec", "c.yaml", "up"], ["ray", "--logging-level"],
    ["ray", "up", "https://example.com/c.yaml"],
])
def test_other_commands_are_left_alone(argv: list[str]) -> None:
    assert guard.parse_up_args(argv) is None


@pytest.mark.parametrize("argv,file", [
    (["/x/bin/ray", "--logging-level", "debug", "up", "c.yaml"], "c.yaml"),
    (["ray", "--logging-format=%(message)s", "up", "-y", "c.yaml"], "c.yaml"),
])
def test_group_options_before_up(argv: list[str], file: str) -> None:
    assert guard.parse_up_args(argv) == (file, {})


def _shipped() -> list[Path]:
    """The cluster YAMLs of the checkout (examples/ also holds traces and other YAML)."""
    paths = sorted([*(REPO_ROOT / "cluster-configs").glob("*.yaml"), *(REPO_ROOT / "examples").rglob("*.yaml")])
    return [p for p in paths if "\nprovider:" in p.read_text()]


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: p.name)
def test_every_shipped_config_passes(path: Path) -> None:
    """Valid configs are never stopped (the guard names only what Ray would crash on)."""
    assert guard.refusal(["ray", "up", "-y", str(path)]) is None


RAY_CRASH_CASES = [c for c in CASES if c[2] in RAY_CRASHES]


@pytest.mark.parametrize("b,corpus,name,mutate,key", RAY_CRASH_CASES, ids=[f"{c[0]}-{c[2]}" for c in RAY_CRASH_CASES])
def test_each_ray_crash_is_named_and_plan_names_the_same_key(b, corpus, name, mutate, key, tmp_path: Path) -> None:
    cfg = copy.deepcopy(base(b))
    mutate(cfg)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    refused = guard.refusal(["ray", "up", "-y", "--no-config-cache", str(path)])
    assert refused is not None and refused.key == key, f"{name}: {refused}"
    assert str(refused).startswith(f"{path}: {key}: ")
    plan = CliRunner().invoke(nodeless_cli, ["plan", str(path)])
    assert plan.exit_code == 2 and f"error: {key}:" in plan.output, plan.output


@pytest.mark.parametrize("mutate,key", [
    (lambda c: c["provider"].pop("type"), "provider.type"),
    (lambda c: c["provider"].update(type=["external"]), "provider.type"),
    (lambda c: c.pop("cluster_name"), "cluster_name"),
    (lambda c: c.pop("head_setup_commands"), "head_setup_commands"),
    (lambda c: c.update(worker_setup_commands="pip install x"), "worker_setup_commands"),
    (lambda c: c.pop("max_workers"), "max_workers"),
    (lambda c: c.update(docker={"image": "rayproject/ray"}), "docker.container_name"),
    (lambda c: c.update(docker={"container_name": "ray"}), "docker.image"),
    (lambda c: c.update(docker={"image": "r", "container_name": "c"}, file_mounts=["/a"]), "file_mounts"),
    (lambda c: c["provider"].update({7: "x"}), "provider.7"),
    (lambda c: c.update(available_node_types=5), "available_node_types"),
], ids=["type-missing", "type-list", "name-missing", "head-setup-missing", "worker-setup-string", "max-workers-missing",
        "docker-no-container", "docker-no-image", "docker-mounts-list", "provider-int-key", "types-number"])
def test_more_shapes_ray_crashes_on(mutate, key, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes beyond the corpus that Ray's code before the provider import trips on: named by the guard, and Ray
    (the installed one, in-process, without the guard) really does crash on each, in its own code."""
    import traceback

    from tests.config.test_ray_up_path import CRASHES, ray_up_without_guard

    cfg = copy.deepcopy(base("aws"))
    mutate(cfg)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    refused = guard.refusal(["ray", "up", "-y", str(path)])
    assert refused is not None and refused.key == key, refused
    e = ray_up_without_guard(path, monkeypatch)
    assert isinstance(e, CRASHES), repr(e)
    assert not [f for f in traceback.extract_tb(e.__traceback__) if "/ray_nodeless/" in f.filename]


def test_overrides_count_as_ray_applies_them(tmp_path: Path) -> None:
    cfg = copy.deepcopy(base("aws"))
    del cfg["cluster_name"], cfg["max_workers"]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert guard.refusal(["ray", "up", str(path)]).key == "cluster_name"
    assert guard.refusal(["ray", "up", "-n", "c", str(path)]).key == "max_workers"
    assert guard.refusal(["ray", "up", "-n", "c", "--max-workers", "2", str(path)]) is None


def test_unreadable_files_are_left_to_ray(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("provider: {type: external\n")
    for name in ("missing.yaml", "broken.yaml"):
        assert guard.refusal(["ray", "up", str(tmp_path / name)]) is None
    (tmp_path / "list.yaml").write_text("- a\n")
    assert guard.refusal(["ray", "up", str(tmp_path / "list.yaml")]).key == "cluster"


def test_other_provider_types_get_only_the_checks_before_rays_own_preparation(tmp_path: Path) -> None:
    cfg = copy.deepcopy(base("aws"))
    cfg["provider"] = {"type": "aws", "region": "us-east-1"}
    cfg["setup_commands"] = "x"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert guard.refusal(["ray", "up", str(path)]) is None
