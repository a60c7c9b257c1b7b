"""The instance catalog: what machines exist, where, and what they cost. Data, not code.

The embedded catalog (`ray_nodeless/data/catalog/`, built by `scripts/build_catalog.py`) is an index
(`index.json`: per cloud, the table of instance types and, per region, the name and sha256 of its file) plus one
gzip file per (cloud, region) with one row per (instance type, zone, capacity type) and its price. The index is read
on first use; a region's file the first time that region is used (`encoding.py` defines every byte of the files,
`store.py` the loading, `model.py` what is loaded; `refresh.py` is the one policy for live catalogs: memory ->
disk cache -> live -> stale disk cache -> embedded, `catalog_ttl_s`, the clouds' reads being backend hooks).
Every decision names the catalog by `catalog_id`, which ends in the first 12 hex digits of the catalog file's
sha256 (of the index, for the embedded catalog), so a decision can be replayed against exactly the data it used.

Price conventions: a number is USD/hour; `null` means the price is unknown (never chosen). A capacity type that is
not offered for a type in a zone has no row at all.
"""
from __future__ import annotations

from ray_nodeless.core.catalog.encoding import (
    FORMAT_VERSION,
    INDEX_FILE,
    LAYOUT_INDEX,
    dump_bytes,
    index_bytes,
    region_entry,
    region_file_bytes,
    region_file_name,
    type_row,
)
from ray_nodeless.core.catalog.model import (
    CAPACITY_TYPES,
    TYPE_COLUMNS,
    InstanceType,
    Offering,
    RegionCatalog,
)
from ray_nodeless.core.catalog.store import Catalog, embedded, load_file, load_index
from ray_nodeless.core.files import write_atomic
from ray_nodeless.errors import CatalogError

__all__ = [
    "CAPACITY_TYPES", "FORMAT_VERSION", "INDEX_FILE", "LAYOUT_INDEX", "TYPE_COLUMNS",
    "Catalog", "CatalogError", "InstanceType", "Offering", "RegionCatalog",
    "dump_bytes", "embedded", "index_bytes", "load_file", "load_index", "region_entry", "region_file_bytes",
    "region_file_name", "type_row", "write_atomic",
]
