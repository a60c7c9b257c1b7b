"""A launch retried with the same token after the backend deleted what a failed attempt created (found by the
fault matrix): GCE answers a re-sent requestId with the first operation, DONE and successful, even though that
instance is gone, so the retry must not reuse the deleted instances' requestIds."""
from __future__ import annotations

import pytest

from ray_nodeless.errors import TransientBackendError
from ray_nodeless.testing.fake_gce import FakeGce
from tests.providers.gcp.test_gcp_backend import PROJECT, make_backend, spec


def test_retry_after_cleanup_launches_a_live_instance_not_a_ghost() -> None:
    with FakeGce(project=PROJECT) as fake:
        b = make_backend(fake, max_attempts=3)
        s = spec(count=2)
        fake.ambiguous("instances.insert", times=1, status=503)      # created, the answer lost
        fake.rate_limit("instances.insert", times=2)                 # ... and the retries throttled until they end
        with pytest.raises(TransientBackendError):
            b.launch(s)
        assert fake.instances == {}                                  # nothing left behind
        ids = b.launch(s)                                            # the launcher's retry, same token
        assert len(ids) == 2 and sorted(fake.instances) == sorted(ids)
        assert sorted(m.id for m in b.list_machines()) == sorted(ids)
        assert b.launch(s) == ids                                    # and a further retry is idempotent again
        b.close()
