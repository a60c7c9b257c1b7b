"""kuberay/labels.py: the table of label handlers is consistent with the node labels' owners and with the
docs' table of mapped labels in docs/kuberay.md (the behaviour of each handler is test_kuberay_rules.py's)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ray_nodeless.kuberay import labels as L
from ray_nodeless.kuberay import scheduling as S
from ray_nodeless.kuberay.catalog_labels import CATALOG_LABELS, UNRECORDED

KUBERAY_DOC = Path(__file__).resolve().parents[2] / "docs" / "kuberay.md"


def _owner(label: str) -> str | None:
    """The cloud whose Nodes carry a label, by its prefix (Karpenter's AWS provider and EKS: aws; GKE: gcp)."""
    if label.startswith(("karpenter.", "eks.amazonaws.com/")):
        return "aws"
    if label.startswith("cloud.google.com/"):
        return "gcp"
    return None


@pytest.mark.parametrize("label", sorted(L.NODE_LABELS))
def test_each_handler_names_the_cloud_whose_nodes_carry_its_label(label):
    assert L.NODE_LABELS[label].cloud == _owner(label)
    out = S.group_rules({"template": {"spec": {"nodeSelector": {label: "x"}}}}, key="g")
    assert out.clouds == ({_owner(label)} if _owner(label) else set())


def test_every_catalog_label_has_its_handler_and_no_label_is_both_mapped_and_unrecorded():
    assert set(CATALOG_LABELS) <= set(L.NODE_LABELS)
    assert not set(UNRECORDED) & set(L.NODE_LABELS)
    assert not set(L.TPU_KEYS) & set(L.NODE_LABELS)


def _docs_table_labels() -> set[str]:
    text = KUBERAY_DOC.read_text()
    start = text.index("| Node label (or Ray label of the group) | constraint key |")
    rows = text[start:text.index("\n\n", start)].splitlines()[2:]
    # full label keys only (`-generation`, `gke-preemptible` abbreviate the key before them)
    return {k for row in rows for k in re.findall(r"`([a-z0-9.-]+\.[a-z]+/[A-Za-z0-9.-]+)`", row.split("|")[1])}


def test_every_label_the_docs_map_has_a_handler():
    named = _docs_table_labels()
    assert len(named) >= 20                      # guards the parse: the table names two dozen labels
    assert sorted(named - set(L.NODE_LABELS) - set(L.RAY_LABELS)) == []
