"""Live GCP catalog refresh against the fake Compute server (ray_nodeless.testing.fake_gce), priced from a small
hand-made catalog, through the one refresh policy (core/catalog/refresh.py): cached on disk like AWS."""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Iterator

import pytest

from ray_nodeless.core.catalog import Catalog, InstanceType, embedded, region_entry, type_row
from ray_nodeless.core.catalog.refresh import MemoryCache, resolve_live, summarize
from ray_nodeless.errors import ConfigError
from ray_nodeless.launch.catalog import catalog_result
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.gcp import catalog as gcp_catalog
from ray_nodeless.testing.fake_gce import FakeGce

PROJECT = "test-project"
REGION = "us-central1"

E2 = InstanceType(cloud="gcp", name="e2-standard-4", family="e2", vcpus=4, memory_gib=16, machine_type="e2-standard-4")
N1 = InstanceType(cloud="gcp", name="n1-standard-8", family="n1", vcpus=8, memory_gib=30, machine_type="n1-standard-8")
N1T4 = InstanceType(cloud="gcp", name="n1-standard-8+1xT4", family="n1", vcpus=8, memory_gib=30, gpu_model="T4",
                    gpu_count=1, gpu_memory_gib=16, machine_type="n1-standard-8", attached_gpu="nvidia-tesla-t4")
N1V100x8 = InstanceType(cloud="gcp", name="n1-standard-8+8xV100", family="n1", vcpus=8, memory_gib=30,
                        gpu_model="V100", gpu_count=8, gpu_memory_gib=128, machine_type="n1-standard-8",
                        attached_gpu="nvidia-tesla-v100")
A2 = InstanceType(cloud="gcp", name="a2-highgpu-1g", family="a2", vcpus=12, memory_gib=85, gpu_model="A100",
                  gpu_count=1, gpu_memory_gib=40, machine_type="a2-highgpu-1g")
GONE = InstanceType(cloud="gcp", name="m1-retired-96", family="m1", vcpus=96, memory_gib=1400,
                    machine_type="m1-retired-96")


def price_catalog() -> Catalog:
    """Prices for zones a and b only; zone f and several live types are not priced here."""
    types = [A2, E2, GONE, N1, N1T4, N1V100x8]
    rows = []
    for zone in ("us-central1-a", "us-central1-b"):
        rows += [("e2-standard-4", zone, "on-demand", 0.134), ("e2-standard-4", zone, "spot", 0.067),
                 ("n1-standard-8", zone, "on-demand", 0.38), ("n1-standard-8", zone, "spot", 0.08),
                 ("n1-standard-8+1xT4", zone, "on-demand", 0.73), ("n1-standard-8+1xT4", zone, "spot", 0.30),
                 ("a2-highgpu-1g", zone, "on-demand", 3.67), ("a2-highgpu-1g", zone, "spot", None),
                 ("m1-retired-96", zone, "on-demand", 9.0)]
    rows.append(("e2-standard-4", "us-central1-b", "spot", 0.05))   # zone b is cheaper: regional price = min
    rows = [r for r in rows if not (r[0] == "e2-standard-4" and r[1] == "us-central1-b" and r[3] == 0.067)]
    doc = {"format": 1, "name": "test-prices", "clouds": {"gcp": {
        "types": [type_row(t) for t in types], "regions": {REGION: region_entry(types, rows)}}}}
    return Catalog(doc, hashlib.sha256(b"test-prices").hexdigest(), "test")


@pytest.fixture
def fake() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT, page_size=3) as f:    # small pages: the pagers must follow nextPageToken
        # no T4 in zone c: the N1+T4 combination must not be offered there
        del f.accelerator_types["us-central1-c"]["nvidia-tesla-t4"]
        yield f


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def refresh(fake: FakeGce, tmp_path: Path, region: str = REGION, prices: Catalog | None = None,
            **kw) -> tuple[Catalog, dict]:  # type: ignore[no-untyped-def]
    """The policy over the GCP hook (a fresh memory unless one is given: each call is a new process)."""
    prices = prices or price_catalog()
    kw.setdefault("memory", MemoryCache())
    live = gcp_catalog.live_catalog(region, PROJECT, api_endpoint=fake.url, credentials="anonymous",
                                    prices=lambda: prices)
    result = resolve_live(live, cache_dir=tmp_path, **kw)
    return result.catalog, summarize(result, "gcp", region)


def test_live_refresh_builds_region_from_the_api(fake: FakeGce, tmp_path: Path) -> None:
    cat, summary = refresh(fake, tmp_path)
    assert cat.name == "gcp-live-us-central1"
    assert cat.doc["price_source"] == "embedded" and cat.doc["not_refreshed"]
    r = cat.region("gcp", REGION)
    assert r.zones == ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")   # europe excluded
    names = {t.name for t in cat.types("gcp")}
    assert "m1-retired-96" not in names                                     # not offered live: dropped
    assert {"e2-small", "t2a-standard-4", "g2-standard-8", "n1-standard-8+1xT4", "n1-standard-8+8xV100"} <= names
    t2a = cat.instance_type("gcp", "t2a-standard-4")
    assert t2a is not None and t2a.arch == "arm64"
    e2s = cat.instance_type("gcp", "e2-small")
    assert e2s is not None and e2s.burstable
    a2 = cat.instance_type("gcp", "a2-highgpu-1g")
    assert a2 is not None and (a2.gpu_model, a2.gpu_count, a2.gpu_memory_gib, a2.attached_gpu) == ("A100", 1, 40, "")
    g2 = cat.instance_type("gcp", "g2-standard-8")
    assert g2 is not None and (g2.gpu_model, g2.gpu_memory_gib) == ("L4", 24)
    n1t4 = cat.instance_type("gcp", "n1-standard-8+1xT4")
    assert n1t4 is not None and (n1t4.machine_type, n1t4.attached_gpu) == ("n1-standard-8", "nvidia-tesla-t4")

    # prices: exact row, else the regional price (min over zones) of the same type and capacity, else unknown
    assert r.find("e2-standard-4", "us-central1-a", "spot").hourly_price == 0.067
    assert r.find("e2-standard-4", "us-central1-f", "spot").hourly_price == 0.05
    assert r.find("n1-standard-8+1xT4", "us-central1-f", "on-demand").hourly_price == 0.73
    assert r.find("a2-highgpu-1g", "us-central1-a", "spot").hourly_price is None
    assert r.find("n2-standard-8", "us-central1-a", "on-demand").hourly_price is None   # not in the price catalog
    # the T4 combination exists only where the zone offers T4; 8xV100 fits (max 8 cards)
    assert r.find("n1-standard-8+1xT4", "us-central1-c", "on-demand") is None
    assert r.find("n1-standard-8+8xV100", "us-central1-c", "spot") is not None

    assert summary["source"] == "live" and summary["warnings"] == []
    assert summary["types"] == len(names)
    assert summary["offerings"] == len(r) == summary["priced"] + summary["unknown_price"]
    assert summary["priced"] == sum(1 for o in r.offerings() if o.hourly_price is not None) > 0
    # every zone's machineTypes and acceleratorTypes list was read, with pagination
    assert fake.count("zones.list") >= 1
    mt_pages = [c for c in fake.calls("machineTypes.list") if c.path.endswith("us-central1-a/machineTypes")]
    assert len(mt_pages) == 3 and mt_pages[1].query["pageToken"] == "3"
    assert not any("europe" in c.path for c in fake.requests)


def test_fresh_cache_is_used_without_calling_the_api(fake: FakeGce, tmp_path: Path) -> None:
    clock = Clock()
    cat1, s1 = refresh(fake, tmp_path, clock=clock)
    assert s1["cache_path"].startswith(str(tmp_path / "gcp-us-central1-")) and Path(s1["cache_path"]).exists()
    n = len(fake.requests)
    clock.now += 3599
    cat2, summary = refresh(fake, tmp_path, clock=clock, ttl_s=3600)   # a new process, the disk copy is fresh
    assert len(fake.requests) == n
    assert (summary["source"], summary["age_s"]) == ("disk", 3599) and cat2.catalog_id == cat1.catalog_id
    assert cat2.region("gcp", REGION).find("e2-standard-4", "us-central1-a", "spot").hourly_price == 0.067
    clock.now += 2
    _, again = refresh(fake, tmp_path, clock=clock, ttl_s=3600)          # older than the TTL: read again
    assert again["source"] == "live" and len(fake.requests) > n


def test_failure_falls_back_to_last_good_cache(fake: FakeGce, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    cat1, _ = refresh(fake, tmp_path)
    fake.fail_method("machineTypes.list", status=500, times=None)
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.core.catalog.refresh"):
        cat2, summary = refresh(fake, tmp_path, ttl_s=0)          # refresh is attempted, fails
    assert summary["source"] == "stale-disk" and "InternalServerError" in summary["warnings"][0]
    assert cat2.catalog_id == cat1.catalog_id
    assert any("last good cache file" in r.getMessage() for r in caplog.records)


def test_failure_without_cache_falls_back_to_embedded(fake: FakeGce, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    fallback = price_catalog()
    fake.fail_method("zones.list", status=403, times=None, message="Required 'compute.zones.list' permission",
                     reason="forbidden")
    with caplog.at_level(logging.WARNING, logger="ray_nodeless.core.catalog.refresh"):
        cat, summary = refresh(fake, tmp_path, fallback=lambda: fallback)
    assert cat is fallback
    assert summary["source"] == "embedded" and "Forbidden" in summary["warnings"][0]
    assert summary["offerings"] == len(fallback.region("gcp", REGION))
    assert any("refresh for us-central1 failed" in r.getMessage() for r in caplog.records)
    assert list(tmp_path.iterdir()) == []


def test_unknown_region_falls_back(fake: FakeGce, tmp_path: Path) -> None:
    fallback = price_catalog()
    cat, summary = refresh(fake, tmp_path, region="asia-south9", prices=fallback, fallback=lambda: fallback)
    assert cat is fallback and "no UP zone" in summary["reason"]


def provider_block(fake: FakeGce, **kw: object) -> dict:
    return {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp", "region": REGION,
            "project_id": PROJECT, "api_endpoint": fake.url, "credentials": "anonymous", "catalog": "live", **kw}


def test_provider_catalog_live_goes_through_the_hook_and_honours_catalog_ttl_s(fake: FakeGce,
                                                                               tmp_path: Path) -> None:
    """`provider.catalog: live` on gcp (what NodelessProvider loads at its first launch): the GcpConfig hook, the
    disk cache, `catalog_ttl_s`; priced from the real embedded catalog by default."""
    provider = provider_block(fake, catalog_ttl_s=600)
    bundle = load_provider(provider)
    settings, gcp = bundle.core, bundle.backend_settings     # what the provider object hands catalog_result
    assert settings.catalog_ttl_s == 600
    clock, memory = Clock(), MemoryCache()
    r = catalog_result(settings, gcp, cache_dir=tmp_path, clock=clock, memory=memory)
    assert r.source == "live" and r.path is not None and r.path.exists()
    cat = r.catalog
    assert cat.doc["price_catalog"] == embedded().catalog_id
    emb, live = embedded().region("gcp", REGION), cat.region("gcp", REGION)
    for name in ("n1-standard-8+1xT4", "e2-standard-4", "a2-highgpu-1g"):
        for cap in ("on-demand", "spot"):
            want, got = emb.find(name, "us-central1-a", cap), live.find(name, "us-central1-a", cap)
            assert want is not None and got is not None and got.hourly_price == want.hourly_price
    n = len(fake.requests)
    clock.now += 599
    assert catalog_result(settings, gcp, cache_dir=tmp_path, clock=clock, memory=memory).source == "memory"
    assert catalog_result(settings, gcp, cache_dir=tmp_path, clock=clock).source == "disk"
    assert len(fake.requests) == n
    clock.now += 2                                         # past catalog_ttl_s
    assert catalog_result(settings, gcp, cache_dir=tmp_path, clock=clock, memory=memory).source == "live"
    assert len(fake.requests) > n
    # Another project or endpoint never shares the cache file.
    other = gcp_catalog.live_catalog(REGION, "other-project", api_endpoint=fake.url)
    assert other.cache_name != gcp_catalog.live_catalog_for(gcp, REGION).cache_name


def test_live_hook_needs_a_project() -> None:
    """The hook reads the parsed settings, so a block without a project never reaches it: the loader names the key."""
    with pytest.raises(ConfigError, match=r"^provider.project_id: is required"):
        load_provider({"cloud": "gcp", "region": REGION, "catalog": "live"})
