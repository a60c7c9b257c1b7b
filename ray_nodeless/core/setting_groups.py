"""The provider block's nested groups: `open`, `metrics`, `idle` (and `reversion`, core/reversion.py), each a typed
section of CoreSettings, and the flat keys they replace, which are still read.

    provider:
      open:                      # shape-open provisioning (core/open_plan.py, launch/open_types.py)
        enabled: null            # null: on exactly when the cluster declares no worker node type
        node_config: {}          # launch and constraint keys of every generated node type
        max_node_types: 32       # generated node types kept at once
        single_zone_gangs: true  # a placement group's new machines in one zone
      metrics:                   # what the monitor tells (ray_nodeless/metrics/)
        port: 44218              # Prometheus endpoint of ray_nodeless_* metrics; null: not exported
        events_dir: null         # the decision log; null: $RAY_NODELESS_EVENTS_DIR, else ~/.ray-nodeless/events
        ray_status_events: 0     # the last N decisions appended to `ray status`; 0 (default): not shown
      idle:                      # cost-aware idle release (core/idle.py)
        cost_aware: true
        expected_launch_s: 180
        relaunch_overhead_usd: 0

Each group is read from one place: its nested mapping, with the flat keys of before the groups (`open_shapes`,
`metrics_port`, `cost_aware_idle`, ... : FLAT_KEYS) folded into it, so every existing YAML keeps its meaning. A
setting given both ways (`metrics_port` and `metrics.port`) is an error naming both. An error in a flat key names
the flat key, as the user wrote it.
"""
from __future__ import annotations

from typing import ClassVar, Mapping

from pydantic import ConfigDict, Field, PrivateAttr

from ray_nodeless.core.idle import DEFAULT_LAUNCH_LATENCY_S
from ray_nodeless.core.idle_gaps import DEFAULT_MIN_GAP_S, DEFAULT_WINDOW
from ray_nodeless.core.schema import Section, parse_section
from ray_nodeless.errors import ConfigError

class Group(Section):
    """A nested group of the provider block. It knows how each of its keys was written (nested or as the older
    flat key), so a later check of a value names the key the user wrote (`key`)."""

    # A nested group is a block of our own: a key it does not declare is a mistake, named with a did-you-mean.
    model_config = ConfigDict(**{**Section.model_config, "extra": "forbid"})
    group: ClassVar[str] = ""
    # key in the group -> the flat key it was written as (fold_groups sets it; empty when written nested).
    _written_flat: dict[str, str] = PrivateAttr(default_factory=dict)

    def key(self, name: str, prefix: str = "provider") -> str:
        """The dotted key of `name` as the YAML wrote it: `provider.open_node_config` or `provider.open.node_config`."""
        flat = self._written_flat.get(name)
        return f"{prefix}.{flat}" if flat else f"{prefix}.{self.group}.{name}"


class OpenSettings(Group):
    """`provider.open`: shape-open provisioning. Every pending demand that no declared worker type serves gets its
    cheapest-fit machine, as a node type generated into the config the monitor re-reads."""

    group = "open"
    # None = on exactly when the cluster declares no worker node type (a head, limits and rules).
    enabled: bool | None = None
    # Launch keys (and requirement keys that narrow the search) of every generated node type, e.g. ImageId.
    node_config: dict[str, object] = Field(default_factory=dict)
    # Generated node types kept at once (each is a node type Ray's scheduler scores every demand against).
    max_node_types: int = Field(32, ge=1, le=256)
    # A placement group's new machines in one zone (cross-zone traffic costs money); false: each its cheapest.
    single_zone_gangs: bool = True


class MetricsSettings(Group):
    """`provider.metrics`: what the monitor exports and records."""

    group = "metrics"
    # The monitor's Prometheus endpoint for ray_nodeless_* metrics (Ray's own autoscaler metrics are on 44217);
    # null: not exported.
    port: int | None = Field(44218, ge=1, le=65535)
    # The head's decision log and cost state (metrics/events.py), and the cost cap's ledger of launches in flight
    # (launch/shared_holds.py); None: $RAY_NODELESS_EVENTS_DIR, else ~/.ray-nodeless/events (of the head's home).
    events_dir: str | None = Field(None, min_length=1)
    # The last N decisions appended to `ray status` (metrics/ray_status.py); 0: not shown.
    ray_status_events: int = Field(0, ge=0, le=50)   # off by default: opt in (metrics/ray_status.py)


class IdleSettings(Group):
    """`provider.idle`: cost-aware idle release (core/idle.py). Each worker type's idle_timeout_s is the break-even
    of keeping an idle machine against relaunching it (expected_launch_s + 3600 x relaunch_overhead_usd / price);
    a node type's own idle_timeout_s wins; cost_aware false: Ray's idle_timeout_minutes for every type.
    learn_gaps (core/idle_gaps.py, with cost_aware): a type whose last `learn_window` idle gaps were mostly longer
    than expected_launch_s releases an idle machine after `learn_min_gap_s` (the monitor drains it through Ray's
    idle drain, which refuses a busy node); a type with shorter gaps keeps the break-even."""

    group = "idle"
    cost_aware: bool = True
    expected_launch_s: float = Field(DEFAULT_LAUNCH_LATENCY_S, ge=0)   # request -> Ray node ready
    relaunch_overhead_usd: float = Field(0.0, ge=0)                    # fixed cost of a relaunch beyond its boot
    learn_gaps: bool = True
    learn_window: int = Field(DEFAULT_WINDOW, ge=1, le=100)
    learn_min_gap_s: float = Field(DEFAULT_MIN_GAP_S, ge=1, le=3600)


class ReservationSettings(Group):
    """`provider.reservations`: which of the cloud's capacity reservations a rule's capacity `reserved` may use
    (launch/reservations.py). By default every active one of the region; `ids` and `tags` narrow that (both: a
    reservation must pass both)."""

    group = "reservations"
    ids: list[str] = Field(default_factory=list)           # only these reservation ids (AWS: cr-...)
    tags: dict[str, str] = Field(default_factory=dict)     # only reservations carrying all these tags
    refresh_s: float = Field(30.0, ge=0, le=3600)          # how long a listing of the reservations is used
    # A Capacity Block is not launched into this close to its end (its machines are drained before it).
    block_drain_s: float = Field(1800.0, ge=0, le=86400)


GROUPS: dict[str, type[Group]] = {"open": OpenSettings, "metrics": MetricsSettings, "idle": IdleSettings,
                                  "reservations": ReservationSettings}

# The flat provider keys of before the groups: flat key -> (group, key in the group). Still accepted.
FLAT: dict[str, tuple[str, str]] = {
    "open_shapes": ("open", "enabled"),
    "open_node_config": ("open", "node_config"),
    "max_open_node_types": ("open", "max_node_types"),
    "single_zone_gangs": ("open", "single_zone_gangs"),
    "metrics_port": ("metrics", "port"),
    "events_dir": ("metrics", "events_dir"),
    "ray_status_events": ("metrics", "ray_status_events"),
    "cost_aware_idle": ("idle", "cost_aware"),
    "expected_launch_s": ("idle", "expected_launch_s"),
    "relaunch_overhead_usd": ("idle", "relaunch_overhead_usd"),
}
FLAT_KEYS = frozenset(FLAT)


def flat_key(group: str, name: str) -> str:
    """The flat provider key of `group.name` (`open.node_config` -> `open_node_config`)."""
    return next(flat for flat, where in FLAT.items() if where == (group, name))


def fold_groups(data: Mapping[str, object], prefix: str = "provider") -> dict[str, object]:
    """`data` with each group parsed once: its nested mapping and its flat keys folded together (the flat keys
    removed). A setting given both ways is a ConfigError naming both keys; a flat key's error names the flat key."""
    out = dict(data)
    for group, model in GROUPS.items():
        flat = {FLAT[k][1]: (k, out.pop(k)) for k in sorted(FLAT) if FLAT[k][0] == group and k in out}
        if not flat:
            continue                     # the nested mapping alone (or the defaults): pydantic reads it as is
        nested = out.get(group)
        if nested is None:
            nested = {}
        if not isinstance(nested, Mapping):
            raise ConfigError(f"{prefix}.{group}", f"must be a mapping, got {type(nested).__name__}")
        for name in sorted(set(flat) & set(nested)):
            raise ConfigError(f"{prefix}.{flat[name][0]} / {prefix}.{group}.{name}",
                              f"the same setting given twice; keep `{group}: {{{name}: ...}}` (the flat "
                              f"`{flat[name][0]}` is its older spelling)")
        merged = {**nested, **{name: value for name, (_, value) in flat.items()}}
        written = {name: k for name, (k, _) in flat.items()}
        try:
            parsed = parse_section(model, merged, f"{prefix}.{group}")
        except ConfigError as e:
            raise _as_written(e, prefix, group, written) from None
        parsed._written_flat = written
        out[group] = parsed
    return out


def _as_written(e: ConfigError, prefix: str, group: str, flat_names: Mapping[str, str]) -> ConfigError:
    """`e` naming the flat key the user wrote (`provider.expected_launch_s`), not its place in the group."""
    for name, flat in flat_names.items():
        nested = f"{prefix}.{group}.{name}"
        if e.key == nested or e.key.startswith((nested + ".", nested + "[")):
            message = str(e)[len(e.key) + 2:]
            return ConfigError(f"{prefix}.{flat}" + e.key[len(nested):], message)
    return e
