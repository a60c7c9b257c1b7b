"""The live AWS catalog against moto's server. moto serves real specs and AZ offerings; its Pricing API is
unimplemented (HTTP 500) and its spot history a placeholder (0.00001), so prices are faked with botocore hooks on a
botocore session handed in through `session_kwargs`."""
from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.awsrequest import AWSResponse

from ray_nodeless.core.catalog import Catalog, InstanceType, embedded, load_file, region_entry, type_row
from ray_nodeless.core.catalog.refresh import CatalogResult, MemoryCache, resolve_live
from ray_nodeless.providers.aws import catalog as aws_catalog
from ray_nodeless.providers.aws.catalog import (SOURCE_AWS_PRICING, SOURCE_AWS_SPOT, instance_type_from_api,
                                                on_demand_price_from_product, plausible_spot, price_quality)

from ray_nodeless.testing.moto_server import REGION, MotoServer, _Raw, ec2_error, forward, query_params

FAKE_ON_DEMAND = {"m5.large": 0.096, "g4dn.xlarge": 0.526, "t3.micro": 0.0104}
FAKE_SPOT = {("m5.large", "us-east-1a"): 0.0401, ("g4dn.xlarge", "us-east-1b"): 0.2105}


def product(name: str, usd: float) -> str:
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": f"SKU{name}",
                    "attributes": {"instanceType": name, "regionCode": REGION, "operatingSystem": "Linux",
                                   "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}},
        "terms": {"OnDemand": {f"SKU{name}.T": {"priceDimensions": {
            f"SKU{name}.T.D": {"unit": "Hrs", "pricePerUnit": {"USD": f"{usd:.10f}"}}}}}},
    })


# moto's answers to the three read-only catalog calls never change: each is fetched from moto once per test run
# and replayed byte for byte afterwards (moto takes ~2 s to serialise the 1,395 types and 6,436 offerings).
_REPLAY: dict[tuple[str, str], tuple[int, dict, bytes]] = {}
_REPLAYED = ("DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory")


class Fakes:
    """Hooks on one botocore session: count calls, answer Pricing, overwrite spot prices, inject failures."""

    def __init__(self) -> None:
        self.session = botocore.session.Session()
        self.calls: list[str] = []
        self.pricing_ok = True
        self.fake_spot = True
        self.fail: set[str] = set()
        self.session.register("before-send", self._before_send)
        self.session.register("after-call.ec2.DescribeSpotPriceHistory", self._spot)

    @property
    def kwargs(self) -> dict[str, Any]:
        return {"botocore_session": self.session, "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing"}

    def _before_send(self, request: Any, **kw: Any) -> AWSResponse | None:
        op = kw.get("event_name", "").split(".")[-1]
        self.calls.append(op)
        if op in self.fail:
            return ec2_error(request, "UnauthorizedOperation", f"injected failure of {op}", 403)
        if op == "GetProducts" and self.pricing_ok:
            page = {"FormatVersion": "aws_v1", "PriceList": [product(n, p) for n, p in FAKE_ON_DEMAND.items()]}
            return AWSResponse(request.url, 200, {"Content-Type": "application/x-amz-json-1.1"},
                               _Raw(json.dumps(page).encode()))
        if op in _REPLAYED:
            params = query_params(request)
            key = (op, json.dumps({k: v for k, v in params.items() if not k.endswith("Time")}, sort_keys=True))
            if key not in _REPLAY:
                r = forward(request)
                _REPLAY[key] = (r.status_code, {"Content-Type": r.headers.get("Content-Type", "text/xml")},
                                r.content)
            status, headers, body = _REPLAY[key]
            return AWSResponse(request.url, status, headers, _Raw(body))
        return None

    def _spot(self, parsed: dict, **_: Any) -> None:
        if not self.fake_spot:
            return
        for h in parsed.get("SpotPriceHistory", []):
            key = (h["InstanceType"], h["AvailabilityZone"])
            if key in FAKE_SPOT:
                h["SpotPrice"] = str(FAKE_SPOT[key])


@pytest.fixture
def fakes() -> Fakes:
    return Fakes()


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def tiny_catalog() -> Catalog:
    t = InstanceType(cloud="aws", name="m5.large", family="m5", vcpus=2, memory_gib=8, machine_type="m5.large")
    doc = {"format": 1, "name": "tiny", "clouds": {"aws": {
        "types": [type_row(t)],
        "regions": {REGION: region_entry([t], [("m5.large", "us-east-1a", "on-demand", 1.0)])}}}}
    return Catalog(doc, "0" * 64, "tiny")


def run(moto: MotoServer, fakes: Fakes, cache_dir: Path, **kw: Any) -> CatalogResult:
    """The policy over the AWS hook (a fresh memory unless one is given: each call is a new process)."""
    kw.setdefault("ttl_s", 3600)
    kw.setdefault("memory", MemoryCache())
    live = aws_catalog.live_catalog(REGION, session_kwargs=fakes.kwargs, endpoint_url=moto.url)
    return resolve_live(live, cache_dir=cache_dir, **kw)


# ------------------------------------------------------------------------------------------------ parsing


def test_instance_types_from_moto_specs(moto: MotoServer) -> None:
    ec2 = moto.client()
    items = {}
    for page in ec2.get_paginator("describe_instance_types").paginate():
        items.update({i["InstanceType"]: i for i in page["InstanceTypes"]})
    t = {n: instance_type_from_api(i) for n, i in items.items()}
    assert t["mac1.metal"] is None and t["mac2.metal"] is None
    g4 = t["g4dn.xlarge"]
    assert (g4.gpu_model, g4.gpu_count, g4.gpu_memory_gib, g4.vcpus, g4.memory_gib) == ("T4", 1, 16, 4, 16)
    assert t["p4de.24xlarge"].gpu_model == "A100-80GB" and t["p4de.24xlarge"].gpu_count == 8
    assert t["p4d.24xlarge"].gpu_model == "A100"
    inf = t["inf2.xlarge"]
    assert inf.gpu_model == "" and inf.accelerator == "Inferentia2" and inf.accelerator_count == 1
    assert t["inf1.xlarge"].accelerator == "Inferentia"                 # InferenceAcceleratorInfo, not Neuron
    assert t["dl2q.24xlarge"].gpu_model == "" and t["dl2q.24xlarge"].accelerator == "Qualcomm AI100"
    assert t["t3.micro"].burstable and not t["m5.large"].burstable
    assert t["m6g.large"].arch == "arm64" and t["m5.large"].arch == "x86_64"
    assert t["m5.large"].family == "m5" and t["m5.large"].machine_type == "m5.large"
    # Same conventions as the embedded catalog, which was built from the same moto specs: every shared type equal.
    emb = {e.name: e for e in embedded().types("aws")}
    shared = [n for n, x in t.items() if x is not None and n in emb]
    assert len(shared) > 1300
    assert [n for n in shared if t[n] != emb[n]] == []


def test_price_parsing_and_spot_plausibility() -> None:
    assert on_demand_price_from_product(product("m5.large", 0.096)) == ("m5.large", 0.096)
    zero = json.loads(product("x.large", 0.0))
    assert on_demand_price_from_product(zero) is None
    assert not plausible_spot(0.00001, None)                   # moto's placeholder
    assert not plausible_spot(0.001, 0.096)                    # 1 % of on-demand: not a real spot price
    assert plausible_spot(0.04, 0.096) and plausible_spot(0.04, None)


# ------------------------------------------------------------------------------------------------ refresh


def test_live_refresh_with_prices(moto: MotoServer, fakes: Fakes, tmp_path: Path) -> None:
    r = run(moto, fakes, tmp_path)
    assert r.source == "live" and r.warnings[-1].endswith("implausible spot prices discarded")
    doc = r.catalog.doc
    assert doc["name"] == "aws-live-us-east-1" and doc["format"] == 1
    assert doc["price_source"] == {"on_demand": SOURCE_AWS_PRICING, "spot": SOURCE_AWS_SPOT}
    cat = r.catalog
    assert cat.catalog_id.startswith("aws-live-us-east-1@")
    types = cat.types("aws")
    assert 1300 < len(types) < 1400 and not any(t.name.startswith("mac") for t in types)
    rc = cat.region("aws", REGION)
    assert rc.zones == ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")
    assert rc.find("m5.large", "us-east-1a", "on-demand").hourly_price == 0.096
    assert rc.find("m5.large", "us-east-1c", "on-demand").hourly_price == 0.096   # on-demand is region-wide
    assert rc.find("m5.large", "us-east-1a", "spot").hourly_price == 0.0401
    assert rc.find("m5.large", "us-east-1c", "spot").hourly_price is None      # placeholder discarded
    assert rc.find("g4dn.xlarge", "us-east-1b", "spot").hourly_price == 0.2105
    assert rc.find("m6g.large", "us-east-1a", "on-demand").hourly_price is None  # not in the price list
    # The cheapest priced offering comes first (region_entry order), unknown prices last.
    assert rc.offering(0).hourly_price == 0.0104 and rc.offering(len(rc) - 1).hourly_price is None
    assert r.path.exists() and load_file(r.path).catalog_id == cat.catalog_id


def test_moto_as_is_falls_back_to_embedded_prices(moto: MotoServer, fakes: Fakes, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    fakes.pricing_ok = False         # moto's real answer: HTTP 500, "Unable to find appropriate backend"
    fakes.fake_spot = False          # moto's real answer: 0.00001 everywhere
    with caplog.at_level(logging.WARNING, logger="ray_nodeless"):
        r = run(moto, fakes, tmp_path)
    emb = embedded()
    assert r.source == "live"
    assert r.catalog.doc["price_source"] == {"on_demand": f"fallback:{emb.catalog_id}",
                                             "spot": f"fallback:{emb.catalog_id}"}
    rc, erc = r.catalog.region("aws", REGION), emb.region("aws", REGION)
    for name, zone in (("m5.large", "us-east-1a"), ("g4dn.xlarge", "us-east-1b")):
        for cap in ("on-demand", "spot"):
            assert rc.find(name, zone, cap).hourly_price == erc.find(name, zone, cap).hourly_price
    text = caplog.text
    assert "pricing:GetProducts failed" in text and "DescribeSpotPriceHistory gave no plausible prices" in text


def test_ttl_memory_and_disk_cache(moto: MotoServer, fakes: Fakes, tmp_path: Path) -> None:
    memory, clock = MemoryCache(), Clock()
    first = run(moto, fakes, tmp_path, memory=memory, clock=clock)
    n = len(fakes.calls)
    assert {"DescribeInstanceTypes", "DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory",
            "GetProducts"} <= set(fakes.calls)
    clock.now += 600
    again = run(moto, fakes, tmp_path, memory=memory, clock=clock)
    assert again.source == "memory" and again.catalog is first.catalog and len(fakes.calls) == n
    disk = run(moto, fakes, tmp_path, clock=clock)                      # a new process: the disk cache
    assert disk.source == "disk" and disk.catalog.catalog_id == first.catalog.catalog_id and len(fakes.calls) == n
    clock.now += 3600
    stale = run(moto, fakes, tmp_path, memory=memory, clock=clock)     # older than ttl_s: read again
    assert stale.source == "live" and len(fakes.calls) > n
    # A catalog built against another endpoint never shares the cache file of the real one.
    assert first.path.name.startswith("aws-us-east-1-") and first.path.parent == tmp_path
    assert aws_catalog.live_catalog(REGION).cache_name == "aws-us-east-1"


def test_failure_keeps_last_good_cache_then_falls_back(moto: MotoServer, fakes: Fakes, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    good = run(moto, fakes, tmp_path)
    fakes.fail = {"DescribeInstanceTypes"}
    with caplog.at_level(logging.WARNING, logger="ray_nodeless"):
        stale = run(moto, fakes, tmp_path, ttl_s=0)
    assert stale.source == "stale-disk" and stale.catalog.catalog_id == good.catalog.catalog_id
    assert "UnauthorizedOperation" in caplog.text and "using the last good cache file" in caplog.text

    fb = run(moto, fakes, tmp_path / "empty", ttl_s=0, fallback=tiny_catalog)
    assert fb.source == "embedded" and fb.catalog.name == "tiny" and "DescribeInstanceTypes" in fb.warnings[0]


def test_degraded_refresh_does_not_replace_a_better_cache(moto: MotoServer, fakes: Fakes, tmp_path: Path) -> None:
    good = run(moto, fakes, tmp_path)
    fakes.pricing_ok = False
    again = run(moto, fakes, tmp_path, ttl_s=0)
    assert again.source == "stale-disk" and again.catalog.catalog_id == good.catalog.catalog_id
    assert any("pricing:GetProducts failed" in e for e in again.warnings)
    assert price_quality(good.catalog.doc) == 2


def test_unreachable_endpoint_without_cache_uses_fallback(tmp_path: Path) -> None:
    live = aws_catalog.live_catalog(REGION, endpoint_url="http://127.0.0.1:9",
                                    session_kwargs={"aws_access_key_id": "x", "aws_secret_access_key": "y"})
    r = resolve_live(live, cache_dir=tmp_path, fallback=tiny_catalog, memory=MemoryCache())
    assert r.source == "embedded" and r.catalog.name == "tiny"


def cli_json(stdout: str) -> dict:
    """The command's JSON document (moto's in-process server prints its own complaints to stdout first)."""
    return json.loads(stdout[stdout.index("{\n"):])


def test_refresh_cli(moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ray-nodeless catalog refresh` goes through the same hook and policy: the cache `catalog: live` reads, and
    --out. moto as it is: no Pricing API, placeholder spot prices (patched from the embedded catalog)."""
    from click.testing import CliRunner

    from ray_nodeless.cli.main import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    out = tmp_path / "out" / "aws-us-east-1.json.gz"
    args = ["catalog", "refresh", "--cloud", "aws", "--region", REGION, "--endpoint-url", moto.url,
            "--cache-dir", str(tmp_path / "cache"), "--json"]
    r = CliRunner().invoke(main, args + ["--out", str(out)])
    assert r.exit_code == 0, r.output + r.stderr
    s = cli_json(r.stdout)
    assert s["written"] == str(out) and s["source"] == "live" and out.exists()
    assert s["offerings"] == s["priced"] + s["unknown_price"] == s["on_demand_offerings"] + s["spot_offerings"]
    assert s["types"] > 1300 and s["priced"] > 0 and s["unknown_price"] > 0
    assert s["price_source"]["on_demand"].startswith("fallback:") and s["warnings"]
    loaded = load_file(out)
    assert loaded.name == "aws-live-us-east-1" and len(loaded.region("aws", REGION)) == s["offerings"]
    assert json.loads(gzip.decompress(out.read_bytes()))["format"] == 1
    cached = Path(s["cache_path"])
    assert cached.parent == tmp_path / "cache" and load_file(cached).catalog_id == loaded.catalog_id

    out2 = tmp_path / "x.json"
    r2 = CliRunner().invoke(main, ["catalog", "refresh", "--cloud", "aws", "--region", REGION,
                                                   "--endpoint-url", "http://127.0.0.1:9", "--cache-dir",
                                                   str(tmp_path / "none"), "--out", str(out2), "--json"])
    s2 = cli_json(r2.stdout)
    assert r2.exit_code == 1 and s2["source"] == "embedded" and s2["written"] is None and not out2.exists()
    assert r2.stderr.startswith("ray-nodeless: error: aws catalog refresh for us-east-1 failed")
