"""Every bad cluster YAML of the corpora (corpus.py, corpus_values.py) gets a clear error naming the key at fault,
in `ray-nodeless plan` and in `bootstrap_config` (what `ray up` runs first), never a crash, and no machine is
launched. "Clear" means: one of our error types, and its message names the key (the dotted path)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.errors import NodelessError
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.config.corpus import COMMON, PER_BACKEND, base
from tests.config.corpus_values import LIVE_K8S, RAY_SHAPES, VALUES_COMMON, VALUES_PER_BACKEND, deep_yaml

BACKENDS = ("local", "aws", "gcp", "fake")
CASES = [(b, name, mutate, key) for b in BACKENDS for name, mutate, key in
         COMMON + PER_BACKEND[b] + VALUES_COMMON + VALUES_PER_BACKEND.get(b, [])]
# Ray's schema and preparation: `plan` names them (bootstrap_config gets what Ray's checks let through).
PLAN_CASES = CASES + [(b, name, mutate, key) for b in BACKENDS for name, mutate, key in RAY_SHAPES]
CASES += [(b, name, mutate, key) for b in ("k8s",) for name, mutate, key in VALUES_PER_BACKEND["k8s"]]


def _bad_config(b: str, mutate: Callable[[dict], None]) -> dict:
    cfg = copy.deepcopy(base(b))
    mutate(cfg)
    return cfg


@pytest.fixture(autouse=True)
def cloud():
    return fake_backend.reset()


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 500 and len({name for _, name, _, _ in CASES}) >= 170


@pytest.mark.parametrize("b,name,mutate,key", CASES, ids=[f"{b}-{n}" for b, n, _, _ in CASES])
def test_bootstrap_config_names_the_key_and_launches_nothing(b, name, mutate, key, cloud):
    cfg = _bad_config(b, mutate)
    with pytest.raises(NodelessError) as e:
        NodelessProvider.bootstrap_config(cfg)
    assert key in str(e.value), f"{name}: {e.value}"
    assert cloud.launches == [] and cloud.calls.get("launch", 0) == 0


@pytest.mark.parametrize("b,name,mutate,key", PLAN_CASES, ids=[f"{b}-{n}" for b, n, _, _ in PLAN_CASES])
def test_plan_names_the_key_without_a_traceback(b, name, mutate, key, tmp_path: Path, cloud):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(_bad_config(b, mutate), allow_unicode=True))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, f"{name}: exit {result.exit_code}: {result.output}"
    assert key in result.output and "Traceback" not in result.output, f"{name}: {result.output}"
    assert cloud.launches == []


@pytest.mark.parametrize("content,what", [
    (b"\x00\x01\x02\xff\xfe binary", "binary"),
    (b"- just\n- a list\n", "a list"),
    (b"", "empty"),
    (b"provider: [1, 2]\n", "provider as a list"),
    (b"cluster_name: x\nprovider: {cloud: local, region: us-west-2\n", "broken YAML"),
])
def test_unreadable_files_are_clear_errors(content, what, tmp_path: Path):
    path = tmp_path / "cluster.yaml"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, f"{what}: {result.output}"
    assert ("cluster.yaml" in result.output or "provider" in result.output) and "Traceback" not in result.output


@pytest.mark.parametrize("name,mutate,key", LIVE_K8S, ids=[n for n, _, _ in LIVE_K8S])
def test_kubernetes_preflight_runs_in_bootstrap(name, mutate, key, cloud):
    """registrations/kubernetes/check.py before anything is created (issue 16.5); `plan` makes no call."""
    cfg = _bad_config("k8s", mutate)
    with pytest.raises(NodelessError) as e:
        NodelessProvider.bootstrap_config(cfg)
    assert key in str(e.value), f"{name}: {e.value}"


def test_a_yaml_nested_5000_deep_is_named_not_a_recursion_error(tmp_path: Path):
    path = tmp_path / "cluster.yaml"
    cfg = _bad_config("local", deep_yaml())
    text = yaml.safe_dump({k: v for k, v in cfg.items() if k != "file_mounts"})
    value = "x"
    for _ in range(5000):
        value = "{a: " + value + "}"
    path.write_text(text + "file_mounts: " + value + "\n")
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert ("file_mounts" in result.output or "cluster.yaml" in result.output) and "Traceback" not in result.output
    assert "RecursionError" not in result.output
