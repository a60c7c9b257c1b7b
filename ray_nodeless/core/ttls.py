"""Every TTL, interval and limit of the core and the launch layer, each with the reason beside it.

Backends, registrations and the interruption watchers keep their cloud-specific ones (API page sizes, timeouts,
operation polling) as named constants in their own modules; the defaults a user can change are provider-block keys
(named in the comment where one exists).
"""
from __future__ import annotations

import os

# How long an offering that failed for capacity (or whose spot machine was reclaimed) is skipped. Karpenter's
# unavailable-offerings cache uses 3 minutes: long enough not to hammer a dry pool every autoscaler tick (5 s),
# short enough that capacity coming back is used within a few ticks of Ray's retry.
UNAVAILABLE_TTL_S = 180.0
# Each capacity error in a row doubles the skip, up to this (Karpenter's backoff RFC: 30 s -> 10 min), and this many
# launch calls at once probe an offering whose backoff ended (core/availability.py).
UNAVAILABLE_BACKOFF_CAP_S = 600.0
UNAVAILABLE_PROBES = 1
# Offerings the capacity memory holds at most: far more than a region has (the largest has ~30k instance type x
# zone x capacity rows), so it only bounds memory if something marks offerings in a loop.
UNAVAILABLE_MAX_ENTRIES = 100_000
# One listing serves every query of one autoscaler update (Ray asks node_tags/is_running/internal_ip per node,
# many times per 5 s tick); 2 s keeps it to one cloud call per tick without serving a stale view to the next.
LIST_CACHE_S = 2.0
# Machines that left the listing are remembered so node_tags/internal_ip of a vanished node still answer (Ray asks
# after the fact). Bounded so a long-lived monitor with heavy churn does not grow without limit.
LAST_KNOWN_LIMIT = 10_000
# A known machine that neither the listing nor a second query by id shows at all is kept (as last listed) this
# long before it counts as gone: EC2 keeps a terminated instance listed for about an hour, so "nothing" about a
# machine listed moments ago is a glitching answer, and a minute of them is well past any one glitch.
UNSEEN_GONE_S = 60.0
# A machine a launch just returned is shown by our own listing even while the cloud's listing (eventually
# consistent: EC2 DescribeInstances can lag RunInstances by seconds) does not show it yet. After this long,
# the cloud's answer wins.
LAUNCH_GRACE_S = 120.0
# EC2 is eventually consistent: TerminateInstances / CreateTags on an instance RunInstances returned moments ago
# may answer InvalidInstanceID.NotFound (AWS documents retrying with exponential backoff). Within LAUNCH_GRACE_S of
# its launch such an answer is retried this many times in the same call (backing off from the backend's retry
# base delay, 0.5 s: about 3.5 s at most), then reported as transient so the next refresh tries again; only an
# older instance's NotFound means it is gone.
NOT_FOUND_RETRIES = 3
# Ray v2 sends one launch request as several create_node calls (batches of AUTOSCALER_MAX_LAUNCH_BATCH = 5, for
# several node types) under one request id; we number the batches per (request id, node type, count) and remember
# the counters this long: Ray retries a request at most max_num_retry_request_to_allocate (3) times, each after
# its request_status_timeout_s.
REQUEST_MEMORY_S = 3600.0
# Ray v2 re-queues a REQUESTED instance no machine appeared for within request_status_timeout_s (600 s, its env
# below) and launches it again under the same request id. The batches of one round start within seconds of each
# other (minutes when Ray's launcher pool is busy); a call that starts more than half that timeout after the
# round's first is Ray's retry: numbered from 0 again, so it gets the first round's tokens and machines.
RAY_REQUEST_STATUS_TIMEOUT_ENV = "RAY_AUTOSCALER_RECONCILE_REQUEST_STATUS_TIMEOUT_S"
RAY_REQUEST_STATUS_TIMEOUT_S = 600.0

# A create_node call tries at most this many candidates per capacity type (then moves on: spot -> on-demand) and
# stops after this long: in a spot drought an unbounded
# walk made hundreds of RunInstances calls in one call (Karpenter's CreateFleet offers at most 60 types at once).
MAX_CANDIDATES_PER_LAUNCH = 20
LAUNCH_TIMEOUT_S = 300.0
# A launch whose outcome is unknown (lost response, throttling beyond the backend's own retries) is retried this
# many times with the same request token (the cloud answers with the machines it already made), backing off
# from this delay. Small: Ray's next update retries the whole request anyway.
TRANSIENT_LAUNCH_RETRIES = 2
TRANSIENT_LAUNCH_BACKOFF_S = 0.25
# One planner per catalog per process keeps this many distinct request plans (a cluster has a handful of shapes;
# simulate and the benchmarks ask for many).
PLAN_CACHE_SIZE = 1024
# The fraction of an instance's memory Ray offers to tasks (the rest is object store and OS), as Ray's AWS and
# GCP providers compute it when they fill in a node type's resources.
TASK_MEMORY_FRACTION = 0.7
# `ray down` (Ray's teardown loop) ends the head and the workers, sleeps 5 s, lists again and stops at the first
# empty answer. A worker the monitor launched just before `ray stop` ended it may not be listed yet (EC2's listing
# lags RunInstances by seconds): after a terminate that included the head, the provider object answers "empty"
# only once a listing this long after that terminate still shows nothing (it lists again every
# TEARDOWN_WATCH_POLL_S meanwhile), so the late worker is listed and ended. `sweep` watches as long for machines
# that appear while it ends the cluster.
TEARDOWN_WATCH_S = 15.0
TEARDOWN_WATCH_POLL_S = 1.0
# `ray-nodeless sweep` lists the cluster again after ending it: a cloud's listing lags a terminate, so a machine
# still listed is waited for this long (polled at this interval) before it counts as "not ended".
SWEEP_VERIFY_S = 20.0
SWEEP_VERIFY_POLL_S = 1.0


def retry_round_s() -> float:
    """How long after a round's first call a call of the same (request id, node type) is still one of its batches
    (launch/launcher.py): half of Ray's request_status_timeout_s, read from Ray's own environment variable when set."""
    try:
        timeout = float(os.environ.get(RAY_REQUEST_STATUS_TIMEOUT_ENV, RAY_REQUEST_STATUS_TIMEOUT_S))
    except ValueError:
        timeout = RAY_REQUEST_STATUS_TIMEOUT_S
    return max(timeout, 1.0) / 2
