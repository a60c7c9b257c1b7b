"""How a catalog is written down: the one definition of every catalog file's bytes.

Format 1 has two layouts that share the type rows (`type_row`) and the region entries (`region_entry`):

* **single file** (the live AWS/GCP refreshers, `catalog refresh --out`, any hand-made catalog): one gzip JSON
  document `{"format": 1, "name", "built", "clouds": {cloud: {"types": [row, ...], "regions": {region: entry}}}}`.
* **index + region files** (the embedded catalog): a plain JSON index that holds everything except the regions'
  rows, `{"format": 1, "layout": "index", ..., "clouds": {cloud: {"types": [...], "regions": {region:
  {"file", "sha256", "offerings", "zones"}}}}}`, and one gzip JSON file per (cloud, region),
  `{"format": 1, "cloud", "region", <entry>}`, read only when that region is first used. The index names each
  region file's sha256, so the index's own sha256 identifies all of the data.

Every writer here is deterministic: sorted keys, fixed separators, gzip with mtime 0.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from typing import Sequence

from ray_nodeless.core.catalog.model import CAPACITY_TYPES, TYPE_COLUMNS, InstanceType
from ray_nodeless.core.documents import Document, DocumentView

FORMAT_VERSION = 1
LAYOUT_INDEX = "index"
INDEX_FILE = "index.json"
ENTRY_KEYS = ("zones", "type", "zone", "capacity", "price")


def region_entry(types: Sequence[InstanceType],
                 rows: Sequence[tuple[str, str, str, float | None]]) -> Document:
    """Encode (instance type name, zone, capacity, price|None) rows as a region entry of a catalog file.

    The one place the base order is defined: unknown prices last, then price, instance type name, zone, capacity.
    Both the embedded catalog builder and the live catalog refreshers write regions through this function.
    """
    index = {t.name: i for i, t in enumerate(types)}
    zones = sorted({z for _, z, _, _ in rows})
    zone_index = {z: i for i, z in enumerate(zones)}
    cap_index = {c: i for i, c in enumerate(CAPACITY_TYPES)}
    # Round before sorting: host + accelerator sums differ in the 15th digit, and the order must follow the
    # prices as stored, or two offerings at the same stored price would be ranked by noise instead of by name.
    rows = [(t, z, c, None if p is None else round(float(p), 6)) for t, z, c, p in rows]
    ordered = sorted(
        rows, key=lambda r: (r[3] is None, r[3] if r[3] is not None else 0.0, r[0], r[1], cap_index[r[2]]))
    return {
        "zones": zones,
        "type": [index[r[0]] for r in ordered],
        "zone": [zone_index[r[1]] for r in ordered],
        "capacity": [cap_index[r[2]] for r in ordered],
        "price": [r[3] for r in ordered],
    }


def type_row(t: InstanceType) -> list[object]:
    return [getattr(t, c) for c in TYPE_COLUMNS]


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def dump_bytes(doc: Document) -> bytes:
    """A catalog document as the bytes of a single catalog file (gzip, mtime 0: same data, same sha256)."""
    return gzip.compress(_compact(doc).encode(), compresslevel=9, mtime=0)


def region_file_bytes(cloud: str, region: str, entry: DocumentView) -> bytes:
    """The bytes of one region file of an index-layout catalog (gzip, mtime 0)."""
    doc = {"format": FORMAT_VERSION, "cloud": cloud, "region": region, **{k: entry[k] for k in ENTRY_KEYS}}
    return dump_bytes(doc)


def region_file_name(cloud: str, region: str) -> str:
    return f"{cloud}-{region}.json.gz"


def sha256_hex(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def index_bytes(doc: Document) -> bytes:
    """The bytes of an index: JSON, sorted keys, one instance type or region per line (so that a rebuild reads as
    a readable diff: which types changed, which region files changed)."""
    return (_pretty(doc, 0) + "\n").encode()


def _pretty(obj: object, depth: int) -> str:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if depth >= 4:   # a region's descriptor: one line
            return _compact(obj)
        items = [f"{inner}{json.dumps(k)}: {_pretty(obj[k], depth + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and all(isinstance(x, (list, dict)) for x in obj):
        return "[\n" + ",\n".join(inner + _compact(x) for x in obj) + "\n" + pad + "]"
    return _compact(obj)


def decode(raw: bytes, source: str) -> Document:
    """A catalog document (any layout) or region file from its bytes, gzip or not. Raises ValueError."""
    try:
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{source}: not a catalog file ({e})") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: not a catalog file (a JSON {type(doc).__name__}, not an object)")
    return doc
