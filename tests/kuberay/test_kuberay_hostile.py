"""`ray-nodeless convert` on hostile variants of the KubeRay samples (a list where a mapping is, a number where a
string is, null, ...): every one is converted or refused with one `ray-nodeless: error: <key>: ...` line (exit 2),
never a Python traceback (issue 28: 22 of 130 hostile manifests ended in one). The cases below are the ones a full
sweep of the samples (every key x ten hostile values, 6,720 manifests) found crashing before."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_nodeless.cli.convert import convert_command

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "kuberay" / "samples"
HOSTILE = [None, 7, "x", [], {}, ["x"], {"a": 1}, True, [None], -1.5]


def _docs(sample: str) -> tuple[list, int]:
    docs = list(yaml.safe_load_all((SAMPLES / sample).read_text()))
    i = next(i for i, d in enumerate(docs) if isinstance(d, dict) and d.get("apiVersion", "").startswith("ray.io/"))
    return docs, i


def _paths(x, pre=()):
    if pre:
        yield pre
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, pre + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, pre + (i,))


def _put(doc, path, value):
    d = copy.deepcopy(doc)
    cur = d
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return d


def _convert(tmp_path: Path, sample: str, path: tuple, value) -> tuple[int, str]:
    docs, i = _docs(sample)
    docs[i] = _put(docs[i], path, value)
    src = tmp_path / "m.yaml"
    src.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    r = CliRunner().invoke(convert_command, [str(src), "--cloud", "aws", "--region", "us-west-2", "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        f"{'.'.join(map(str, path))} = {value!r}: {type(r.exception).__name__}: {r.exception}"
    if r.exit_code:
        # our one-line error naming the key, or click's usage error (a document that is no KubeRay manifest)
        assert r.exit_code == 2 and r.output.strip().startswith(("ray-nodeless: error: ", "Usage: ")), r.output
        assert "Traceback" not in r.output
    return r.exit_code, r.output


# (sample, key path, value, the key the error names): one per place that raised before.
CASES = [
    ("ray-cluster.sample.yaml", "kind", [], "usage"),       # no KubeRay manifest: --cloud is a usage error
    ("ray-cluster.sample.yaml", "metadata", 7, "metadata"),
    ("ray-cluster.sample.yaml", "metadata", None, None),
    ("ray-cluster.sample.yaml", "metadata.name", None, "metadata.name"),
    ("ray-cluster.sample.yaml", "spec.headGroupSpec", 7, "spec.headGroupSpec"),
    ("ray-cluster.sample.yaml", "spec.headGroupSpec.template.spec.containers", "x",
     "spec.headGroupSpec.template.spec.containers"),
    ("ray-cluster.sample.yaml", "spec.headGroupSpec.template.spec.containers", [],
     "spec.headGroupSpec.template.spec.containers"),
    ("ray-cluster.sample.yaml", "spec.headGroupSpec.template.spec.containers", {"a": 1},
     "spec.headGroupSpec.template.spec.containers"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs", ["x"], "spec.workerGroupSpecs[0]"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.template.spec", 7, "spec.workerGroupSpecs[0].template.spec"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.template.spec.containers", "x",
     "spec.workerGroupSpecs[0].template.spec.containers"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.template.spec.containers.0.resources.limits", 7,
     "spec.workerGroupSpecs[0].template.spec.containers[0].resources.limits"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.replicas", ["x"], "spec.workerGroupSpecs[0].replicas"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.minReplicas", "x", "spec.workerGroupSpecs[0].minReplicas"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.rayStartParams", None,
     "spec.workerGroupSpecs[0].rayStartParams"),
    ("ray-cluster.autoscaler.yaml", "spec.autoscalerOptions.idleTimeoutSeconds", ["x"],
     "spec.autoscalerOptions.idleTimeoutSeconds"),
    ("ray-cluster.sample.yaml", "spec.workerGroupSpecs.0.template.spec.nodeSelector", "x",
     "spec.workerGroupSpecs[0].template.spec.nodeSelector"),
]


@pytest.mark.parametrize("sample,path,value,key", CASES)
def test_hostile_value_is_refused_naming_its_key(tmp_path, sample, path, value, key):
    parts = tuple(int(p) if p.isdigit() else p for p in path.split("."))
    code, out = _convert(tmp_path, sample, parts, value)
    if key is None:                        # `metadata: null` is no metadata: converted
        assert code == 0, out
    elif key == "usage":
        assert code == 2 and "--cloud applies to KubeRay manifests only" in out, out
    else:
        assert code == 2 and out.startswith(f"ray-nodeless: error: {key}: "), out


_VARIANTS = [(s.name, p) for s in sorted(SAMPLES.glob("*.yaml")) for p in _paths(_docs(s.name)[0][_docs(s.name)[1]])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(variant=st.sampled_from(_VARIANTS), value=st.sampled_from(HOSTILE))
def test_no_hostile_variant_ends_in_a_traceback(tmp_path, variant, value):
    _convert(tmp_path, variant[0], variant[1], value)
