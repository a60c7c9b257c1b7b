"""The seeded fault matrix (ray_nodeless/testing/fault_matrix.py): ~1,000 v2-style launch requests with faults,
invariants checked after every step."""
from __future__ import annotations

import pytest

from ray_nodeless.testing.fault_matrix import Matrix


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fault_matrix_in_memory(seed: int) -> None:
    stats = Matrix(seed).run(steps=600)
    assert stats.requests >= 340 and stats.launched > 0
    assert stats.faults.get("lost_response", 0) > 0 and stats.faults.get("restart", 0) > 0
