"""Loading catalogs: the embedded one (index + one file per region, each read on first use) and catalog files.

Lazy three times over: the embedded index is read on the first `embedded()` call; a region's file is read (and
checked against the sha256 the index names) the first time that region is asked for; the planner's per-region
arrays are built from it then. A cold `ray-nodeless plan` for one region reads the index and one region file.
"""
from __future__ import annotations

import difflib
import logging
import os
import threading
from importlib import resources
from pathlib import Path
from typing import Callable

from ray_nodeless.core.catalog.encoding import (
    ENTRY_KEYS,
    FORMAT_VERSION,
    INDEX_FILE,
    LAYOUT_INDEX,
    decode,
    sha256_hex,
)
from ray_nodeless.core.catalog.model import TYPE_COLUMNS, InstanceType, RegionCatalog
from ray_nodeless.errors import CatalogError
from ray_nodeless.core.documents import Document

logger = logging.getLogger(__name__)

# Where the embedded catalog lives inside the package.
EMBEDDED_DIR = "data/catalog"
# How many region names an unknown-region error suggests.
NEAREST_REGIONS = 5

RegionReader = Callable[[str], bytes]


class Catalog:
    """A loaded catalog: a single-file document, or an index whose regions are read by `read_region(file name)`.

    Thread-safe. Types are decoded on first use per cloud, regions on first use per (cloud, region), and kept.
    `catalog_id` is `<name>@<first 12 hex digits of sha256>`, where `sha256` is that of the catalog file (for an
    index layout, of the index, which names every region file's sha256).
    """

    def __init__(self, doc: Document, sha256: str, source: str, *, read_region: RegionReader | None = None):
        if doc.get("format") != FORMAT_VERSION:
            raise CatalogError(f"{source}: catalog format {doc.get('format')!r} is not {FORMAT_VERSION}")
        self.layout: str = doc.get("layout", "single")
        if self.layout not in ("single", LAYOUT_INDEX):
            raise CatalogError(f"{source}: catalog layout {self.layout!r} is not 'single' or {LAYOUT_INDEX!r}")
        if self.layout == LAYOUT_INDEX and read_region is None:
            raise CatalogError(f"{source}: an index catalog needs its region files (load it with load_file)")
        if not isinstance(doc.get("clouds"), dict):
            raise CatalogError(f"{source}: not a catalog file (no 'clouds' mapping)")
        self._doc = doc
        self._read_region = read_region
        self.sha256 = sha256
        self.name: str = doc.get("name", "catalog")
        self.built: str = doc.get("built", "")
        self.source = source
        self.catalog_id = f"{self.name}@{sha256[:12]}"
        self._types: dict[str, tuple[InstanceType, ...]] = {}
        self._by_name: dict[str, dict[str, InstanceType]] = {}
        self._regions: dict[tuple[str, str], RegionCatalog] = {}
        self._full_doc: Document | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------------- coverage

    @property
    def clouds(self) -> list[str]:
        return sorted(self._doc["clouds"])

    def regions(self, cloud: str) -> list[str]:
        return sorted(self._cloud_doc(cloud)["regions"])

    def _cloud_doc(self, cloud: str) -> Document:
        try:
            doc: Document = self._doc["clouds"][cloud]
            return doc
        except KeyError:
            raise CatalogError(f"catalog {self.catalog_id} has no cloud {cloud!r}; it has {self.clouds}") from None

    def _unknown_region(self, cloud: str, region: str) -> CatalogError:
        known = self.regions(cloud)
        nearest = nearest_names(str(region), known, NEAREST_REGIONS)
        count = f"{len(known)} {cloud} region" + ("" if len(known) == 1 else "s")
        hint = "; `ray-nodeless catalog info` lists them" if self.source == "embedded" else ""
        return CatalogError(f"catalog {self.catalog_id} has no {cloud} region {region!r}; nearest: "
                            f"{', '.join(nearest) or 'none'} (of its {count}{hint})")

    # ------------------------------------------------------------------------------------------- types

    def types(self, cloud: str) -> tuple[InstanceType, ...]:
        hit = self._types.get(cloud)
        if hit is not None:
            return hit
        with self._lock:
            if cloud not in self._types:
                rows = self._cloud_doc(cloud)["types"]
                try:
                    self._types[cloud] = tuple(
                        InstanceType(cloud, *row) if len(row) == len(TYPE_COLUMNS)
                        else InstanceType(cloud=cloud, **dict(zip(TYPE_COLUMNS, row))) for row in rows)
                except TypeError as e:
                    raise CatalogError(f"{self.source}: bad {cloud} instance type row ({e})") from e
            return self._types[cloud]

    def instance_type(self, cloud: str, name: str) -> InstanceType | None:
        by_name = self._by_name.get(cloud)
        if by_name is None:
            by_name = {t.name: t for t in self.types(cloud)}
            with self._lock:
                by_name = self._by_name.setdefault(cloud, by_name)
        return by_name.get(name)

    # ------------------------------------------------------------------------------------------- regions

    def region(self, cloud: str, region: str) -> RegionCatalog:
        key = (cloud, region)
        hit = self._regions.get(key)
        if hit is not None:
            return hit
        regions = self._cloud_doc(cloud)["regions"]
        if region not in regions:
            raise self._unknown_region(cloud, region)
        with self._lock:   # one reader per catalog: a region file is read and decoded once, even under races
            hit = self._regions.get(key)
            if hit is None:
                entry = self._region_entry(cloud, region)
                try:
                    hit = RegionCatalog(cloud, region, self.types(cloud), entry)
                except (KeyError, TypeError, ValueError) as e:
                    raise CatalogError(f"{self.source}: bad {cloud} region {region} ({e})") from e
                self._regions[key] = hit
                logger.debug("catalog %s: loaded %s %s (%d offerings)", self.catalog_id, cloud, region, len(hit))
            return hit

    def loaded_regions(self) -> list[tuple[str, str]]:
        """The (cloud, region) pairs decoded so far, in load order."""
        return list(self._regions)

    def _region_entry(self, cloud: str, region: str) -> Document:
        entry: Document = self._cloud_doc(cloud)["regions"][region]
        if self.layout != LAYOUT_INDEX:
            return entry
        name, want = entry.get("file"), entry.get("sha256")
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise CatalogError(f"{self.source}: bad region file name {name!r} for {cloud} {region}")
        try:
            raw = self._read_region(name)   # type: ignore[misc]
        except OSError as e:
            raise CatalogError(f"catalog {self.catalog_id}: cannot read the {cloud} {region} file {name}: {e}") from e
        got = sha256_hex(raw)
        if got != want:
            raise CatalogError(f"catalog {self.catalog_id}: {cloud} {region} file {name} has sha256 {got[:12]}..., "
                               f"the index names {str(want)[:12]}... (a partial or mixed install?)")
        try:
            doc = decode(raw, name)
        except ValueError as e:
            raise CatalogError(str(e)) from e
        if (doc.get("format"), doc.get("cloud"), doc.get("region")) != (FORMAT_VERSION, cloud, region):
            raise CatalogError(f"{self.source}: {name} holds format {doc.get('format')!r} {doc.get('cloud')} "
                               f"{doc.get('region')}, not format {FORMAT_VERSION} {cloud} {region}")
        return doc

    # ------------------------------------------------------------------------------------------- documents

    @property
    def index(self) -> Document:
        """The document as loaded: for the index layout the index (regions are file descriptors)."""
        return self._doc

    @property
    def doc(self) -> Document:
        """The whole catalog as one single-file document (what `dump_bytes` writes and `load_file` reads back).

        For an index catalog this reads every region file (once): use it to export, not on a hot path.
        """
        if self.layout != LAYOUT_INDEX:
            return self._doc
        with self._lock:
            if self._full_doc is None:
                clouds = {}
                for cloud in self.clouds:
                    c = self._doc["clouds"][cloud]
                    regions = {}
                    for region in sorted(c["regions"]):
                        e = self._region_entry(cloud, region)
                        regions[region] = {k: e[k] for k in ENTRY_KEYS}
                    clouds[cloud] = {"types": c["types"], "regions": regions}
                doc = {k: v for k, v in self._doc.items() if k not in ("layout", "clouds")}
                doc["clouds"] = clouds
                self._full_doc = doc
            return self._full_doc


def nearest_names(word: str, names: list[str], n: int) -> list[str]:
    """The `n` names most like `word`: difflib's ratio (as `get_close_matches`), ties broken by the longer common
    prefix (the geography is usually right: us-west-3 -> us-west-1 before eu-west-3), then by name."""
    matcher = difflib.SequenceMatcher(b=word)
    scored = []
    for name in names:
        matcher.set_seq1(name)
        prefix = len(os.path.commonprefix([word, name]))
        scored.append((-matcher.ratio(), -prefix, name))
    return [name for _, _, name in sorted(scored)[:n]]


def _from_bytes(raw: bytes, source: str, read_region: RegionReader | None) -> Catalog:
    try:
        doc = decode(raw, source)
    except ValueError as e:
        raise CatalogError(str(e)) from e
    return Catalog(doc, sha256_hex(raw), source, read_region=read_region)


def load_index(raw: bytes, read_region: RegionReader, source: str) -> Catalog:
    """A catalog from the bytes of its index (or of a single file) and a reader of its region files by name."""
    return _from_bytes(raw, source, read_region)


def load_file(path: str | Path) -> Catalog:
    """A catalog file: a single-file catalog (what the live refreshers write), or an index, whose region files are
    read from the index's directory on first use."""
    p = Path(path)
    if p.is_dir():
        p = p / INDEX_FILE
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CatalogError(f"cannot read catalog {p}: {e}") from e
    base = p.parent
    return _from_bytes(raw, str(p), lambda name: (base / name).read_bytes())


_embedded: Catalog | None = None
_embedded_lock = threading.Lock()


def embedded() -> Catalog:
    """The catalog shipped inside the package: its index is read once per process on first use, each region's file
    the first time that region is used."""
    global _embedded
    if _embedded is not None:
        return _embedded
    with _embedded_lock:
        if _embedded is None:
            base = resources.files("ray_nodeless").joinpath(EMBEDDED_DIR)
            try:
                raw = base.joinpath(INDEX_FILE).read_bytes()
            except OSError as e:
                raise CatalogError(f"the embedded catalog is missing ({e}); reinstall ray-nodeless") from e
            _embedded = load_index(raw, lambda name: base.joinpath(name).read_bytes(), "embedded")
            logger.debug("loaded embedded catalog index %s", _embedded.catalog_id)
        return _embedded
