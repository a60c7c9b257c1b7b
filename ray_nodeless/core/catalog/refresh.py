"""The live-catalog refresh policy, written once for every cloud: memory -> disk -> live -> stale disk -> embedded.

`provider.catalog: live` (and `ray-nodeless catalog refresh`) ask a backend's config half for a `LiveCatalog`
(`BackendConfig.live_catalog`: how to read one region's catalog from the cloud's APIs; AWS in
`providers/aws/catalog.py`, GCP in `providers/gcp/catalog.py`) and hand it to `resolve_live`, which decides where
the catalog comes from and returns one `CatalogResult`:

1. **memory**: a catalog this process already has for the same cache file, younger than `ttl_s`;
2. **disk**: the cache file (`<cache dir>/<cloud>-<region>[-<endpoint hash>].json.gz`), younger than `ttl_s` (by
   its mtime): used without calling the cloud. A refresh reads every type, offering and price of a region in many
   paginated calls, so it is done once per `catalog_ttl_s` (default a day), not on every cluster start;
3. **live**: otherwise the cloud is read; the new catalog is written to the cache file and kept in memory;
4. **stale-disk**: the read failed (or came back degraded and worse than the copy on disk, by `quality`): the
   cache file of any age, with a warning;
5. **embedded**: no usable cache file either (or the backend has no live catalog): the catalog shipped in the
   package, with a warning. A live catalog is an optimisation, never a reason to fail the cluster.

`ttl_s == 0` (or `force`) always tries the cloud first. The clock is injected (`clock`, epoch seconds), so tests
age the cache without sleeping; the cache file's mtime is set to the clock's time when it is written. Pure: no
cloud SDK (the backend's `fetch` does the I/O), no Ray.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ray_nodeless.core.catalog.encoding import dump_bytes, sha256_hex
from ray_nodeless.core.catalog.model import CAPACITY_TYPES
from ray_nodeless.core.catalog.store import Catalog, embedded, load_file
from ray_nodeless.core.files import write_atomic
from ray_nodeless.errors import CatalogError
from ray_nodeless.core.documents import Document

logger = logging.getLogger(__name__)

SOURCE_MEMORY = "memory"
SOURCE_DISK = "disk"
SOURCE_LIVE = "live"
SOURCE_STALE = "stale-disk"
SOURCE_EMBEDDED = "embedded"
SOURCE_FILE = "file"                # `provider.catalog: <path>`: not refreshed, never cached
SOURCES = (SOURCE_MEMORY, SOURCE_DISK, SOURCE_LIVE, SOURCE_STALE, SOURCE_EMBEDDED, SOURCE_FILE)

# `catalog_ttl_s`'s default (core/settings.py): machine types change a few times a year, prices more often but
# not by the hour, and a refresh costs hundreds of paginated calls.
DEFAULT_TTL_S = 86400.0
# Where live catalogs are cached: $RAY_NODELESS_CATALOG_CACHE, else $XDG_CACHE_HOME/ray-nodeless/catalog, else
# ~/.cache/ray-nodeless/catalog (next to the Kubernetes binaries' ~/.cache/ray-nodeless/k8s-go).
CACHE_DIR_ENV = "RAY_NODELESS_CATALOG_CACHE"
MEMORY_ENTRIES = 64                 # one per (cloud, region, endpoint, cache dir) a process uses


def default_cache_dir() -> Path:
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "ray-nodeless" / "catalog"


@dataclass(frozen=True)
class LiveFetch:
    """What one read of the cloud produced: a single-file catalog document covering `LiveCatalog.region`, and what
    was degraded on the way (e.g. "on-demand prices from the embedded catalog")."""

    doc: Document
    warnings: tuple[str, ...] = ()


def _no_quality(doc: Document) -> int:
    return 0


@dataclass(frozen=True)
class LiveCatalog:
    """How to read one region's catalog from a cloud (what `BackendConfig.live_catalog` returns)."""

    cloud: str                          # the catalog cloud ("aws", "gcp")
    region: str
    cache_name: str                     # cache file stem: unique per cloud, region and endpoint (a fake's catalog
                                        # must never be mistaken for the real one)
    fetch: Callable[[], LiveFetch]      # the cloud I/O; raises on failure
    # How good a document's data is (e.g. how many price sources came from the cloud itself): a degraded fetch
    # does not replace a better copy on disk.
    quality: Callable[[Document], int] = _no_quality
    describe: str = ""                  # for messages, e.g. "EC2 + Pricing APIs at http://127.0.0.1:5000"


@dataclass(frozen=True)
class CatalogResult:
    """The catalog that prices decisions, and where it came from (one of SOURCES)."""

    catalog: Catalog
    source: str
    age_s: float | None                 # how old its data is (0 just read; None: the embedded catalog or a file)
    reason: str                         # one line: why this source
    path: Path | None = None            # the cache file (live catalogs), or the catalog file
    warnings: tuple[str, ...] = ()      # what failed or was degraded

    @property
    def is_live_data(self) -> bool:
        """Data read from the cloud (now or earlier), as opposed to the embedded catalog or a file."""
        return self.source in (SOURCE_MEMORY, SOURCE_DISK, SOURCE_LIVE, SOURCE_STALE)


class MemoryCache:
    """Catalogs this process has read, by cache file, with the clock time their data was read. Thread-safe."""

    def __init__(self, entries: int = MEMORY_ENTRIES):
        self._entries = entries
        self._data: OrderedDict[str, tuple[Catalog, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[Catalog, float] | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
            return hit

    def put(self, key: str, catalog: Catalog, read_at: float) -> None:
        with self._lock:
            self._data[key] = (catalog, read_at)
            self._data.move_to_end(key)
            while len(self._data) > self._entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


MEMORY = MemoryCache()
# One refresh at a time per cache file in this process: parallel provider objects (Ray v2's launcher threads) must
# not all read the cloud at once for the same region.
_refresh_locks: dict[str, threading.Lock] = {}
_refresh_locks_guard = threading.Lock()


def _lock_for(key: str) -> threading.Lock:
    with _refresh_locks_guard:
        return _refresh_locks.setdefault(key, threading.Lock())


def cache_path(live: LiveCatalog, cache_dir: str | Path | None = None) -> Path:
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return base / f"{live.cache_name}.json.gz"


def _read_disk(path: Path) -> tuple[Catalog, float] | None:
    """(catalog, mtime) of a cache file, or None if it is missing or unreadable (a corrupt cache is as none)."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    try:
        return load_file(path), mtime
    except CatalogError as e:
        logger.warning("ignoring unreadable catalog cache %s: %s", path, e)
        return None


def _fmt_age(age_s: float) -> str:
    return f"{age_s:.0f} s"


def resolve_live(live: LiveCatalog | None, *, ttl_s: float = DEFAULT_TTL_S, cache_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time, fallback: Callable[[], Catalog] = embedded,
                 force: bool = False, memory: MemoryCache = MEMORY, no_live_reason: str = "") -> CatalogResult:
    """The catalog for `live.region` by the policy of the module docstring. Never raises for a cloud or cache
    failure (only if `fallback()` itself fails). `live=None`: the backend has no live catalog (`no_live_reason`
    says why): the fallback, with a warning."""
    if live is None:
        cat = fallback()
        why = f"{no_live_reason or 'this backend has no live catalog'}; using {cat.catalog_id}"
        logger.warning("catalog: live: %s", why)
        return CatalogResult(cat, SOURCE_EMBEDDED, None, why, warnings=(why,))
    path = cache_path(live, cache_dir)
    key = str(path)
    fresh_first = not force and ttl_s > 0
    if fresh_first:
        hit = _fresh(live, path, key, ttl_s, clock, memory)
        if hit is not None:
            return hit
    with _lock_for(key):
        if fresh_first:    # another thread may have refreshed while this one waited
            hit = _fresh(live, path, key, ttl_s, clock, memory)
            if hit is not None:
                return hit
        return _refresh(live, path, key, ttl_s, clock, fallback, memory)


def _fresh(live: LiveCatalog, path: Path, key: str, ttl_s: float, clock: Callable[[], float],
           memory: MemoryCache) -> CatalogResult | None:
    now = clock()
    hit = memory.get(key)
    if hit is not None and now - hit[1] < ttl_s:
        age = now - hit[1]
        return CatalogResult(hit[0], SOURCE_MEMORY, age,
                             f"read {_fmt_age(age)} ago, younger than catalog_ttl_s {ttl_s:g} s", path)
    disk = _read_disk(path)
    if disk is not None and now - disk[1] < ttl_s:
        age = now - disk[1]
        memory.put(key, disk[0], disk[1])
        return CatalogResult(disk[0], SOURCE_DISK, age,
                             f"cache file {_fmt_age(age)} old, younger than catalog_ttl_s {ttl_s:g} s", path)
    return None


def _refresh(live: LiveCatalog, path: Path, key: str, ttl_s: float, clock: Callable[[], float],
             fallback: Callable[[], Catalog], memory: MemoryCache) -> CatalogResult:
    what = f"{live.cloud} catalog refresh for {live.region}"
    try:
        fetched = live.fetch()
        raw = dump_bytes(fetched.doc)
        catalog = Catalog(fetched.doc, sha256_hex(raw), f"live:{live.cloud}:{live.region}")
        catalog.region(live.cloud, live.region)   # proves the document loads and covers the region
    except Exception as e:  # noqa: BLE001 - every failure of the cloud read has the same remedy
        err = f"{what} failed: {type(e).__name__}: {e}"[:500]
        return _stale_or_fallback(err, path, key, clock, fallback, memory)

    warnings = tuple(fetched.warnings)
    if warnings:
        previous = _read_disk(path)
        if previous is not None and live.quality(previous[0].doc) > live.quality(fetched.doc):
            age = clock() - previous[1]
            why = (f"{what} degraded ({'; '.join(warnings)}); keeping the better cache file {path} "
                   f"({_fmt_age(age)} old)")
            logger.warning("%s", why)
            memory.put(key, previous[0], previous[1])
            return CatalogResult(previous[0], SOURCE_STALE, age, why, path, warnings)
        logger.warning("%s: %s", what, "; ".join(warnings))
    now = clock()
    try:
        write_atomic(path, raw)
        os.utime(path, (now, now))     # ages follow the policy's clock, not the file system's
    except OSError as e:
        logger.warning("cannot write the catalog cache %s: %s", path, e)
    memory.put(key, catalog, now)
    logger.info("%s: %s (%s)", what, catalog.catalog_id, live.describe or "live")
    return CatalogResult(catalog, SOURCE_LIVE, 0.0, f"read now from {live.describe or 'the cloud'}", path, warnings)


def _stale_or_fallback(err: str, path: Path, key: str, clock: Callable[[], float],
                       fallback: Callable[[], Catalog], memory: MemoryCache) -> CatalogResult:
    stale = _read_disk(path)
    if stale is not None:
        age = clock() - stale[1]
        why = f"{err}; using the last good cache file {path} ({_fmt_age(age)} old)"
        logger.warning("%s", why)
        memory.put(key, stale[0], stale[1])
        return CatalogResult(stale[0], SOURCE_STALE, age, why, path, (err,))
    cat = fallback()
    why = f"{err}; no cache file at {path}; using {cat.catalog_id}"
    logger.warning("%s", why)
    return CatalogResult(cat, SOURCE_EMBEDDED, None, why, path, (err,))


def summarize(result: CatalogResult, cloud: str, region: str) -> Document:
    """What `ray-nodeless catalog refresh` prints: provenance and the region's counts."""
    out: Document = {
        "cloud": cloud, "region": region, "source": result.source, "catalog_id": result.catalog.catalog_id,
        "age_s": None if result.age_s is None else round(result.age_s, 1), "reason": result.reason,
        "warnings": list(result.warnings), "cache_path": None if result.path is None else str(result.path),
    }
    doc = result.catalog.index
    if doc.get("price_source") is not None:
        out["price_source"] = doc["price_source"]
    try:
        rc = result.catalog.region(cloud, region)
    except CatalogError:
        return out
    offerings = list(rc.offerings())
    priced = sum(o.hourly_price is not None for o in offerings)
    by_capacity = {c: sum(o.capacity == c for o in offerings) for c in CAPACITY_TYPES}
    out.update(types=len({o.instance_type.name for o in offerings}), offerings=len(offerings), priced=priced,
               unknown_price=len(offerings) - priced, zones=list(rc.zones),
               **{f"{c.replace('-', '_')}_offerings": n for c, n in sorted(by_capacity.items())})
    return out
