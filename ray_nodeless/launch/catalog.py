"""The catalog that prices a cluster's decisions, as `provider.catalog` names it: `embedded`, a catalog file, or
`live` (read from the cloud by the backend's `BackendConfig.live_catalog` hook, under the one refresh policy of
`core/catalog/refresh.py`: memory -> disk cache -> live -> stale disk cache -> embedded, `catalog_ttl_s`).

`PlanningCatalog` loads it on first use: a provider object that only lists, tags and terminates (`ray down`,
`sweep`, a restarted monitor before its first launch) never needs it.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Callable

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.catalog.refresh import (
    MEMORY, SOURCE_EMBEDDED, SOURCE_FILE, CatalogResult, MemoryCache, resolve_live,
)
from ray_nodeless.core.cluster_plan import load_catalog, planner_for
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.prices import priced
from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import ProviderSettings
from ray_nodeless.errors import CatalogError, ConfigError
from ray_nodeless.providers import backend_config


def catalog_for(settings: ProviderSettings) -> catalog_mod.Catalog:
    """The catalog file and region the settings name, as errors naming `provider.catalog` / `provider.region`.
    No cloud I/O: `live` is checked against the embedded catalog (what a failed refresh falls back to)."""
    try:
        catalog = load_catalog(settings.catalog)
    except CatalogError as e:
        raise ConfigError("provider.catalog", str(e)) from e
    _check_region(catalog, settings)
    return priced(catalog, settings.price_overrides)


def _check_region(catalog: catalog_mod.Catalog, settings: ProviderSettings) -> None:
    try:
        catalog.region(settings.price_cloud, settings.region)
    except CatalogError as e:
        raise ConfigError("provider.region", str(e)) from e


def catalog_result(settings: ProviderSettings, backend_settings: Section, *, cache_dir: str | Path | None = None,
                   clock: Callable[[], float] = time.time, force: bool = False,
                   memory: MemoryCache = MEMORY) -> CatalogResult:
    """The catalog that prices decisions and where it came from, from the loader's parsed parts (the core's
    `settings`, and the backend's section that its `live_catalog` hook reads: credentials, endpoint, project).
    `live` never fails for the cloud's sake (a live catalog is an optimisation); a file that cannot be read, or a
    region no catalog covers, is a ConfigError."""
    if settings.catalog != "live":
        catalog = catalog_for(settings)
        if settings.catalog == "embedded":
            return CatalogResult(catalog, SOURCE_EMBEDDED, None, "provider.catalog: embedded")
        return CatalogResult(catalog, SOURCE_FILE, None, f"provider.catalog: {settings.catalog}",
                             Path(settings.catalog))
    live = backend_config(settings.cloud).live_catalog(backend_settings, settings.region)
    result = resolve_live(live, ttl_s=settings.catalog_ttl_s, cache_dir=cache_dir, clock=clock, force=force,
                          memory=memory, no_live_reason=f"the {settings.cloud} backend has no live catalog")
    _check_region(result.catalog, settings)
    return dataclasses.replace(result, catalog=priced(result.catalog, settings.price_overrides))


class PlanningCatalog:
    """A provider object's catalog and planner, loaded once on first use (thread-safe).

    Listing, tagging and terminating never ask for them, so `ray down` and `sweep` end a cluster's machines when the
    file `provider.catalog` names is gone (moved, or only on the laptop that ran `ray up`), and tearing down a
    `catalog: live` cluster reads no price list. A load that fails raises (ConfigError naming the key) and is tried
    again on the next use.
    """

    def __init__(self, load: Callable[[], CatalogResult]):
        self._load = load
        self._result: CatalogResult | None = None
        self._planner: Planner | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._result is not None

    @property
    def result(self) -> CatalogResult:
        if self._result is None:
            with self._lock:
                if self._result is None:
                    result = self._load()
                    self._planner = planner_for(result.catalog)
                    self._result = result
        return self._result

    @property
    def catalog(self) -> catalog_mod.Catalog:
        return self.result.catalog

    @property
    def planner(self) -> Planner:
        self.result   # noqa: B018 - loads both
        assert self._planner is not None
        return self._planner
