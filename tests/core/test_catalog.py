"""The embedded catalog: coverage of every region, records, the published experiment's prices, lazy loading per
region, unknown regions, single-file catalogs (what the live refreshers write), determinism of the build."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.catalog import (
    CAPACITY_TYPES,
    FORMAT_VERSION,
    InstanceType,
    dump_bytes,
    load_file,
    region_entry,
    type_row,
    write_atomic,
)
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.requirements import Request, Requirements, Shape
from ray_nodeless.errors import CatalogError, NoFeasibleOffering
from tests import REPO_ROOT

ROOT = REPO_ROOT
DATA = ROOT / "ray_nodeless" / "data" / "catalog"
SOURCE = ROOT.parent / "shared" / "catalog"     # the reference CSVs, next to the repository (only to rebuild)
INDEX = json.loads((DATA / "index.json").read_bytes())
ALL_REGIONS = [(c, r) for c in sorted(INDEX["clouds"]) for r in sorted(INDEX["clouds"][c]["regions"])]


@pytest.fixture(scope="module")
def cat():
    return catalog_mod.embedded()


@pytest.fixture(scope="module")
def planner(cat):
    return Planner(cat)


def recording_catalog() -> tuple[catalog_mod.Catalog, list[str]]:
    """A fresh catalog on the embedded files whose region-file reads are recorded by name."""
    reads: list[str] = []

    def read(name: str) -> bytes:
        reads.append(name)
        return (DATA / name).read_bytes()

    return catalog_mod.load_index((DATA / "index.json").read_bytes(), read, "recording"), reads


# ------------------------------------------------------------------------------------------------- coverage


def test_covers_every_region_of_the_reference_data(cat):
    aws, gcp = cat.regions("aws"), cat.regions("gcp")
    assert len(aws) == 30 and len(gcp) == 44
    assert {"us-east-1", "us-west-2", "eu-west-1", "ap-southeast-5", "ca-west-1", "il-central-1"} <= set(aws)
    assert {"us-central1", "us-west1", "europe-west4", "europe-west10", "us-central2", "africa-south1"} <= set(gcp)
    assert aws == sorted(aws) and cat.clouds == ["aws", "gcp"]


def test_catalog_id_names_the_index_sha256_and_the_index_names_every_region_file(cat):
    raw = (DATA / "index.json").read_bytes()
    assert cat.sha256 == hashlib.sha256(raw).hexdigest()
    assert cat.catalog_id == f"{cat.name}@{cat.sha256[:12]}" and cat.name == "embedded-" + cat.built
    named = set()
    for cloud, region in ALL_REGIONS:
        d = INDEX["clouds"][cloud]["regions"][region]
        assert d["file"] == f"{cloud}-{region}.json.gz"
        assert hashlib.sha256((DATA / d["file"]).read_bytes()).hexdigest() == d["sha256"]
        named.add(d["file"])
    assert {p.name for p in DATA.iterdir()} == named | {"index.json"}, "stray or missing files in the data folder"


@pytest.mark.parametrize("cloud,region", ALL_REGIONS, ids=[f"{c}-{r}" for c, r in ALL_REGIONS])
def test_every_region_loads_in_base_order_and_plans_a_simple_shape(cat, planner, cloud, region):
    rc = cat.region(cloud, region)
    d = INDEX["clouds"][cloud]["regions"][region]
    assert len(rc) == d["offerings"] > 0 and list(rc.zones) == d["zones"]
    assert all(z.startswith(region) for z in rc.zones)
    # Base order: known prices ascending, then unknown; every (type, zone, capacity) once.
    known = ~np.isnan(rc.o_price)
    n_known = int(known.sum())
    assert known[:n_known].all() and not known[n_known:].any()
    assert (np.diff(rc.o_price[:n_known]) >= 0).all()
    keys = rc.o_type.astype(np.int64) * 10_000 + rc.o_zone * 10 + rc.o_cap
    assert len(np.unique(keys)) == len(rc)

    plan = planner.plan(Request(cloud, region, Shape(cpu=2, memory_gib=4), Requirements(capacity=("on-demand",))))
    o = plan.chosen
    assert o.region == region and o.zone in rc.zones and o.capacity == "on-demand"
    assert o.hourly_price is not None and o.hourly_price > 0
    t = o.instance_type
    assert t.cloud == cloud and t.vcpus >= 2 and t.memory_gib >= 4 and t.gpu_count == 0 and not t.burstable
    assert plan.catalog_id == cat.catalog_id


def test_us_central2_is_the_one_n1_row_the_source_has(cat):
    """The source lists TPUs (skipped: not VMs) and one n1-highmem-8 row in us-central2."""
    rc = cat.region("gcp", "us-central2")
    assert {o.instance_type.name for o in rc.offerings()} == {"n1-highmem-8"}
    assert rc.find("n1-highmem-8", "us-central2-b", "on-demand").hourly_price == pytest.approx(0.47321)


def test_regions_without_spot_prices_keep_spot_as_unknown(cat, planner):
    for region in ("ap-southeast-5", "ca-west-1"):
        rc = cat.region("aws", region)
        spot = rc.o_cap == CAPACITY_TYPES.index("spot")
        assert spot.any() and np.isnan(rc.o_price[spot]).all()
        with pytest.raises(NoFeasibleOffering, match="unknown_price"):
            planner.plan(Request("aws", region, Shape(cpu=2), Requirements(capacity=("spot",))))


# ------------------------------------------------------------------------------------------------- records


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
    assert cat.instance_type("aws", "no-such.type") is None


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


# ------------------------------------------------------------------------------------------------- unknown regions


def test_unknown_region_names_the_nearest_ones(cat):
    with pytest.raises(CatalogError) as e:
        cat.region("gcp", "europe-west99")
    msg = str(e.value)
    assert f"catalog {cat.catalog_id} has no gcp region 'europe-west99'; nearest: europe-west9, europe-west1" in msg
    assert "of its 44 gcp regions" in msg
    with pytest.raises(CatalogError, match=r"no aws region 'us-west-3'; nearest: us-west-\d, us-west-\d.*30 aws"):
        cat.region("aws", "us-west-3")
    # An AWS region asked of GCP: the GCP spelling comes first.
    with pytest.raises(CatalogError, match=r"no gcp region 'us-west-1'; nearest: us-west1, "):
        cat.region("gcp", "us-west-1")
    with pytest.raises(CatalogError, match="no cloud 'azure'"):
        cat.region("azure", "eastus")


def test_unknown_region_fails_the_planner_the_same_way(planner):
    with pytest.raises(CatalogError, match="nearest: europe-west9"):
        planner.plan(Request("gcp", "europe-west99", Shape(cpu=1), Requirements()))


# ------------------------------------------------------------------------------------------------- lazy loading


def test_the_index_alone_answers_everything_but_offerings():
    cat, reads = recording_catalog()
    assert len(cat.regions("aws")) == 30 and len(cat.regions("gcp")) == 44
    assert cat.instance_type("aws", "g4dn.4xlarge").gpu_model == "T4"
    assert len(cat.types("gcp")) > 500 and cat.catalog_id.startswith("embedded-")
    with pytest.raises(CatalogError):
        cat.region("gcp", "europe-west99")
    assert reads == [] and cat.loaded_regions() == []


def test_a_region_file_is_read_once_when_the_region_is_first_used():
    cat, reads = recording_catalog()
    rc = cat.region("aws", "us-west-2")
    assert reads == ["aws-us-west-2.json.gz"]
    assert cat.region("aws", "us-west-2") is rc
    Planner(cat).plan(Request("aws", "us-west-2", Shape(cpu=4, gpu=1), Requirements(capacity=("spot",))))
    assert reads == ["aws-us-west-2.json.gz"]
    Planner(cat).plan(Request("gcp", "us-central1", Shape(cpu=4), Requirements()))
    assert reads == ["aws-us-west-2.json.gz", "gcp-us-central1.json.gz"]
    assert cat.loaded_regions() == [("aws", "us-west-2"), ("gcp", "us-central1")]


def test_a_cold_plan_command_reads_the_index_and_one_region_file():
    """A fresh `ray-nodeless plan` of a us-west-2 cluster opens exactly two catalog files (audit hook on open)."""
    code = (
        "import sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda ev, args: opened.append(str(args[0])) if ev == 'open' and args else None)\n"
        "from ray_nodeless.cli import main\n"
        "try:\n"
        "    main(['plan', 'cluster-configs/aws-gpu-head.yaml'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print('OPENED', sorted({p.rsplit('/', 1)[-1] for p in opened if '/data/catalog/' in p}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "g4dn.4xlarge" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "OPENED ['aws-us-west-2.json.gz', 'index.json']"


# ------------------------------------------------------------------------------------------------- integrity


@pytest.fixture
def copied(tmp_path):
    dst = tmp_path / "catalog"
    shutil.copytree(DATA, dst)
    return dst


def test_an_index_catalog_loads_from_a_directory_or_its_index(copied):
    for path in (copied, copied / "index.json"):
        c = load_file(path)
        assert c.catalog_id == catalog_mod.embedded().catalog_id
        assert c.region("gcp", "europe-west4").find("n1-standard-8+1xT4", "europe-west4-a", "on-demand") is not None


def test_a_changed_region_file_is_refused(copied):
    p = copied / "aws-us-east-1.json.gz"
    doc = json.loads(gzip.decompress(p.read_bytes()))
    doc["price"][0] = 0.0001
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    c = load_file(copied)
    c.region("aws", "us-west-2")   # the other regions are unaffected
    with pytest.raises(CatalogError, match=r"us-east-1 file aws-us-east-1.json.gz has sha256 .* the index names"):
        c.region("aws", "us-east-1")


def test_a_missing_region_file_is_a_clear_error(copied):
    (copied / "gcp-us-west1.json.gz").unlink()
    with pytest.raises(CatalogError, match="cannot read the gcp us-west1 file gcp-us-west1.json.gz"):
        load_file(copied).region("gcp", "us-west1")


def test_a_region_file_must_hold_its_own_region(copied):
    a, b = copied / "aws-us-east-1.json.gz", copied / "aws-us-west-2.json.gz"
    index = json.loads((copied / "index.json").read_bytes())
    regions = index["clouds"]["aws"]["regions"]
    regions["us-east-1"]["file"] = b.name
    regions["us-east-1"]["sha256"] = hashlib.sha256(b.read_bytes()).hexdigest()
    (copied / "index.json").write_text(json.dumps(index))
    assert a.exists()
    with pytest.raises(CatalogError, match="holds format 1 aws us-west-2, not format 1 aws us-east-1"):
        load_file(copied).region("aws", "us-east-1")


def test_an_index_needs_its_region_files():
    with pytest.raises(CatalogError, match="needs its region files"):
        catalog_mod.Catalog(INDEX, "0" * 64, "bare")


def test_corrupt_catalog_file_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.json.gz"
    p.write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(catalog_mod.CatalogError, match="not a catalog file"):
        catalog_mod.load_file(p)
    p.write_bytes(gzip.compress(json.dumps({"format": 99}).encode()))
    with pytest.raises(catalog_mod.CatalogError, match="format"):
        catalog_mod.load_file(p)
    p.write_bytes(b"[1, 2]")
    with pytest.raises(catalog_mod.CatalogError, match="not a catalog file"):
        catalog_mod.load_file(p)


# ------------------------------------------------------------------------------------------------- single files


def test_a_single_file_catalog_as_the_live_refreshers_write_it(tmp_path):
    types = [InstanceType("aws", "m5.large", "m5", 2, 8, machine_type="m5.large"),
             InstanceType("aws", "g4dn.xlarge", "g4dn", 4, 16, "T4", 1, 16, machine_type="g4dn.xlarge")]
    rows = [("g4dn.xlarge", "us-east-1a", "on-demand", 0.526), ("m5.large", "us-east-1a", "on-demand", 0.096),
            ("m5.large", "us-east-1b", "spot", None)]
    doc = {"format": FORMAT_VERSION, "name": "aws-live-us-east-1", "built": "now",
           "clouds": {"aws": {"types": [type_row(t) for t in types],
                              "regions": {"us-east-1": region_entry(types, rows)}}}}
    path = tmp_path / "cache" / "aws-us-east-1.json.gz"
    raw = dump_bytes(doc)
    write_atomic(path, raw)
    c = load_file(path)
    assert c.catalog_id == f"aws-live-us-east-1@{hashlib.sha256(raw).hexdigest()[:12]}"
    assert c.doc is c.index and c.doc["name"] == "aws-live-us-east-1"
    assert [(o.instance_type.name, o.hourly_price) for o in c.region("aws", "us-east-1").offerings()] == \
        [("m5.large", 0.096), ("g4dn.xlarge", 0.526), ("m5.large", None)]
    assert c.instance_type("aws", "g4dn.xlarge") == types[1]
    with pytest.raises(CatalogError, match=r"no aws region 'us-east-2'; nearest: us-east-1 \(of its 1 aws region\)$"):
        c.region("aws", "us-east-2")


def test_the_embedded_catalog_exports_as_one_single_file(tmp_path):
    """`Catalog.doc` of the index catalog is the whole catalog as one document (`catalog refresh` falls back to
    writing it): it loads back with the same offerings."""
    cat, reads = recording_catalog()
    path = tmp_path / "all.json.gz"
    write_atomic(path, dump_bytes(cat.doc))
    assert len(reads) == len(ALL_REGIONS)
    again = load_file(path)
    assert again.regions("gcp") == cat.regions("gcp") and again.built == cat.built
    for cloud, region in (("aws", "eu-west-1"), ("gcp", "us-central2")):
        a, b = cat.region(cloud, region), again.region(cloud, region)
        assert [o.to_dict() for o in a.offerings()] == [o.to_dict() for o in b.offerings()]


def test_write_atomic_replaces_whole_files_only(tmp_path):
    p = tmp_path / "a" / "b.json"
    write_atomic(p, b"one")
    assert p.read_bytes() == b"one"
    os.chmod(p, 0o640)
    write_atomic(p, "two", durable=True)
    assert p.read_text() == "two" and stat.S_IMODE(p.stat().st_mode) == 0o640   # the mode is kept
    write_atomic(p, b"three", mode=0o644)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    with pytest.raises(TypeError):
        write_atomic(p, None)   # type: ignore[arg-type]
    assert p.read_bytes() == b"three" and sorted(x.name for x in p.parent.iterdir()) == ["b.json"]


# ------------------------------------------------------------------------------------------------- the build


def test_builder_is_deterministic(tmp_path):
    """Same reference CSVs -> byte-identical files, equal to the committed ones (run twice, compare)."""
    if not (SOURCE / "aws_vms.csv").exists() or not (SOURCE / "gcp_vms.csv").exists():
        pytest.skip(f"the reference CSVs are not at {SOURCE} (../shared/catalog next to the repository); "
                    "they are only needed to rebuild the catalog, so this check cannot run here")
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_catalog.py"), "--source", str(SOURCE),
                        "--out", str(out)], check=True, capture_output=True, timeout=300)
        outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    committed = {p.name: p.read_bytes() for p in sorted(DATA.iterdir())}
    assert outs[0] == outs[1]
    assert sorted(outs[0]) == sorted(committed)
    assert [n for n in committed if outs[0][n] != committed[n]] == [], "rebuild with `make catalog` and commit"
