"""The seeded fault matrix (ray_nodeless/testing/fault_matrix/) on three backends, invariants checked after every
step and every create_node call (see core.py): machines == requested, no duplicate, no leak after restarts and
teardown, no foreign machine touched, no query exception, no forbidden offering.

Split of the launch requests (seeds fixed, so the figures are stable): in-memory 3 x 600 steps (about 1,060
requests, a few seconds), AWS backend against moto 150 steps (about 90), twice: with EC2's ClientToken semantics
emulated and without them, GCP backend against the fake Compute server 200 steps (about 115). Every run also
counts duplicates, returned-but-terminated ids, offerings misread as interrupted, and (issue 28) machines reported
terminated while running, cap refusals caused by phantoms and failed Ray retries after outside terminations
(core.py), asserted 0 on every backend (GCP tells another object's deletion from a preemption by
the zone's operations). Together about 1,300
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
    # issue 28: machines ended outside before any listing, Ray retries after outside terminations, empty runs
    assert stats.young_ended > 0 and stats.outside_retries > 0 and stats.faults.get("list_empty_x2", 0) > 0
    assert (stats.terminated_while_running, stats.phantom_refusals, stats.failed_retries) == (0, 0, 0)


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
    for kind in AWS_KINDS + ("young_ended_outside", "retry_after_outside_end", "list_empty_thrice"):
        assert stats.faults.get(kind, 0) > 0, kind
    assert (stats.terminated_while_running, stats.phantom_refusals, stats.failed_retries) == (0, 0, 0)
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
    for kind in ("overlapping_provider_terminate", "zone_resource_pool_exhausted", "quota", "lost_response",
                 "lost_response_then_throttled", "http_503", "throttling_storm", "restart", "reclaimed",
                 "terminate_failed", "list_empty", "list_empty_x2", "young_ended_outside", "retry_after_outside_end"):
        assert stats.faults.get(kind, 0) > 0, kind


# ----- capped: concurrent and parallel-batch launches under max_hourly_cost (issue 16 #2) -------------------------
# Caps that bind (each world's uncapped run goes well past them); the matrix asserts the cloud's hourly cost never
# exceeds the cap at any sample (after every create_node call, from its thread during bursts, and every step).
CAPS = {"fake": 12.0, "aws": 2.0, "gcp": 3.0}


def _capped_checks(stats, cap: float) -> None:
    assert stats.cap == cap and 0 < stats.max_cost <= cap + 1e-9
    assert stats.cost_refused > 0 and stats.bursts > 0          # the cap bound, and bursts ran
    assert stats.faults.get("parallel_batches", 0) > 0 and stats.faults.get("concurrent_create_node", 0) > 0
    # bursts of several provider objects of the cluster at once (issue 28: they stay within the cap together)
    assert stats.several_objects > 0
    assert (stats.phantom_refusals, stats.terminated_while_running) == (0, 0)
    assert (stats.duplicates, stats.returned_terminated, stats.misread_interruptions) == (0, 0, 0)


def test_capped_fault_matrix_in_memory() -> None:
    stats = Matrix(FakeWorld(), 1, cap=CAPS["fake"]).run(steps=600)
    _capped_checks(stats, CAPS["fake"])
    assert stats.orphans > 0 and stats.faults.get("fresh_provider_burst", 0) > 0


@pytest.mark.parametrize("honour_token", [True, False], ids=["client-token", "no-client-token"])
def test_capped_fault_matrix_aws_backend_against_moto(moto: MotoServer, honour_token: bool) -> None:
    from ray_nodeless.testing.fault_matrix.aws import AwsWorld

    stats = Matrix(AwsWorld(moto, honour_token=honour_token), 1, cap=CAPS["aws"]).run(steps=60)
    _capped_checks(stats, CAPS["aws"])
    assert stats.faults.get("orphan", 0) > 0


def test_capped_fault_matrix_gcp_backend_against_fake_gce() -> None:
    from ray_nodeless.testing.fault_matrix.gcp import PROJECT, GcpWorld, RecordingGce

    with RecordingGce(project=PROJECT) as fake:
        stats = Matrix(GcpWorld(fake), 1, cap=CAPS["gcp"]).run(steps=80)
    _capped_checks(stats, CAPS["gcp"])
    assert stats.faults.get("orphan", 0) > 0
