"""YAML bounded before it is expanded (core/yaml_bounds.py): an alias bomb, a recursive alias and deep nesting are
refused naming what they are, wherever we read YAML (plan's cluster YAML, convert's input, a KubeRay manifest and
the RayCluster annotation the bridge reads from the API server); ordinary aliases still load as before."""
from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli.main import main as cli
from ray_nodeless.core.yaml_bounds import MAX_YAML_VALUES, YamlBoundsError, load_bounded, load_bounded_all
from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay.annotation import ANNOTATION, parse_annotation
from ray_nodeless.kuberay.convert import load_documents


def bomb(levels: int = 9) -> str:
    """The billion-laughs shape: each level an alias list of nine of the level below (9**levels values)."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_from_its_node_graph():
    assert 9 ** 9 > MAX_YAML_VALUES
    with pytest.raises(YamlBoundsError, match="alias bomb"):
        load_bounded(bomb())
    assert len(load_bounded(bomb(3))["c"]) == 9             # 9**3 values: a real use of aliases is fine


def test_a_recursive_alias_is_refused():
    with pytest.raises(YamlBoundsError, match="recursive YAML alias"):
        load_bounded("a: &x [1, *x]\n")


def test_ordinary_aliases_and_documents_load_as_safe_load_does():
    text = "base: &b {CPU: 4}\ntypes: {x: *b, y: *b}\n"
    assert load_bounded(text) == yaml.safe_load(text)
    assert load_bounded("") is None
    assert load_bounded_all("a: 1\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]
    with pytest.raises(yaml.YAMLError):
        load_bounded("a: 1\n---\nb: 2\n")                   # one document expected, as safe_load


def test_plan_refuses_a_bomb_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb() + "cluster_name: x\nprovider: {cloud: local, region: us-west-2, x: *i}\n")
    r = CliRunner().invoke(cli, ["plan", str(path)])
    assert r.exit_code == 2 and "refused before reading it" in r.output and str(path) in r.output, r.output


def test_convert_and_a_kuberay_manifest_refuse_a_bomb(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb() + "cluster_name: x\n")
    r = CliRunner().invoke(cli, ["convert", str(path)])
    assert r.exit_code != 0 and "refused before reading it" in r.output, r.output
    with pytest.raises(ConfigError, match="alias bomb"):
        load_documents(bomb(), "manifest.yaml")


def test_the_rayclusters_annotation_is_bounded():
    with pytest.raises(ConfigError) as e:
        parse_annotation({"annotations": {ANNOTATION: bomb()}})
    assert "refused before reading it" in str(e.value) and ANNOTATION in e.value.key
