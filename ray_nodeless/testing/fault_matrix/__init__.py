"""A seeded fault matrix through NodelessProvider, checking invariants after every step, on three backends: the
in-memory one (`fake.py`), the real AWS backend against moto (`aws.py`) and the real GCP backend against the fake
Compute server (`gcp.py`). Shared by tests/launch/test_fault_matrix.py and benches/bench_fault_matrix.py.

Ray v2's call pattern (one request id, batches of at most 5 per node type), with capacity errors, throttling that
outlasts retries, lost launch responses (with lookups that fail, or see the new machines one by one), failed,
unexpected, empty, twice-empty and partial listings, provider restarts (a new object, as when the monitor
restarts; its first page may come back empty), refused terminates, machines the cloud takes back, and a second
provider object ending machines (an overlapping monitor, a laptop's `ray down --workers-only`). On AWS with and
without EC2's ClientToken semantics. The invariants are listed in
`core.py`; what each backend injects, and where, in its module.
"""
from ray_nodeless.testing.fault_matrix.core import BATCH, WORKER_TAGS, Matrix, Stats
from ray_nodeless.testing.fault_matrix.fake import PROVIDER, SHAPES, FakeWorld

__all__ = ["BATCH", "PROVIDER", "SHAPES", "WORKER_TAGS", "FakeWorld", "Matrix", "Stats"]
