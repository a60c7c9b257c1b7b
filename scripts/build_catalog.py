#!/usr/bin/env python3
"""Build the embedded catalog `ray_nodeless/data/catalog/` from the reference CSVs, every region of both files.

    python scripts/build_catalog.py --source ../shared/catalog          # or: make catalog

Run it only when the reference data changes; the built files are committed, and nothing at install, run or test
time reads the CSVs. Output (format: `ray_nodeless/core/catalog/encoding.py`): `index.json` (per cloud the
instance-type table and, per region, its file name, sha256, offering count and zones) and one gzip file per
(cloud, region), `<cloud>-<region>.json.gz`. Same input, byte-identical output (sorted keys, gzip mtime 0); region
files of regions no longer in the source are removed. What it does with the data, and why:
- AWS (`aws_vms.csv`, 30 regions): one row per instance type x zone. An empty price means unknown (kept, never
  chosen; about 37 % of type x region pairs, see the source README). Spot is offered only where `SpotSupported` is
  true; an empty spot price is unknown (ap-southeast-5 and ca-west-1 have no spot price at all). Mac types
  (`*_mac` arch) are dropped: they need dedicated hosts. GPU names go through the cross-cloud vocabulary; A100 with
  80 GB per GPU becomes `A100-80GB`. Inferentia/Trainium/Qualcomm devices are recorded as non-GPU accelerators.
- GCP (`gcp_vms.csv`, 44 regions): rows with an empty InstanceType are attachable accelerators priced alone.
  a2/a3/a4/g2 machine types carry GPUs that the CSV does not name; their GPU comes from the machine-type name and
  their price is host + accelerator row in the same zone. N1 hosts get synthetic types `n1-...+<N>x<GPU>` for the
  GPU counts and vCPU limits GCE allows for T4/V100/P100/P4, priced host + accelerator. TPUs are not VMs and are
  skipped, so `us-central2` (TPU-only in the source but for one n1-highmem-8 row) has that one type. Rows that
  repeat an earlier row exactly (154 in the source) are read once. A GPU machine whose accelerator row is missing
  in a zone gets an unknown price there.
- Both: two rows for the same (type, zone, capacity) with different prices stop the build (the source would be
  ambiguous); a type whose specs differ between regions stops it too.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ray_nodeless.core.catalog import (  # noqa: E402
    FORMAT_VERSION,
    INDEX_FILE,
    LAYOUT_INDEX,
    InstanceType,
    index_bytes,
    region_entry,
    region_file_bytes,
    region_file_name,
    type_row,
    write_atomic,
)
from ray_nodeless.core.cloud_facts import (  # noqa: E402  (one copy of each fact, shared with the live refreshers)
    AWS_BURSTABLE_FAMILIES,
    GCP_ARM_FAMILIES,
    GCP_BURSTABLE_TYPES,
    aws_family,
    gcp_family,
)
from ray_nodeless.core.gpus import (  # noqa: E402
    GCE_ACCELERATOR_FOR_MODEL,
    GPU_MEMORY_GIB,
    NON_GPU_ACCELERATORS,
    canonical_gpu,
    gpu_model_by_memory,
)

# (regex on the GCE machine type, GPU model, the accelerator row name in the CSV, GPU count or None = from name)
GCP_GPU_MACHINES = (
    (r"^a2-highgpu-(\d+)g$", "A100", "A100", None),
    (r"^a2-megagpu-16g$", "A100", "A100", 16),
    (r"^a2-ultragpu-(\d+)g$", "A100-80GB", "A100-80GB", None),
    (r"^a3-highgpu-(\d+)g$", "H100", "H100", None),
    (r"^a3-(megagpu|edgegpu)-8g(-nolssd)?$", "H100", "H100-MEGA", 8),
    (r"^a3-ultragpu-8g(-nolssd)?$", "H200", "H200", 8),
    (r"^a4-highgpu-8g$", "B200", "B200", 8),
    (r"^g2-standard-(\d+)$", "L4", "L4", "g2"),
)
G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}

# N1 + attachable GPU: GPU count -> max vCPUs of the host (GCE's documented limits).
N1_GPU_LIMITS = {
    "T4": {1: 48, 2: 48, 4: 96},
    "P4": {1: 24, 2: 48, 4: 96},
    "P100": {1: 16, 2: 32, 4: 96},
    "V100": {1: 12, 2: 24, 4: 48, 8: 96},
}


def _num(s: str) -> float | None:
    s = (s or "").strip()
    return float(s) if s else None


def _clean_number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 4)


class BuildError(Exception):
    """The source data is ambiguous; the build stops rather than guess."""


class Offerings:
    """The (type, zone, capacity) -> price rows of every region of one cloud; a repeated key must repeat its price."""

    def __init__(self, cloud: str):
        self.cloud = cloud
        self.rows: dict[str, dict[tuple[str, str, str], float | None]] = defaultdict(dict)

    def add(self, region: str, name: str, zone: str, capacity: str, price: float | None) -> None:
        key = (name, zone, capacity)
        rows = self.rows[region]
        if key in rows and rows[key] != price:
            raise BuildError(f"{self.cloud} {region}: {key} has two prices, {rows[key]} and {price}")
        rows[key] = price

    def entries(self, ordered: list[InstanceType]) -> dict[str, dict]:
        return {region: region_entry(ordered, [(*k, p) for k, p in sorted(self.rows[region].items())])
                for region in sorted(self.rows)}


def _unique_rows(path: Path) -> Iterator[dict]:
    """The CSV's rows, each row that repeats an earlier one exactly skipped."""
    seen: set[tuple] = set()
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            key = tuple(r.values())
            if key in seen:
                continue
            seen.add(key)
            yield r


def build_aws(source: Path) -> dict:
    types: dict[str, InstanceType] = {}
    specs_seen: dict[str, tuple] = {}
    rows = Offerings("aws")
    for r in _unique_rows(source / "aws_vms.csv"):
        region = r["Region"]
        if r["Arch"].endswith("_mac"):
            continue
        name = r["InstanceType"]
        specs = (r["AcceleratorName"], r["AcceleratorCount"], r["vCPUs"], r["MemoryGiB"], r["GpuInfo"], r["Arch"])
        if specs_seen.setdefault(name, specs) != specs:
            raise BuildError(f"aws type {name} has two sets of specs: {specs_seen[name]} and {specs}")
        if name not in types:
            acc = (r["AcceleratorName"] or "").strip()
            count = int(float(r["AcceleratorCount"] or 0))
            gpu_model, gpu_count, gpu_mem, accel, accel_count = "", 0, 0.0, "", 0
            if acc:
                canon = canonical_gpu(acc)
                if canon in NON_GPU_ACCELERATORS:
                    accel, accel_count = acc, count
                else:
                    info = json.loads(r["GpuInfo"]) if r["GpuInfo"] else {}
                    total_mib = info.get("TotalGpuMemoryInMiB", 0)
                    gpu_mem = round(total_mib / 1024, 2)
                    gpu_model = gpu_model_by_memory(canon, gpu_mem / count if count else 0)
                    gpu_count = count
            family = aws_family(name)
            types[name] = InstanceType(
                cloud="aws", name=name, family=family, vcpus=_clean_number(float(r["vCPUs"])),
                memory_gib=_clean_number(float(r["MemoryGiB"])), gpu_model=gpu_model, gpu_count=gpu_count,
                gpu_memory_gib=_clean_number(gpu_mem), arch=r["Arch"],
                burstable=family in AWS_BURSTABLE_FAMILIES, accelerator=accel, accelerator_count=accel_count,
                machine_type=name, attached_gpu="",
            )
        zone = r["AvailabilityZone"]
        rows.add(region, name, zone, "on-demand", _num(r["Price"]))
        if r["SpotSupported"].strip().lower() == "true":
            rows.add(region, name, zone, "spot", _num(r["SpotPrice"]))
    ordered = [types[n] for n in sorted(types)]
    return {"types": [type_row(t) for t in ordered], "regions": rows.entries(ordered)}


def _gcp_gpu_of(name: str) -> tuple[str, str, int] | None:
    """(GPU model, accelerator row name, count) for GCP machine types that carry GPUs."""
    for pattern, model, acc_row, count in GCP_GPU_MACHINES:
        m = re.match(pattern, name)
        if not m:
            continue
        if count == "g2":
            return model, acc_row, G2_GPUS[int(m.group(1))]
        if count is None:
            return model, acc_row, int(m.group(1))
        return model, acc_row, count
    return None


def build_gcp(source: Path) -> dict:
    hosts: dict[str, dict] = {}
    host_rows: list[dict] = []
    # (accelerator row name, count, zone) -> (on-demand, spot)
    acc_price: dict[tuple[str, int, str], tuple[float | None, float | None]] = {}
    for r in _unique_rows(source / "gcp_vms.csv"):
        if not r["InstanceType"]:
            if r["AcceleratorName"].startswith("tpu"):
                continue
            key = (r["AcceleratorName"], int(float(r["AcceleratorCount"])), r["AvailabilityZone"])
            price = (_num(r["Price"]), _num(r["SpotPrice"]))
            if acc_price.setdefault(key, price) != price:
                raise BuildError(f"gcp accelerator {key} has two prices: {acc_price[key]} and {price}")
            continue
        first = hosts.setdefault(r["InstanceType"], r)
        if (first["vCPUs"], first["MemoryGiB"]) != (r["vCPUs"], r["MemoryGiB"]):
            raise BuildError(f"gcp type {r['InstanceType']} has two sets of specs")
        host_rows.append(r)

    types: dict[str, InstanceType] = {}
    rows = Offerings("gcp")

    def add_rows(t: InstanceType, r: dict, acc: tuple[str, int] | None) -> None:
        zone = r["AvailabilityZone"]
        od, spot = _num(r["Price"]), _num(r["SpotPrice"])
        if acc is not None:
            a = acc_price.get((acc[0], acc[1], zone))
            if a is None:
                if t.attached_gpu:
                    return  # the accelerator is not offered in this zone: no N1+GPU offering here
                od = spot = None  # a2/g2 host listed but its GPU price is missing: unknown
            else:
                od = None if od is None or a[0] is None else od + a[0]
                spot = None if spot is None or a[1] is None else spot + a[1]
        rows.add(r["Region"], t.name, zone, "on-demand", od)
        rows.add(r["Region"], t.name, zone, "spot", spot)

    for name in sorted(hosts):
        r = hosts[name]
        family = gcp_family(name)
        gpu = _gcp_gpu_of(name)
        model, count = (gpu[0], gpu[2]) if gpu else ("", 0)
        types[name] = InstanceType(
            cloud="gcp", name=name, family=family, vcpus=_clean_number(float(r["vCPUs"])),
            memory_gib=_clean_number(float(r["MemoryGiB"])), gpu_model=model, gpu_count=count,
            gpu_memory_gib=GPU_MEMORY_GIB.get(model, 0) * count,
            arch="arm64" if family in GCP_ARM_FAMILIES else "x86_64",
            burstable=name in GCP_BURSTABLE_TYPES, machine_type=name,
        )
        if name.startswith("n1-") and re.match(r"^n1-(standard|highmem|highcpu)-\d+$", name):
            vcpus = float(r["vCPUs"])
            for model_name, limits in sorted(N1_GPU_LIMITS.items()):
                for n, max_vcpus in sorted(limits.items()):
                    if vcpus > max_vcpus:
                        continue
                    synth = f"{name}+{n}x{model_name}"
                    types[synth] = InstanceType(
                        cloud="gcp", name=synth, family="n1", vcpus=types[name].vcpus,
                        memory_gib=types[name].memory_gib, gpu_model=model_name, gpu_count=n,
                        gpu_memory_gib=GPU_MEMORY_GIB[model_name] * n, arch="x86_64", burstable=False,
                        machine_type=name, attached_gpu=GCE_ACCELERATOR_FOR_MODEL[model_name],
                    )
    for r in host_rows:
        name = r["InstanceType"]
        gpu = _gcp_gpu_of(name)
        add_rows(types[name], r, (gpu[1], gpu[2]) if gpu else None)
        if name.startswith("n1-"):
            for synth in sorted(t for t in types if t.startswith(name + "+")):
                t = types[synth]
                add_rows(t, r, (t.gpu_model, t.gpu_count))
    ordered = [types[n] for n in sorted(types)]
    return {"types": [type_row(t) for t in ordered], "regions": rows.entries(ordered)}


SOURCES = {
    "aws": "shared/catalog/aws_vms.csv (30 regions): moto 5.2.5 specs and AZ offerings; on-demand price = "
           "skypilot-catalog v8 spot-check rows (us-east-1, us-west-2, eu-west-1), else min(coroot 2024-08-09, "
           "libcloud 3.9.1); spot = coroot (one per region); empty = unknown",
    "gcp": "shared/catalog/gcp_vms.csv (44 regions): anycloud-sh/catalog gcp/vms.csv @62ff0a98 (SkyPilot v7 schema); "
           "GPU machines priced host + accelerator; TPUs skipped",
}


def build(source: Path, built: str) -> tuple[dict, dict[str, bytes]]:
    """(index document, region file name -> bytes) for every region of both sources."""
    clouds = {"aws": build_aws(source), "gcp": build_gcp(source)}
    files: dict[str, bytes] = {}
    index_clouds: dict[str, dict] = {}
    for cloud, c in sorted(clouds.items()):
        regions = {}
        for region, entry in sorted(c["regions"].items()):
            name = region_file_name(cloud, region)
            raw = region_file_bytes(cloud, region, entry)
            files[name] = raw
            regions[region] = {"file": name, "sha256": hashlib.sha256(raw).hexdigest(),
                               "offerings": len(entry["type"]), "zones": entry["zones"]}
        index_clouds[cloud] = {"types": c["types"], "regions": regions}
    index = {"format": FORMAT_VERSION, "layout": LAYOUT_INDEX, "name": "embedded-" + built, "built": built,
             "sources": SOURCES, "clouds": index_clouds}
    return index, files


def write(out: Path, index: dict, files: dict[str, bytes]) -> None:
    """Region files first, the index last (a reader of the old index never meets a missing file), then remove the
    region files the new index does not name."""
    out.mkdir(parents=True, exist_ok=True)
    for name, raw in sorted(files.items()):
        p = out / name
        if not p.exists() or p.read_bytes() != raw:
            write_atomic(p, raw, mode=0o644)
    write_atomic(out / INDEX_FILE, index_bytes(index), mode=0o644)
    for cloud in index["clouds"]:
        for stale in sorted(out.glob(region_file_name(cloud, "*"))):
            if stale.name not in files:
                stale.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "catalog")
    ap.add_argument("--out", type=Path, default=ROOT / "ray_nodeless" / "data" / "catalog",
                    help="directory of the index and the region files")
    ap.add_argument("--built", default="2026-11-30", help="date of the source data (recorded in the index)")
    args = ap.parse_args(argv)
    index, files = build(args.source, args.built)
    write(args.out, index, files)
    for cloud, c in sorted(index["clouds"].items()):
        n = sum(r["offerings"] for r in c["regions"].values())
        print(f"{cloud}: {len(c['types'])} instance types, {n} offerings in {len(c['regions'])} regions")
    size = sum(len(raw) for raw in files.values())
    print(f"wrote {args.out}: {INDEX_FILE} ({(args.out / INDEX_FILE).stat().st_size:,} bytes) and "
          f"{len(files)} region files ({size:,} bytes; largest {max(len(r) for r in files.values()):,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
