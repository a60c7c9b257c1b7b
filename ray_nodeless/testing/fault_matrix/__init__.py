"""A seeded fault matrix through NodelessProvider, checking invariants after every step, on three backends: the
in-memory one (`fake.py`), the real AWS backend against moto (`aws.py`) and the real GCP backend against the fake
Compute server (`gcp.py`). Shared by tests/launch/test_fault_matrix.py and benches/bench_fault_matrix.py.

Ray v2's call pattern (one request id, batches of at most 5 per node type), with capacity errors, throttling that
outlasts retries, lost launch responses, failed, unexpected and empty listings, provider restarts (a new object, as
when the monitor restarts), refused terminates and machines the cloud takes back. The invariants are listed in
`core.py`; what each backend injects, and where, in its module.
"""
from ray_nodeless.testing.fault_matrix.core import BATCH, WORKER_TAGS, Matrix, Stats
from ray_nodeless.testing.fault_matrix.fake import PROVIDER, SHAPES, FakeWorld

__all__ = ["BATCH", "PROVIDER", "SHAPES", "WORKER_TAGS", "FakeWorld", "Matrix", "Stats"]
