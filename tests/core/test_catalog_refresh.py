"""The one live-catalog refresh policy (core/catalog/refresh.py): memory -> disk -> live -> stale disk -> embedded,
with `ttl_s` honoured, on an injected clock (no sleeps). The cloud side is a `LiveCatalog` whose fetch builds a
one-type document and can be made to fail: the AWS and GCP hooks are tested against moto and the fake GCE in
tests/providers."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ray_nodeless.core.catalog import Catalog, InstanceType, dump_bytes, region_entry, type_row
from ray_nodeless.core.catalog.refresh import (
    CACHE_DIR_ENV, LiveCatalog, LiveFetch, MemoryCache, cache_path, default_cache_dir, resolve_live, summarize,
)

REGION = "us-east-1"
T0 = 1_700_000_000.0
TTL = 3600.0


def doc(price: float, quality: int = 2) -> dict:
    t = InstanceType(cloud="aws", name="m5.large", family="m5", vcpus=2, memory_gib=8, machine_type="m5.large")
    return {"format": 1, "name": f"live-{price}", "quality": quality, "clouds": {"aws": {
        "types": [type_row(t)],
        "regions": {REGION: region_entry([t], [("m5.large", "us-east-1a", "on-demand", price),
                                              ("m5.large", "us-east-1a", "spot", None)])}}}}


def embedded_stand_in() -> Catalog:
    d = doc(9.0)
    d["name"] = "embedded-stand-in"
    return Catalog(d, "e" * 64, "embedded")


class Cloud:
    """The cloud side of a LiveCatalog: counts reads, answers a price, fails or degrades on demand."""

    def __init__(self) -> None:
        self.reads = 0
        self.price = 0.1
        self.fail: Exception | None = None
        self.warnings: tuple[str, ...] = ()
        self.quality = 2

    def fetch(self) -> LiveFetch:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return LiveFetch(doc(self.price, self.quality), self.warnings)

    def live(self) -> LiveCatalog:
        return LiveCatalog(cloud="aws", region=REGION, cache_name=f"aws-{REGION}-test", fetch=self.fetch,
                           quality=lambda d: int(d.get("quality", 0)), describe="the test cloud")


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cloud() -> Cloud:
    return Cloud()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def resolve(cloud: Cloud, tmp_path: Path, clock: Clock, memory: MemoryCache | None = None, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("ttl_s", TTL)
    return resolve_live(cloud.live(), cache_dir=tmp_path, clock=clock, fallback=embedded_stand_in,
                        memory=memory if memory is not None else MemoryCache(), **kw)


def price(result) -> float:  # type: ignore[no-untyped-def]
    return result.catalog.region("aws", REGION).find("m5.large", "us-east-1a", "on-demand").hourly_price


def test_no_cache_reads_the_cloud_and_writes_the_disk_cache_at_the_clock_time(cloud, tmp_path, clock):
    r = resolve(cloud, tmp_path, clock)
    assert (r.source, r.age_s, cloud.reads) == ("live", 0.0, 1)
    assert r.path == tmp_path / f"aws-{REGION}-test.json.gz" == cache_path(cloud.live(), tmp_path)
    assert r.path.read_bytes() == dump_bytes(doc(0.1)) and os.stat(r.path).st_mtime == T0
    assert r.catalog.catalog_id.startswith("live-0.1@") and price(r) == 0.1 and r.reason.endswith("the test cloud")


def test_a_disk_copy_younger_than_the_ttl_is_used_without_calling_the_cloud(cloud, tmp_path, clock):
    first = resolve(cloud, tmp_path, clock)
    clock.now = T0 + TTL - 1
    cloud.price = 0.2                            # the cloud changed; the fresh copy is still used
    r = resolve(cloud, tmp_path, clock)          # a new process: an empty memory
    assert (r.source, r.age_s, cloud.reads) == ("disk", TTL - 1, 1)
    assert r.catalog.catalog_id == first.catalog.catalog_id and "younger than catalog_ttl_s 3600" in r.reason


def test_memory_is_tried_first_and_honours_the_ttl_too(cloud, tmp_path, clock):
    memory = MemoryCache()
    first = resolve(cloud, tmp_path, clock, memory)
    first.path.unlink()                          # memory needs no disk
    clock.now = T0 + 60
    r = resolve(cloud, tmp_path, clock, memory)
    assert (r.source, r.age_s, cloud.reads) == ("memory", 60.0, 1) and r.catalog is first.catalog
    clock.now = T0 + TTL
    r = resolve(cloud, tmp_path, clock, memory)
    assert (r.source, cloud.reads) == ("live", 2)


def test_an_older_disk_copy_is_refreshed(cloud, tmp_path, clock):
    resolve(cloud, tmp_path, clock)
    clock.now = T0 + TTL + 1
    cloud.price = 0.2
    r = resolve(cloud, tmp_path, clock)
    assert (r.source, cloud.reads, price(r)) == ("live", 2, 0.2)
    assert os.stat(r.path).st_mtime == T0 + TTL + 1
    clock.now += 10
    again = resolve(cloud, tmp_path, clock)      # the refreshed copy is the fresh one now
    assert (again.source, again.age_s, price(again), cloud.reads) == ("disk", 10.0, 0.2, 2)


def test_a_failed_refresh_uses_the_stale_disk_copy_with_a_warning(cloud, tmp_path, clock, caplog):
    resolve(cloud, tmp_path, clock)
    clock.now = T0 + 2 * TTL
    cloud.fail = PermissionError("UnauthorizedOperation")
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.core.catalog.refresh"):
        r = resolve(cloud, tmp_path, clock)
    assert (r.source, r.age_s, price(r), cloud.reads) == ("stale-disk", 2 * TTL, 0.1, 2)
    assert r.warnings == ("aws catalog refresh for us-east-1 failed: PermissionError: UnauthorizedOperation",)
    # Warnings only: the first read's INFO line is captured too when an earlier test in the worker left the
    # ray_nodeless logger at INFO (the kuberay-autoscaler command does, as the bridge's process wants).
    [record] = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert record.levelname == "WARNING" and "using the last good cache file" in record.getMessage()
    assert str(r.path) in record.getMessage() and "7200 s old" in record.getMessage()


def test_no_disk_copy_and_a_failed_refresh_use_the_embedded_catalog_with_a_warning(cloud, tmp_path, clock, caplog):
    cloud.fail = ConnectionError("endpoint unreachable")
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.core.catalog.refresh"):
        r = resolve(cloud, tmp_path, clock)
    assert (r.source, r.age_s, r.catalog.name) == ("embedded", None, "embedded-stand-in")
    assert "no cache file at" in r.reason and "endpoint unreachable" in r.reason
    assert [rec.levelname for rec in caplog.records if rec.levelno >= logging.WARNING] == ["WARNING"]
    assert not r.path.exists()


def test_ttl_zero_and_force_always_read_the_cloud(cloud, tmp_path, clock):
    resolve(cloud, tmp_path, clock)
    assert resolve(cloud, tmp_path, clock, ttl_s=0).source == "live"
    assert resolve(cloud, tmp_path, clock, force=True).source == "live"
    assert cloud.reads == 3


def test_a_degraded_refresh_does_not_replace_a_better_copy(cloud, tmp_path, clock):
    good = resolve(cloud, tmp_path, clock)
    clock.now = T0 + TTL + 5
    cloud.quality, cloud.warnings, cloud.price = 1, ("on-demand prices from the embedded catalog",), 0.3
    r = resolve(cloud, tmp_path, clock)
    assert (r.source, r.age_s, price(r)) == ("stale-disk", TTL + 5, 0.1)
    assert r.catalog.catalog_id == good.catalog.catalog_id and r.warnings == cloud.warnings
    cloud.quality = 2                            # as good as the copy: the new data wins, its warnings kept
    r = resolve(cloud, tmp_path, clock)
    assert (r.source, price(r), r.warnings) == ("live", 0.3, cloud.warnings)


def test_an_unreadable_cache_file_counts_as_none(cloud, tmp_path, clock, caplog):
    path = cache_path(cloud.live(), tmp_path)
    path.write_bytes(b"not gzip, not json")
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.core.catalog.refresh"):
        assert resolve(cloud, tmp_path, clock).source == "live"
    assert "ignoring unreadable catalog cache" in caplog.text
    path.write_bytes(b"\x1f\x8b broken")
    cloud.fail = TimeoutError("read timed out")
    assert resolve(cloud, tmp_path, clock, ttl_s=0).source == "embedded"


def test_a_document_that_does_not_cover_the_region_is_a_failed_refresh(cloud, tmp_path, clock):
    wrong = doc(0.1)
    wrong["clouds"]["aws"]["regions"] = {"eu-west-1": wrong["clouds"]["aws"]["regions"][REGION]}
    cloud.fetch = lambda: LiveFetch(wrong)       # type: ignore[method-assign]
    r = resolve(cloud, tmp_path, clock)
    assert r.source == "embedded" and "no aws region 'us-east-1'" in r.reason


def test_a_backend_without_a_live_catalog_gets_the_embedded_one_with_the_reason(tmp_path, clock, caplog):
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.core.catalog.refresh"):
        r = resolve_live(None, cache_dir=tmp_path, clock=clock, fallback=embedded_stand_in,
                         no_live_reason="the local backend has no live catalog")
    assert (r.source, r.catalog.name) == ("embedded", "embedded-stand-in")
    assert r.reason.startswith("the local backend has no live catalog; using embedded-stand-in@")
    assert "catalog: live: the local backend" in caplog.text


def test_summary_counts_the_region(cloud, tmp_path, clock):
    s = summarize(resolve(cloud, tmp_path, clock), "aws", REGION)
    assert (s["source"], s["types"], s["offerings"], s["priced"], s["unknown_price"]) == ("live", 1, 2, 1, 1)
    assert (s["on_demand_offerings"], s["spot_offerings"], s["zones"]) == (1, 1, ["us-east-1a"])
    assert s["cache_path"].endswith(".json.gz") and s["age_s"] == 0.0


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "ray-nodeless" / "catalog"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path("~/.cache/ray-nodeless/catalog").expanduser()
