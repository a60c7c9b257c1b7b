"""The embedded catalog: coverage, records, the published experiment's prices, determinism of the file."""
from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.catalog import CAPACITY_TYPES
from tests import REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def cat():
    return catalog_mod.embedded()


def test_covers_the_six_regions(cat):
    assert cat.regions("aws") == ["eu-west-1", "us-east-1", "us-west-2"]
    assert cat.regions("gcp") == ["europe-west4", "us-central1", "us-west1"]


def test_catalog_id_names_the_file_sha256(cat):
    raw = (ROOT / "ray_nodeless" / "data" / "catalog.json.gz").read_bytes()
    assert cat.sha256 == hashlib.sha256(raw).hexdigest()
    assert cat.catalog_id.endswith("@" + cat.sha256[:12])


@pytest.mark.parametrize("region,name,capacity,price", [
    ("us-west-2", "g4dn.4xlarge", "on-demand", 1.204),
    ("us-east-1", "g4dn.4xlarge", "on-demand", 1.204),
    ("us-west-2", "g4dn.2xlarge", "on-demand", 0.752),
    ("us-west-2", "m5d.2xlarge", "on-demand", 0.452),
    ("eu-west-1", "g4dn.4xlarge", "on-demand", 1.342),
])
def test_published_experiment_prices(cat, region, name, capacity, price):
    rc = cat.region("aws", region)
    zone = sorted(z for z in rc.zones)[0]
    o = rc.find(name, zone, capacity)
    assert o is not None and o.hourly_price == pytest.approx(price)


def test_records_carry_specs(cat):
    g = cat.instance_type("aws", "g4dn.4xlarge")
    assert (g.family, g.vcpus, g.memory_gib, g.gpu_model, g.gpu_count, g.gpu_memory_gib, g.arch, g.burstable) == \
        ("g4dn", 16, 64, "T4", 1, 16, "x86_64", False)
    assert cat.instance_type("aws", "t3.large").burstable
    assert cat.instance_type("aws", "m7g.large").arch == "arm64"
    assert cat.instance_type("aws", "inf2.xlarge").accelerator.lower().startswith("inferentia")
    assert cat.instance_type("aws", "inf2.xlarge").gpu_count == 0
    assert cat.instance_type("gcp", "e2-micro").burstable
    assert cat.instance_type("gcp", "t2a-standard-4").arch == "arm64"


def test_gcp_gpu_machines_are_priced_host_plus_accelerator(cat):
    rc = cat.region("gcp", "us-central1")
    a2 = rc.find("a2-highgpu-1g", "us-central1-a", "on-demand")
    assert a2.instance_type.gpu_model == "A100" and a2.instance_type.gpu_count == 1
    assert a2.hourly_price == pytest.approx(0.73948 + 2.93391)
    n1 = rc.find("n1-standard-8+1xT4", "us-central1-a", "on-demand")
    assert n1.instance_type.machine_type == "n1-standard-8"
    assert n1.instance_type.attached_gpu == "nvidia-tesla-t4"
    assert n1.hourly_price == pytest.approx(0.38 + 0.35, abs=1e-4)
    g2 = cat.instance_type("gcp", "g2-standard-48")
    assert (g2.gpu_model, g2.gpu_count) == ("L4", 4)
    # V100 allows at most 12 vCPUs per GPU on N1: no n1-standard-16 with one V100.
    assert cat.instance_type("gcp", "n1-standard-16+1xV100") is None
    assert cat.instance_type("gcp", "n1-standard-16+2xV100") is not None


def test_cross_cloud_gpu_vocabulary(cat):
    aws = {t.gpu_model for t in cat.types("aws") if t.gpu_model}
    gcp = {t.gpu_model for t in cat.types("gcp") if t.gpu_model}
    assert {"T4", "L4", "A10G", "A100", "H100", "V100"} <= aws
    assert {"T4", "L4", "A100", "A100-80GB", "H100", "V100", "P100", "P4"} <= gcp
    assert "A100-80GB" in aws   # p4de carries 80 GB A100s
    assert all(m == m.upper() and " " not in m for m in aws | gcp)


def test_unknown_prices_are_kept_as_unknown(cat):
    rc = cat.region("aws", "us-east-1")
    unknown = [o for o in rc.offerings() if o.hourly_price is None]
    assert unknown, "the AWS data has unpriced types (families newer than 2025-03)"
    # Unknown prices sort after every known price in the base order.
    first_unknown = next(i for i in range(len(rc)) if rc.offering(i).hourly_price is None)
    assert all(rc.offering(i).hourly_price is None for i in range(first_unknown, len(rc)))


def test_base_order_is_price_name_zone_capacity(cat):
    rc = cat.region("gcp", "us-west1")
    keys = []
    for o in rc.offerings():
        if o.hourly_price is None:
            break
        keys.append((o.hourly_price, o.instance_type.name, o.zone, CAPACITY_TYPES.index(o.capacity)))
    assert keys == sorted(keys)


def test_regions_are_built_on_first_use_only():
    fresh = catalog_mod.load_file(ROOT / "ray_nodeless" / "data" / "catalog.json.gz")
    assert fresh._regions == {}
    rc = fresh.region("aws", "us-west-2")
    assert list(fresh._regions) == [("aws", "us-west-2")]
    assert fresh.region("aws", "us-west-2") is rc


def test_builder_is_deterministic(tmp_path):
    src = ROOT.parent / "shared" / "catalog"
    if not src.exists():
        pytest.skip("reference CSVs not present (only needed to rebuild the catalog)")
    out = tmp_path / "c.json.gz"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_catalog.py"), "--source", str(src), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == (ROOT / "ray_nodeless" / "data" / "catalog.json.gz").read_bytes()


def test_corrupt_catalog_file_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.json.gz"
    p.write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(catalog_mod.CatalogError, match="not a catalog file"):
        catalog_mod.load_file(p)
    p.write_bytes(gzip.compress(json.dumps({"format": 99}).encode()))
    with pytest.raises(catalog_mod.CatalogError, match="format"):
        catalog_mod.load_file(p)
