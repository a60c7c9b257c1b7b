"""The `provider:` block and the node types of a cluster YAML, turned into planner requests.

    provider:
      type: external
      module: ray_nodeless.NodelessProvider
      cloud: aws                 # local | aws | gcp
      region: us-west-2
      simulate_cloud: aws        # cloud: local only: whose catalog prices the local "instances"
      catalog: embedded          # embedded | live | a path to a catalog file
      catalog_ttl_s: 86400       # catalog: live: how long a read of the cloud is reused (memory, disk cache)
      unavailable_ttl_s: 180     # how long an offering that failed for capacity is skipped (its first error)
      unavailable_backoff_cap_s: 600   # each error in a row doubles that, up to this (core/availability.py)
      unavailable_probes: 1      # launch calls at once that try an offering whose backoff ended (0: no limit)
      registration: vm           # vm | local-player (| kubernetes)
      allow_previous_generation: false   # previous-generation families (m1, m3, c3, f1, ...) left out by default
      interruption_watcher: true # spot workers that boot themselves drain their Ray node on a notice
      interruption_queue_url: https://sqs.us-west-2.amazonaws.com/123456789012/spot   # aws: EventBridge warnings
      exclude: {...}             # see requirements.py
      rules: [...]               # see rules.py
      price_overrides: [...]     # discounts / fixed prices, first match wins: see prices.py
      open: {...}                # shape-open provisioning: see setting_groups.py (also the flat open_shapes, ...)
      metrics: {...}             # Prometheus port, decision log, `ray status` block: see setting_groups.py
      idle: {...}                # cost-aware idle release: see setting_groups.py
      reversion: {...}           # on-demand -> spot reversion: see reversion.py
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ray_nodeless.core import ttls
from ray_nodeless.core.catalog.refresh import DEFAULT_TTL_S as CATALOG_TTL_S
from ray_nodeless.core.prices import PriceBook, parse_price_overrides
from ray_nodeless.core.requirements import (
    OPEN_SHAPE_KEY,
    Request, Requirements, Shape, only_amounts, parse_exclude, parse_requirements, split_node_config,
)
from ray_nodeless.core.documents import Document
from ray_nodeless.core.reversion import ReversionSettings
from ray_nodeless.core.rules import DEFAULT_RULE, Rule, RuleSet, parse_rules
from ray_nodeless.core.schema import Section, declared_keys, missing_keys, parse_section, suggest_key, unknown_key
from ray_nodeless.core.setting_groups import (
    FLAT_KEYS, IdleSettings, MetricsSettings, OpenSettings, ReservationSettings, fold_groups,
)
from ray_nodeless.errors import ConfigError, ConfigErrors

logger = logging.getLogger(__name__)

# The catalog cloud that prices a backend that is not a cloud (local, a test backend) when the block sets no
# `simulate_cloud`. Which backends are clouds, and which catalog clouds exist, is the backend registry's to say
# (`BackendConfig.catalog_cloud`, `providers.price_clouds()`): the operate layer's loader tells `parse_provider`.
DEFAULT_PRICE_CLOUD = "aws"

# Keys Ray itself reads from (or writes into) the provider block: Ray's own ray-schema.json provider properties
# plus the keys its autoscaler reads without declaring them.
RAY_PROVIDER_KEYS = frozenset({
    "type", "module", "use_internal_ips", "disable_node_updaters", "cache_stopped_nodes", "security_group",
    "disable_launch_config_check", "foreground_node_launch", "worker_liveness_check", "use_node_id_as_ip",
    "head_ip", "worker_ips", "availability_zone", "autoscaler_role", "autoscaler_role_binding",
    "autoscaler_service_account", "cloudwatch", "gcp_credentials", "location", "msi_identity_id",
    "msi_identity_principal_id", "namespace", "resource_group", "subnet_id", "subscription_id", "tags", "key_pair",
})


DEFAULT_GCS_PORT = 6379      # Ray's default head port: `ray start --head` listens on it without --port
MAX_PORT = 65535


class HeadAddress(Section):
    """Where the cluster's head is: `head_ip` and `gcs_address`, declared once. Every section that needs them
    derives from this (the local backend and the local players, `registration: vm`, `registration: kubernetes`), so
    a block is read the same way by each: one check, one meaning. What each does without them is its own (the
    reader's default): the head's GCS at `<head_ip>:6379` (DEFAULT_GCS_PORT), the head's address this process's."""

    # The head's address (what Ray nodes and boot scripts reach it at). Also one of Ray's own provider keys.
    head_ip: str | None = Field(None, min_length=1)
    # host:port of the head's GCS (must match the head's `ray start --port`).
    gcs_address: str | None = None

    @field_validator("gcs_address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host.strip() or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
            raise PydanticCustomError("host_port", f'must be "host:port" with a port in 1-{MAX_PORT}')
        return value

    def gcs_port(self) -> int:
        """The head's GCS port: `gcs_address`'s, else DEFAULT_GCS_PORT."""
        return int(self.gcs_address.rsplit(":", 1)[1]) if self.gcs_address else DEFAULT_GCS_PORT

    def gcs_address_at(self, head_ip: str) -> str:
        """`gcs_address`, else the head's default port at `head_ip`."""
        return self.gcs_address or f"{head_ip}:{DEFAULT_GCS_PORT}"


class CoreSettings(Section):
    """The provider-block keys of the core (every backend and registration declares its own), parsed: `rules` and
    `exclude` are the planner's `RuleSet`, `price_cloud` the catalog cloud that prices decisions. The one model of
    the core's settings: `parse_provider` builds it, and the operate layer's loader (`operate.config.load_provider`)
    hands this instance to everything below."""

    cloud: str = "local"                     # the machine backend (a name of the backend registry)
    region: str = Field(min_length=1)
    # A backend that is not a cloud: whose catalog prices it. Checked against the registry's catalog clouds by the
    # loader (parse_provider's `price_clouds`), so a third-party cloud backend's catalog cloud is one too.
    simulate_cloud: str | None = Field(None, min_length=1)
    catalog: str = Field("embedded", min_length=1)
    # How long a live catalog (memory, then disk cache) is used before the cloud is read again; 0 = every time.
    catalog_ttl_s: float = Field(CATALOG_TTL_S, ge=0)
    unavailable_ttl_s: float = Field(ttls.UNAVAILABLE_TTL_S, ge=0)
    # Capacity-error backoff (core/availability.py). `unavailable_backoff_cap_s: <the ttl>` with
    # `unavailable_probes: 0` is the fixed TTL of before.
    unavailable_backoff_cap_s: float = Field(ttls.UNAVAILABLE_BACKOFF_CAP_S, ge=0)
    unavailable_probes: int = Field(ttls.UNAVAILABLE_PROBES, ge=0)
    list_cache_s: float = Field(ttls.LIST_CACHE_S, ge=0)
    registration: str = "vm"
    max_candidates_per_launch: int = Field(ttls.MAX_CANDIDATES_PER_LAUNCH, ge=1)
    launch_timeout_s: float = Field(ttls.LAUNCH_TIMEOUT_S, gt=0)
    launch_retry_backoff_s: float = Field(ttls.TRANSIENT_LAUNCH_BACKOFF_S, ge=0)
    max_hourly_cost: float | None = Field(None, gt=0)     # USD per hour for the whole cluster; None = no cap
    # Previous-generation families (core/family_names.py, per cloud) are left out of searches unless this is true.
    allow_previous_generation: bool = False
    # Spot interruption notices (ray_nodeless/interruptions/). The watcher is on by default because draining early
    # costs nothing and a reclaimed node's tasks otherwise fail only when its heartbeat times out; the key turns it
    # off (workers without ray_nodeless installed, or another agent already handles notices). The queue is AWS's
    # EventBridge -> SQS path, polled by the provider; only a backend whose config `supports_interruption_queue`
    # takes it (checked where the backend is known: operate/config.py).
    interruption_watcher: bool = True
    interruption_queue_url: str | None = Field(None, pattern=r"^https?://[^/\s]+/\S+$")
    # `exclude` is declared before `rules`: the rules' validator folds the parsed exclusions into the RuleSet.
    exclude: Requirements = Field(default_factory=Requirements)   # requirements.parse_exclude (names nested keys)
    rules: RuleSet = Field(None, validate_default=True)            # rules.parse_rules, plus `exclude`
    # Effective prices (core/prices.py): discounts and fixed prices, first match wins, applied before the ranking.
    price_overrides: PriceBook = Field(default_factory=PriceBook)
    # The nested groups (core/setting_groups.py): shape-open provisioning, what the monitor exports, cost-aware idle
    # release. Their older flat keys (`open_shapes`, `metrics_port`, `cost_aware_idle`, ...) are folded in by
    # `_fold_groups`; the flat names stay readable as properties below.
    open: OpenSettings = Field(default_factory=OpenSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    idle: IdleSettings = Field(default_factory=IdleSettings)
    reservations: ReservationSettings = Field(default_factory=ReservationSettings)
    # On-demand -> spot reversion and the on-demand preference after repeated interruptions (core/reversion.py).
    reversion: ReversionSettings = Field(default_factory=ReversionSettings)
    # Written by bootstrap_config for the provider objects Ray builds later; never set by hand.
    node_type_resources: dict[str, object] = Field(default_factory=dict)
    worker_boot: dict[str, object] = Field(default_factory=dict)
    # The worker types whose idle timeout is the plan's, not their own idle_timeout_s: the monitor's learned idle
    # release may end their idle machines sooner (launch/idle_release.py). None: not recorded (shape-open types only).
    idle_learn_types: list[str] | None = None
    # The backend's own catalog cloud (`BackendConfig.catalog_cloud`), as the loader passed it to parse_provider;
    # not a key of the block.
    _catalog_cloud: str | None = PrivateAttr(None)
    # The price cloud's previous-generation families, as the loader (operate/config.py) asked the backend registry.
    _previous_generation: frozenset[str] = PrivateAttr(frozenset())

    @model_validator(mode="before")
    @classmethod
    def _fold_groups(cls, data: object) -> object:
        return fold_groups(data) if isinstance(data, Mapping) else data

    @field_validator("exclude", mode="plain")
    @classmethod
    def _parse_exclude(cls, value: object) -> Requirements:
        return parse_exclude(value, "provider.exclude")        # a ConfigError passes through parse_section as is

    @field_validator("price_overrides", mode="plain")
    @classmethod
    def _parse_price_overrides(cls, value: object) -> PriceBook:
        return parse_price_overrides(value, "provider.price_overrides")

    @field_validator("rules", mode="plain")
    @classmethod
    def _parse_rules(cls, value: object, info: ValidationInfo) -> RuleSet:
        return RuleSet(rules=parse_rules(value), exclude=info.data.get("exclude") or Requirements())

    # The flat names of before the groups, read-only: callers written against them keep working.
    @property
    def open_shapes(self) -> bool | None:
        return self.open.enabled

    @property
    def open_node_config(self) -> dict[str, object]:
        return self.open.node_config

    @property
    def max_open_node_types(self) -> int:
        return self.open.max_node_types

    @property
    def single_zone_gangs(self) -> bool:
        return self.open.single_zone_gangs

    @property
    def metrics_port(self) -> int | None:
        return self.metrics.port

    @property
    def events_dir(self) -> str | None:
        return self.metrics.events_dir

    @property
    def ray_status_events(self) -> int:
        return self.metrics.ray_status_events

    @property
    def cost_aware_idle(self) -> bool:
        return self.idle.cost_aware

    @property
    def expected_launch_s(self) -> float:
        return self.idle.expected_launch_s

    @property
    def relaunch_overhead_usd(self) -> float:
        return self.idle.relaunch_overhead_usd

    @property
    def price_cloud(self) -> str:
        """The catalog cloud that prices decisions: the backend's own (`BackendConfig.catalog_cloud`, which the
        loader hands to parse_provider); a backend that is not a cloud (local, or a registered test backend) is
        priced as `simulate_cloud` (default DEFAULT_PRICE_CLOUD)."""
        return self._catalog_cloud or self.simulate_cloud or DEFAULT_PRICE_CLOUD

    @property
    def default_exclusions(self) -> Requirements:
        """What every search leaves out unless it names it: previous-generation families, unless
        `allow_previous_generation`."""
        if self.allow_previous_generation or not self._previous_generation:
            return Requirements()
        return Requirements(exclude_families=self._previous_generation)


CORE_KEYS = declared_keys(CoreSettings) | FLAT_KEYS      # the flat keys of before the groups too
# The keys only planning reads (which offering a launch gets): listing, tagging and terminating never need them, so
# a teardown reads the block without them when they do not parse (parse_provider's `planning=False`).
PLANNING_KEYS = ("exclude", "rules", "price_overrides")

# The name the core's settings had when a dataclass copied the fields of CoreSettings; kept for callers of it.
ProviderSettings = CoreSettings


def unknown_provider_keys(provider: Mapping[str, object], known: Iterable[str]) -> list[ConfigError]:
    """An error for each key of the provider block no one declares (the core, the backend, the registration, Ray),
    with a did-you-mean when it is close to a known one; nothing is silently ignored."""
    known = frozenset(known) | CORE_KEYS | RAY_PROVIDER_KEYS
    errors = []
    for k in sorted(provider, key=str):
        if not isinstance(k, str):
            errors.append(ConfigError(f"provider.{k}", "keys must be strings"))
        elif k not in known and not k.startswith("_"):
            # keys with a leading underscore are Ray's own bookkeeping (e.g. _config_cache_path)
            close = suggest_key(k, known)
            errors.append(unknown_key(f"provider.{k}", k, known) if close else ConfigError(
                f"provider.{k}", f"unknown key {k!r} for this backend and registration; known keys: "
                                 + ", ".join(sorted(known - RAY_PROVIDER_KEYS - FLAT_KEYS))))
    return sorted(errors, key=lambda e: "did you mean" not in str(e))     # the typos first: stable sort


def key_problems(provider: Mapping[str, object], known_keys: Iterable[str] | None,
                 required_by: Iterable[type[Section]] = ()) -> list[ConfigError]:
    """The provider block's unknown keys (when `known_keys`, the backend's and registration's, are given) and the
    required keys it lacks (the core's and those of `required_by`), each once, typos first."""
    problems = unknown_provider_keys(provider, known_keys) if known_keys is not None else []
    models: tuple[type[Section], ...] = (CoreSettings, *required_by)
    for model in models:
        problems += [e for e in missing_keys(model, provider, "provider") if e.key not in {p.key for p in problems}]
    return problems


def check_keys(provider: Mapping[str, object], known: Iterable[str]) -> None:
    """Every key of the provider block must be known (see unknown_provider_keys); all unknown ones in one error."""
    errors = unknown_provider_keys(provider, known)
    if errors:
        raise ConfigErrors.of(errors)


def parse_provider(provider: Mapping[str, object], *, clouds: Iterable[str] | None = None,
                   known_keys: Iterable[str] | None = None, catalog_cloud: str | None = None,
                   price_clouds: Iterable[str] | None = None, planning: bool = True,
                   required_by: Iterable[type[Section]] = ()) -> CoreSettings:
    """The core's reading of the provider block (one validation of CoreSettings). What only the backend registry
    knows comes from the operate layer's loader: `clouds` (the registry's names), `known_keys` (the backend's and
    registration's declared keys), `catalog_cloud` (the backend's own catalog cloud, None for a backend that is
    not a cloud), `price_clouds` (every catalog cloud, what `simulate_cloud` may name) and `required_by` (the
    backend's and registration's models, whose required keys are checked with the core's). Without them only the
    core keys are checked and the block is priced as `simulate_cloud` (default DEFAULT_PRICE_CLOUD): right for a
    backend that is not a cloud; a cloud backend's block is read through `operate.config.load_provider`.

    Unknown keys (each with its did-you-mean) and missing required keys come first, all in one error: a typo
    (`regoin`) is named as itself, not as the key it leaves missing.

    `planning=False` (teardown: `ray down`, `sweep`): a mistake in PLANNING_KEYS is a warning and the block is read
    without them (the default rule, no exclusions), so a rule broken or tightened since `ray up` cannot keep the
    cluster's machines running; every other key is checked as always (the backend must still be built)."""
    if not isinstance(provider, Mapping):
        raise ConfigError("provider", f"must be a mapping, got {type(provider).__name__}")
    problems = key_problems(provider, known_keys, required_by)
    if problems:
        raise ConfigErrors.of(problems)
    try:
        core = parse_section(CoreSettings, provider, "provider")
    except ConfigError as e:
        if planning or not any(e.key == f"provider.{k}" or e.key.startswith((f"provider.{k}.", f"provider.{k}["))
                               for k in PLANNING_KEYS):
            raise
        logger.warning("%s; not needed to end the cluster's machines: reading the provider block without %s", e,
                       " and ".join(PLANNING_KEYS))
        core = parse_section(CoreSettings, {k: v for k, v in provider.items() if k not in PLANNING_KEYS}, "provider")
    if clouds is not None and core.cloud not in set(clouds):
        raise ConfigError("provider.cloud", f"{core.cloud!r} is not one of {sorted(clouds)}")
    if catalog_cloud is not None and core.simulate_cloud is not None:
        raise ConfigError("provider.simulate_cloud",
                          f"only applies to backends that are not a cloud, not {core.cloud!r}")
    if price_clouds is not None and core.simulate_cloud is not None and core.simulate_cloud not in set(price_clouds):
        raise ConfigError("provider.simulate_cloud", f"must be one of {sorted(price_clouds)} (the clouds the "
                                                     f"catalog prices), got {core.simulate_cloud!r}")
    if 0 < core.unavailable_backoff_cap_s < core.unavailable_ttl_s and "unavailable_backoff_cap_s" in provider:
        raise ConfigError("provider.unavailable_backoff_cap_s",
                          f"{core.unavailable_backoff_cap_s:g} is shorter than provider.unavailable_ttl_s "
                          f"({core.unavailable_ttl_s:g}): the backoff starts at the ttl and doubles up to the cap")
    core._catalog_cloud = catalog_cloud
    return core


class Resolver:
    """Node type -> planner Request: first matching rule, narrowed by node_config, global exclusions added."""

    def __init__(self, settings: CoreSettings,
                 backend_overrides: Callable[[Document], Document] | None = None):
        self.settings = settings
        self.backend_overrides = backend_overrides

    def request(self, node_type: str, resources: object, node_config: object, is_head: bool) -> Request:
        """`resources` and `node_config` as a node type of the YAML has them (None: none), checked here: a mistake
        is a ConfigError naming the key."""
        key = f"available_node_types.{node_type}"
        resources = resources or {}
        shape = Shape.from_resources(resources, f"{key}.resources")
        # Shape.from_resources has raised unless `resources` maps names to numbers: what the rules compare.
        assert isinstance(resources, Mapping) and only_amounts(resources)
        node_config = node_config or {}
        if not isinstance(node_config, Mapping):
            raise ConfigError(f"{key}.node_config", "must be a mapping")
        ours, theirs = split_node_config(node_config)
        # A generated node type follows the rule of the demand it was opened for (core/open_plan.py), not the rule
        # its whole machine would match: the choice and the launch then agree.
        match_on = ours.pop(OPEN_SHAPE_KEY, None)
        # Its amounts are left to the rules' predicates, which float() the ones they compare (as before): open_plan
        # writes numbers, and a hand-edited generated type must plan as it did.
        if match_on is not None and not isinstance(match_on, Mapping):
            raise ConfigError(f"{key}.node_config.{OPEN_SHAPE_KEY}", "must be a mapping of resources")
        rule: Rule | None = self.settings.rules.first_match(node_type, match_on or resources, is_head)
        base = rule.requirements if rule else Requirements()
        req = base.narrowed_by(parse_requirements(ours, f"{key}.node_config"), f"{key}.node_config")
        if self.backend_overrides is not None:
            implied = self.backend_overrides(theirs)
            if implied:
                req = req.narrowed_by(parse_requirements(implied, f"{key}.node_config"), f"{key}.node_config")
        req = req.narrowed_by(self.settings.rules.exclude, "provider.exclude")
        if not req.instance_types and req.families is None:
            # A node type or rule that names instance types or families keeps what it names (an InstanceType
            # pinned in node_config included); a search the user left open leaves the previous generation out.
            req = req.narrowed_by(self.settings.default_exclusions, "provider.allow_previous_generation")
        return Request(cloud=self.settings.price_cloud, region=self.settings.region, shape=shape,
                       requirements=req, rule=rule.name if rule else DEFAULT_RULE, node_type=node_type)


def node_types_of(cluster_config: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """The node types of a cluster YAML, checked for what Ray and ray_nodeless read of them."""
    types = cluster_config.get("available_node_types")
    if not isinstance(types, Mapping) or not types:
        raise ConfigError("available_node_types", "the cluster YAML must define at least one node type")
    for name, t in types.items():
        key = f"available_node_types.{name}"
        if not isinstance(t, Mapping):
            raise ConfigError(key, f"must be a mapping, got {type(t).__name__}")
        for field in ("min_workers", "max_workers"):
            v = t.get(field)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"{key}.{field}", f"must be a whole number >= 0, got {v!r}")
        v = t.get("idle_timeout_s")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                              or v == float("inf")):
            raise ConfigError(f"{key}.idle_timeout_s", f"must be a number of seconds >= 0, got {v!r}")
        if isinstance(t.get("min_workers"), int) and isinstance(t.get("max_workers"), int) \
                and t["min_workers"] > t["max_workers"]:
            raise ConfigError(f"{key}.min_workers", f"{t['min_workers']} is more than max_workers {t['max_workers']}")
        for field in ("node_config", "resources", "labels"):
            if t.get(field) is not None and not isinstance(t[field], Mapping):
                raise ConfigError(f"{key}.{field}", f"must be a mapping, got {t[field]!r}")
    v = cluster_config.get("max_workers")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ConfigError("max_workers", f"must be a whole number >= 0, got {v!r}")
    return {name: dict(types[name]) for name in sorted(types, key=str)}
