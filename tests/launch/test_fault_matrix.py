"""The seeded fault matrix (ray_nodeless/testing/fault_matrix/) on three backends, invariants checked after every
step and every create_node call (see core.py): machines == requested, no duplicate, no leak after restarts and
teardown, no foreign machine touched, no query exception, no forbidden offering.

Split of the launch requests (seeds fixed, so the figures are stable): in-memory 3 x 600 steps (about 1,060
requests, a few seconds), AWS backend against moto 150 steps (about 90), twice: with EC2's ClientToken semantics
emulated and without them, GCP backend against the fake Compute server 200 steps (about 115). Every run also
counts duplicates, returned-but-terminated ids and offerings misread as interrupted (core.py), asserted 0 on every
backend (GCP tells another object's deletion from a preemption by the zone's operations). Together about 1,300
requests; the wire-level backends get fewer because every step
costs several HTTP round trips (benches/bench_fault_matrix.py prints the figures per backend).
"""
from __future__ import annotations

import pytest

from ray_nodeless.testing.fault_matrix import FakeWorld, Matrix
from ray_nodeless.testing.moto_server import MotoServer


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fault_matrix_in_memory(seed: int) -> None:
    stats = Matrix(FakeWorld(), seed).run(steps=600)
    assert stats.requests >= 320 and stats.launched > 0
    assert stats.faults.get("lost_response", 0) > 0 and stats.faults.get("restart", 0) > 0
    assert stats.faults.get("overlapping_provider_terminate", 0) > 0 and stats.faults.get("empty_first_listing", 0) > 0
    assert (stats.duplicates, stats.returned_terminated, stats.misread_interruptions) == (0, 0, 0)


AWS_KINDS = ("capacity", "lost_response", "lost_response_lookup_failed", "lost_response_partial_lookup",
             "throttling_storm", "restart", "reclaimed", "terminate_failed", "list_failure_after_restart", "list_empty",
             "list_empty_twice", "list_partial", "empty_first_listing", "not_found_after_launch",
             "overlapping_provider_terminate")


@pytest.mark.parametrize("honour_token", [True, False], ids=["client-token", "no-client-token"])
def test_fault_matrix_aws_backend_against_moto(moto: MotoServer, honour_token: bool) -> None:
    """With EC2's ClientToken semantics emulated on the wire, and without them (an EC2-compatible endpoint that
    ignores the token, as moto does): the same invariants, 0 duplicates and 0 returned-but-terminated either way."""
    from ray_nodeless.testing.fault_matrix.aws import AwsWorld

    world = AwsWorld(moto, honour_token=honour_token)
    stats = Matrix(world, 1).run(steps=150)
    assert stats.requests >= 75 and stats.launched > 0
    for kind in AWS_KINDS:
        assert stats.faults.get(kind, 0) > 0, kind
    assert (stats.duplicates, stats.returned_terminated, stats.misread_interruptions) == (0, 0, 0)
    # Without the token a re-sent RunInstances would make a second set (checked per batch by the matrix); with
    # it the wire replays the first answer: counted, so the run shows which world it was.
    assert world.wire.requests["RunInstances"] > 0
    if not honour_token:
        assert world.wire.replayed == 0


def test_fault_matrix_gcp_backend_against_fake_gce() -> None:
    from ray_nodeless.testing.fault_matrix.gcp import PROJECT, GcpWorld, RecordingGce

    with RecordingGce(project=PROJECT) as fake:
        stats = Matrix(GcpWorld(fake), 1).run(steps=200)
    assert stats.requests >= 100 and stats.launched > 0
    assert (stats.duplicates, stats.returned_terminated, stats.misread_interruptions) == (0, 0, 0)
    for kind in ("overlapping_provider_terminate", "zone_resource_pool_exhausted", "quota", "lost_response", "lost_response_then_throttled",
                 "http_503", "throttling_storm", "restart", "reclaimed", "terminate_failed", "list_empty"):
        assert stats.faults.get(kind, 0) > 0, kind
