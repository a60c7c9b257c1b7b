"""The cloud facts written once (core/cloud_facts.py, core/gpus.py) are the ones the embedded catalog was built
with: every type of it agrees with them (the live refreshers read the same constants; tests/providers compare a
live catalog with the embedded one type by type)."""
from __future__ import annotations

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.cloud_facts import (
    AWS_BURSTABLE_FAMILIES, GCP_ARM_FAMILIES, GCP_BURSTABLE_TYPES, aws_burstable, aws_family, gcp_burstable,
    gcp_family,
)
from ray_nodeless.core.gpus import GPU_MEMORY_GIB, KNOWN_GPU_MODELS, gpu_model_by_memory


def test_embedded_aws_types_follow_the_facts():
    types = embedded().types("aws")
    assert {t.family for t in types if t.burstable} == AWS_BURSTABLE_FAMILIES
    assert all(t.burstable == aws_burstable(t.name) and t.family == aws_family(t.name) for t in types)
    a100 = {t.gpu_model for t in types if t.gpu_model.startswith("A100")}
    assert a100 == {"A100", "A100-80GB"}
    assert all(t.gpu_model == gpu_model_by_memory("A100", t.gpu_memory_gib / t.gpu_count)
               for t in types if t.gpu_model.startswith("A100"))


def test_embedded_gcp_types_follow_the_facts():
    types = embedded().types("gcp")
    assert {t.name for t in types if t.burstable} == GCP_BURSTABLE_TYPES
    assert all(t.burstable == gcp_burstable(t.name) and t.family == gcp_family(t.name) for t in types)
    assert all((t.arch == "arm64") == (t.family in GCP_ARM_FAMILIES) for t in types)
    assert any(t.arch == "arm64" for t in types)
    gpus = [t for t in types if t.gpu_count]
    assert gpus and all(t.gpu_memory_gib == GPU_MEMORY_GIB[t.gpu_model] * t.gpu_count for t in gpus)


def test_gpu_memory_table_names_known_models_and_the_a100_rule():
    assert set(GPU_MEMORY_GIB) <= KNOWN_GPU_MODELS
    assert gpu_model_by_memory("A100", 79.3) == "A100-80GB"
    assert gpu_model_by_memory("A100", 40) == "A100" and gpu_model_by_memory("H100", 80) == "H100"
