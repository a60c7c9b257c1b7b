"""The MachineBackend contract (`ray_nodeless/providers/base.py`) as one suite, run over every built-in backend:
the in-memory fake, the local backend (records only: a machine with a boot script gets no Ray process, the
cheapest real path), EC2 through boto3 on moto, and Compute Engine through google-cloud-compute on the fake GCE.

Each backend is reached the way the product reaches it (`providers.make_backend`, one place: `build`), and every
machine made "out of band" (another cluster's, an untagged one, a stopped one) is made on the cloud itself, never
by calling our code. Each backend's own tests cover its cloud's faults; this suite is what they all promise.
"""
from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from ray_nodeless.core.catalog import InstanceType, Offering
from ray_nodeless.errors import BackendError, ForeignMachineError, TransientBackendError
from ray_nodeless.core.schema import parse_section
from ray_nodeless.providers import backend_class, make_backend
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec, Machine, MachineBackend

CLUSTER = "contract"
OTHER = "someone-else"

AWS_M5 = InstanceType(cloud="aws", name="m5.large", family="m5", vcpus=2, memory_gib=8, machine_type="m5.large")
GCP_E2 = InstanceType(cloud="gcp", name="e2-standard-4", family="e2", vcpus=4, memory_gib=16,
                      machine_type="e2-standard-4")


def build(cloud: str, provider: dict[str, Any], cluster: str) -> MachineBackend:
    """The one place this suite constructs a backend: on its own section of `provider`, parsed (the constructor
    contract of base.py)."""
    return make_backend(cloud, parse_section(backend_class(cloud).settings_model, provider, "provider"), cluster)


@dataclass
class Cloud:
    """One backend under test, and what the test can do to its cloud directly.

    `foreign(cluster)` makes a live machine out of band tagged `ray-cluster-name=cluster` (None: untagged) and returns
    its id; `exists(id)` tells whether a machine still exists (not terminated) on the cloud; `tags(id)` its tags as
    the cloud holds them; `stop(id)` stops it out of band (None: the cloud has no stopped machines); `lag()` a context
    in which the cloud's reads do not show machines yet (None: the cloud's reads are consistent)."""

    name: str
    backend: Callable[[str], MachineBackend]
    offering: Offering
    foreign: Callable[[str | None], str]
    exists: Callable[[str], bool]
    tags: Callable[[str], dict[str, str]]
    stop: Callable[[str], None] | None = None
    lag: Callable[[], Any] | None = None
    boot_script: str = ""
    # A context in which the listing's own query (`list_machines`) answers empty pages, every time, while the
    # machines run (a glitching endpoint); None: the listing has no query of its own to glitch (local records).
    empty_pages: Callable[[], Any] | None = None


def _memory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cloud]:
    from ray_nodeless.testing import fake_backend

    fake_backend.reset()
    off = Offering(instance_type=AWS_M5, region="fake", zone="fake-a", capacity="on-demand", hourly_price=0.1)

    def foreign(cluster: str | None) -> str:
        mid = "fake-" + uuid.uuid4().hex[:8]
        fake_backend.CLOUD.machines[mid] = Machine(id=mid, tags={TAG_CLUSTER: cluster} if cluster else {})
        return mid

    @contextlib.contextmanager
    def lag() -> Iterator[None]:
        fake_backend.CLOUD.hide = lambda m: True
        try:
            yield
        finally:
            fake_backend.CLOUD.hide = None

    yield Cloud("memory", lambda cluster: build("fake", {"cloud": "fake"}, cluster), off, foreign,
                exists=lambda mid: mid in fake_backend.CLOUD.machines,
                tags=lambda mid: dict(fake_backend.CLOUD.machines[mid].tags), lag=lag, empty_pages=lag)


def _local(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cloud]:
    from ray_nodeless.testing.ray_processes import stop_everything

    provider = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "local",
                "state_dir": str(tmp_path / "state"), "gcs_address": "127.0.0.1:1", "local_prewarm": False}
    made: list[MachineBackend] = []

    def backend(cluster: str) -> MachineBackend:
        made.append(build("local", provider, cluster))
        return made[-1]

    store = backend(CLUSTER)
    off = Offering(instance_type=AWS_M5, region="local", zone="local-a", capacity="on-demand", hourly_price=0.1)

    def foreign(cluster: str | None) -> str:
        mid = "local-" + uuid.uuid4().hex[:8]
        store.nodes.add_placeholder(mid, "cpu", "127.0.0.1", {TAG_CLUSTER: cluster} if cluster else {})
        return mid

    try:
        yield Cloud("local", backend, off, foreign, exists=lambda mid: store.nodes.get(mid) is not None,
                    tags=lambda mid: dict(store.nodes.get(mid).tags),
                    # A machine with a boot script is a record without a Ray process (its registration brings Ray).
                    boot_script="#!/bin/sh\ntrue\n")
    finally:
        for b in made:
            stop_everything(b.nodes)
            b.close()


def _aws(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cloud]:
    from ray_nodeless.testing.moto_server import REGION, ec2_empty_describe, install, query_params

    moto = request.getfixturevalue("moto")
    provider = {"cloud": "aws", "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(),
                "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
                "aws_retry_base_delay_s": 0.0, "aws_max_attempts": 3}
    ec2 = moto.client()
    made: list[MachineBackend] = []
    lagging = [False]
    glitching = [False]

    def empty_listing(r: Any, n: int) -> Any:
        # EC2's reads lag its writes: while `lagging`, no DescribeInstances of this backend shows anything; while
        # `glitching`, the listing's own query (by the cluster tag and the live states) answers empty pages.
        if lagging[0] or (glitching[0] and "instance-state-name" in str(query_params(r).values())):
            return ec2_empty_describe(r)
        return None

    def backend(cluster: str) -> MachineBackend:
        b = build("aws", provider, cluster)
        install(b.ec2, "DescribeInstances", empty_listing)
        made.append(b)
        return b

    def foreign(cluster: str | None) -> str:
        tags = [{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": cluster}]}] if cluster else []
        return ec2.run_instances(ImageId=moto.ami(), MinCount=1, MaxCount=1,
                                 TagSpecifications=tags)["Instances"][0]["InstanceId"]

    def instance(mid: str) -> dict | None:
        found = [i for r in ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [mid]}])
                 ["Reservations"] for i in r["Instances"]]
        return found[0] if found else None

    def exists(mid: str) -> bool:
        inst = instance(mid)
        return inst is not None and inst["State"]["Name"] not in ("shutting-down", "terminated")

    @contextlib.contextmanager
    def lag() -> Iterator[None]:
        lagging[0] = True
        try:
            yield
        finally:
            lagging[0] = False

    @contextlib.contextmanager
    def empty_pages() -> Iterator[None]:
        glitching[0] = True
        try:
            yield
        finally:
            glitching[0] = False

    off = Offering(instance_type=AWS_M5, region=REGION, zone="us-east-1a", capacity="on-demand", hourly_price=0.096)
    try:
        yield Cloud("aws", backend, off, foreign, exists,
                    tags=lambda mid: {t["Key"]: t["Value"] for t in instance(mid).get("Tags", [])},
                    stop=lambda mid: ec2.stop_instances(InstanceIds=[mid]), lag=lag, empty_pages=empty_pages)
    finally:
        for b in made:
            b.close()


def _gcp(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cloud]:
    from ray_nodeless.providers.gcp.labels import cluster_label_value, manifest_from_items, tags_from_storage
    from ray_nodeless.testing.fake_gce import FakeGce

    with FakeGce(project="test-project") as fake:
        provider = {"cloud": "gcp", "region": "us-central1", "project_id": "test-project", "api_endpoint": fake.url,
                    "credentials": "anonymous", "retry_base_s": 0.001, "retry_max_s": 0.01,
                    "poll_interval_s": 0.01, "operation_timeout_s": 5}
        made: list[MachineBackend] = []

        def backend(cluster: str) -> MachineBackend:
            made.append(build("gcp", provider, cluster))
            return made[-1]

        def foreign(cluster: str | None) -> str:
            name = "out-of-band-" + uuid.uuid4().hex[:8]
            fake.add_instance(name, labels={TAG_CLUSTER: cluster_label_value(cluster)} if cluster else None)
            return name

        def tags(name: str) -> dict[str, str]:
            inst = fake.instances[name]
            items = inst["metadata"].get("items", [])
            return tags_from_storage(dict(inst.get("labels", {})), manifest_from_items(items))

        off = Offering(instance_type=GCP_E2, region="us-central1", zone="us-central1-a", capacity="on-demand",
                       hourly_price=0.134)

        @contextlib.contextmanager
        def empty_pages() -> Iterator[None]:
            fault = fake.empty_list("instances.aggregatedList", times=None)
            try:
                yield
            finally:
                with fake.lock:
                    fake.faults = [f for f in fake.faults if f is not fault]
        try:
            # No `lag`: the backend waits for every insert operation to be DONE, and GCE reads after that show the
            # instance (an unknown name the listing does not show is gone).
            yield Cloud("gcp", backend, off, foreign, exists=lambda name: name in fake.instances, tags=tags,
                        stop=lambda name: fake.set_status(name, "TERMINATED"), empty_pages=empty_pages)
        finally:
            for b in made:
                b.close()


HARNESSES = {"memory": _memory, "local": _local, "aws": _aws, "gcp": _gcp}


@pytest.fixture(params=sorted(HARNESSES))
def cloud(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cloud]:
    yield from HARNESSES[request.param](tmp_path, request)


def spec(cloud: Cloud, count: int = 1, token: str | None = None, cluster: str = CLUSTER) -> LaunchSpec:
    off = cloud.offering
    tags = {TAG_CLUSTER: cluster, "ray-node-type": "worker", "ray-user-node-type": "cpu",
            "ray-node-name": f"ray-{cluster}-worker", "ray-node-status": "uninitialized",
            "nodeless-instance-type": off.instance_type.name, "nodeless-zone": off.zone,
            "nodeless-capacity": off.capacity}
    return LaunchSpec(cluster_name=cluster, node_type="cpu", offering=off, count=count, tags=tags, node_config={},
                      request_token=token or "tok-" + uuid.uuid4().hex[:10], resources={"CPU": 1},
                      boot_script=cloud.boot_script)


def listed(b: MachineBackend) -> dict[str, Machine]:
    return {m.id: m for m in b.list_machines()}


# ------------------------------------------------------------------------------------------------------- launch


def test_launch_returns_exactly_the_new_machines_tagged_at_birth(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    assert b.launch(spec(cloud, count=0)) == [] and listed(b) == {}
    first = b.launch(spec(cloud, count=2))
    assert len(first) == 2 == len(set(first))
    second = b.launch(spec(cloud))
    assert len(second) == 1 and not set(second) & set(first)
    machines = listed(b)
    assert sorted(machines) == sorted(first + second)
    want = spec(cloud).tags
    for m in machines.values():
        assert {k: m.tags.get(k) for k in want} == want, m.id
    # what a fresh object of the cluster (another process: the monitor, `ray down`) lists is the same
    assert sorted(listed(cloud.backend(CLUSTER))) == sorted(first + second)


def test_launch_is_idempotent_per_request_token(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    s = spec(cloud, count=2)
    ids = b.launch(s)
    assert sorted(b.launch(s)) == sorted(ids)
    assert sorted(listed(b)) == sorted(ids)


# ------------------------------------------------------------------------------------------------------ listing


def test_list_never_shows_foreign_or_untagged_machines(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    ours = b.launch(spec(cloud))
    other = cloud.foreign(OTHER)
    untagged = cloud.foreign(None)
    assert sorted(listed(b)) == ours
    assert sorted(listed(cloud.backend(OTHER))) == [other]
    assert cloud.exists(untagged)


def test_a_stopped_machine_is_not_listed_and_is_a_leftover_that_sweep_ends(cloud: Cloud) -> None:
    if cloud.stop is None:
        pytest.skip(f"{cloud.name} has no stopped machines")
    b = cloud.backend(CLUSTER)
    running, stopped = b.launch(spec(cloud, count=2))
    foreign = cloud.foreign(OTHER)
    cloud.stop(stopped)
    cloud.stop(foreign)
    assert sorted(listed(b)) == [running]
    left = cloud.backend(CLUSTER).leftovers()          # listed afresh, by any object of the cluster
    assert [(d["kind"], d["name"], d["machine_id"]) for d in left] == [("stopped-instance", stopped, stopped)]
    assert left[0]["node_kind"] == "worker" and left[0]["state"]
    b.end_leftovers(left)
    assert not cloud.exists(stopped) and cloud.exists(running) and cloud.exists(foreign)
    assert b.leftovers() == []


# ---------------------------------------------------------------------------------------------------- terminate


def test_terminate_is_idempotent(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    a, c = b.launch(spec(cloud, count=2))
    b.terminate([])
    b.terminate([a, a])
    assert sorted(listed(b)) == [c] and not cloud.exists(a)
    b.terminate([a])                                   # gone: no error
    cloud.backend(CLUSTER).terminate([a])              # and from a fresh object too
    assert sorted(listed(b)) == [c]


def test_terminate_never_touches_foreign_machines_and_names_them(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    [ours] = b.launch(spec(cloud))
    other, untagged = cloud.foreign(OTHER), cloud.foreign(None)
    before = {m: cloud.tags(m) for m in (other, untagged)}
    with pytest.raises(ForeignMachineError) as ei:
        cloud.backend(CLUSTER).terminate([other, ours, untagged])    # a fresh object: nothing known yet
    assert ei.value.machine_ids == sorted([other, untagged]) and ei.value.category == "ForeignMachine"
    assert not cloud.exists(ours)                      # the ours among them were ended
    assert all(cloud.exists(m) and cloud.tags(m) == before[m] for m in (other, untagged))


def test_terminate_of_a_machine_the_object_does_not_know_reaches_the_cloud(cloud: Cloud) -> None:
    """A restarted provider (a fresh object) terminates an id it never listed: ended, since it is tagged ours."""
    [mid] = cloud.backend(CLUSTER).launch(spec(cloud))
    cloud.backend(CLUSTER).terminate([mid])
    assert not cloud.exists(mid)


def test_terminate_within_the_listing_lag_never_silently_skips(cloud: Cloud) -> None:
    """Issue 16.11: a fresh object terminates a machine the cloud's reads do not show yet. It ends it, or it
    raises (TransientBackendError, NotYetVisible) so the caller retries: it never returns with the machine running."""
    if cloud.lag is None:
        pytest.skip(f"{cloud.name}'s reads are consistent")
    [mid] = cloud.backend(CLUSTER).launch(spec(cloud))
    fresh = cloud.backend(CLUSTER)
    with cloud.lag():
        try:
            fresh.terminate([mid])
        except TransientBackendError as e:
            assert e.category == "NotYetVisible" and mid in str(e)
            assert cloud.exists(mid)
            ended = False
        else:
            ended = True
    if not ended:
        fresh.terminate([mid])                         # the retry, once the cloud shows it
    assert not cloud.exists(mid)


# ----------------------------------------------------------------------------------------------------- set_tags


def test_set_tags_merges_into_our_machine(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    [mid] = b.launch(spec(cloud))
    assert b.set_tags(mid, {"ray-node-status": "up-to-date", "extra": "1"}) is True
    assert cloud.backend(CLUSTER).set_tags(mid, {"extra": "2"}) is True      # a fresh object too
    assert b.set_tags(mid, {}) is True
    tags = listed(cloud.backend(CLUSTER))[mid].tags
    assert (tags["ray-node-status"], tags["extra"], tags["ray-user-node-type"], tags[TAG_CLUSTER]) == \
        ("up-to-date", "2", "cpu", CLUSTER)


def test_set_tags_on_a_gone_machine_is_no_error_no_effect_and_reported(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    [mid] = b.launch(spec(cloud))
    b.terminate([mid])
    assert b.set_tags(mid, {"ray-node-status": "up-to-date"}) is False
    assert cloud.backend(CLUSTER).set_tags(mid, {"ray-node-status": "up-to-date"}) is False
    assert not cloud.exists(mid) and listed(b) == {}


def test_set_tags_on_a_foreign_machine_is_refused(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    b.launch(spec(cloud))
    for mid in (cloud.foreign(OTHER), cloud.foreign(None)):
        before = cloud.tags(mid)
        with pytest.raises(ForeignMachineError) as ei:
            b.set_tags(mid, {"ray-node-status": "hijacked"})
        assert ei.value.machine_ids == [mid]
        assert cloud.tags(mid) == before


def test_set_tags_never_moves_a_machine_to_another_cluster(cloud: Cloud) -> None:
    b = cloud.backend(CLUSTER)
    [mid] = b.launch(spec(cloud))
    with pytest.raises(BackendError) as ei:
        b.set_tags(mid, {TAG_CLUSTER: OTHER})
    assert ei.value.category == "WrongCluster"
    assert sorted(listed(b)) == [mid] and listed(cloud.backend(OTHER)) == {}


# ------------------------------------------------------------------------------------------------------ recheck


def test_recheck_by_id_tells_live_from_gone_and_leaves_foreign_out(cloud: Cloud) -> None:
    """The by-id lookup (`recheck(ids)`): a live machine of ours is live, one ended by someone else (another
    object of the cluster, `ray down --workers-only`) is gone, a foreign one is neither; an id the cloud shows
    nothing of is gone or left out (the contract allows both; the view keeps a left-out one for a while)."""
    b = cloud.backend(CLUSTER)
    live, ended = b.launch(spec(cloud, count=2))
    cloud.backend(CLUSTER).terminate([ended])           # by another object: this one's memory knows nothing
    other = cloud.foreign(OTHER)
    rc = b.recheck([live, ended, other])
    assert [m.id for m in rc.live] == [live]
    assert rc.live[0].tags.get(TAG_CLUSTER) == CLUSTER
    assert ended in rc.gone and live not in rc.gone and other not in rc.gone


def test_recheck_answers_past_empty_listing_pages(cloud: Cloud) -> None:
    """Issue 28: the listing's query answers empty pages (any number in a row) while machines run; the second
    look is another query, by id and (no ids: a fresh object's first listing) by a second method of listing, so
    it still shows them."""
    if cloud.empty_pages is None:
        pytest.skip(f"{cloud.name}'s listing has no query of its own to glitch")
    b = cloud.backend(CLUSTER)
    ids = sorted(b.launch(spec(cloud, count=2)))
    fresh = cloud.backend(CLUSTER)
    with cloud.empty_pages():
        assert b.list_machines() == [] and b.list_machines() == []
        assert sorted(m.id for m in b.recheck(ids).live) == ids
        assert sorted(m.id for m in fresh.recheck(None).live) == ids
