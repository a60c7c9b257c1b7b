"""The machine-backend contract: what the launch layer asks of a place where machines run.

Modelled on Karpenter's CloudProvider and Ray v2's `ICloudInstanceProvider`: a backend launches, lists, tags and
terminates machines and knows nothing of rules or prices. The launch layer decides *what* to launch
(`LaunchSpec.offering`, from the planner) and walks the ordered candidates when a backend raises `CapacityError`.

Four methods do the work: `launch`, `list_machines`, `terminate`, `set_tags`. Every backend gives the properties
below; `tests/providers/test_contract.py` runs them over every built-in backend (in-memory, local, EC2 on moto,
Compute Engine on the fake GCE), and each backend's own tests cover its cloud's faults. Words used: a machine is
*ours* when it exists (not terminated) and carries `ray-cluster-name == cluster_name`; *foreign* when it exists
without that tag (another cluster's, untagged, hand-made); *gone* when it does not exist any more (terminated,
reclaimed) or never did.

`launch(spec) -> ids`
- **Exactly the new machines.** Returns `spec.count` distinct ids, all of them new machines of this call (none
  listed before it), or raises. `count <= 0` returns `[]` and calls nothing.
- **Tagged at birth.** Every tag of `spec.tags` (with `ray-cluster-name == cluster_name`) is set at creation time,
  so no machine ever exists untagged; the next `list_machines` shows those tags.
- **Idempotent per request token.** A retried `launch` with the same `spec.request_token` never creates a second
  set of machines; it returns the ids the first call created (if they still live). A token whose machines were
  ended since is spent: the launcher moves such a slot to a new token generation (it asks by id first,
  `launch/launcher.py` `_generation`), so a backend never has to make machines anew under an old token.
- **No leak on failure.** When `launch` raises, no machine of that call is left running.
- **Typed errors with a category.** `CapacityError` (category = the cloud's code, `scope` zone or region) for a
  capacity or quota shortage of that offering; `TransientBackendError` when throttling outlasts its retries;
  `BackendError` for anything else. Never a raw SDK exception (this holds for every method).

`list_machines() -> machines`
- **Ours, and only ours.** Every pending or running machine of this cluster, in one (paginated) listing; never a
  foreign or untagged machine, whatever the cloud's server-side filter matched. Terminated machines are not listed.
- **Stopped machines are not Ray nodes** and are not listed; a cloud that can hold them (EC2 stopping/stopped, GCE
  STOPPING/TERMINATED/SUSPENDED) reports those tagged ours through `leftovers()`, so `ray-nodeless sweep` ends them.
- **Eventual consistency is allowed** (a machine just launched may be missing for a while; the launch layer's view
  covers that). A failure raises `BackendError`, never an empty or partial answer.
- **A second look: `recheck(ids)`, the lookup by id.** What a listing did not show is asked again before the
  launch layer believes it gone (a short or empty page happens, several in a row too), and so is every machine
  launched moments ago that the listing does not show yet (it may have ended already: a spot reclaim, EC2 ending
  a pending instance, another object's terminate). Given ids, each is `live` (the listing missed it), `gone` (with
  the reason where the cloud tells, see `vanished_reasons`) or left out (the cloud shows nothing of it). Given
  None (a fresh object's first listing: `ray down`, `sweep`, a restarted monitor), every live machine a second
  method of listing finds. The query must not be the listing's own (a glitch of that query must not answer it
  twice): EC2 DescribeInstances by instance id, or by the cluster tag in every state and then DescribeTags;
  GCE instances.get by name in its zone, or the zonal lists; the local backend its node records; the in-memory
  cloud its records. Edge cases: a foreign id (another cluster's, untagged) is never live and never gone, left
  out; an id the cloud shows nothing of may be gone (consistent reads: GCE, local) or left out (EC2, whose reads
  lag); an id never launched at all is the same; a failure raises `BackendError` (the view then answers from its
  last listing), never a partial answer. The default (for third-party backends) lists again.

`terminate(ids)`
- **One batched call** for the ids given; duplicates count once; `[]` calls nothing.
- **Idempotent.** Ids that are gone are ignored without error: terminating twice is the same as once.
- **Never touches foreign ids.** Every id is checked against the cloud (not only against what this object listed:
  a restarted provider knows nothing yet), so an id this object does not know still reaches the cloud and is ended
  if it is tagged ours. Foreign ids are refused: the ours among `ids` are ended, then `ForeignMachineError` names
  the others.
- **Never a silent skip of a machine that may be ours.** Where the cloud's reads lag its writes (EC2) an id it does
  not show at all may be a machine launched moments ago: it is not ended and not ignored either, the call raises
  `TransientBackendError` (category `NotYetVisible`) after ending the rest, and the caller retries.

`set_tags(id, tags) -> bool`
- **Merges** `tags` into an ours machine's tags (others kept) and returns True; the next listing shows them.
  `{}` returns True and calls nothing. Setting `ray-cluster-name` to another cluster is refused (`BackendError`,
  category WrongCluster): it would hand the machine to another cluster.
- **Gone: no error and no effect, reported.** Returns False (and logs it): a machine reclaimed under Ray must not
  put the autoscaler into an exception loop.
- **Foreign: refused** with `ForeignMachineError`; nothing is written. A cloud whose reads lag (EC2) raises
  `TransientBackendError` (NotYetVisible) for an id it does not show at all, as `terminate` does.

Config-time checks are class-level (`settings_model`, `check_node_config`, `requirement_overrides`), so
`ray up`'s bootstrap and `ray-nodeless plan` validate a YAML without building a client; each built-in backend also
has them in a `BackendConfig` that imports no cloud SDK (what `plan` loads). So are the steps of `ray up`'s
bootstrap: the static ones (`fill_default_images`) on the BackendConfig, the cloud set-up that makes API calls
(`bootstrap`) on the backend class; both do nothing unless a backend overrides them.

**Settings come parsed.** A backend declares its provider-block keys once, as `settings_model` (a
`core.schema.Section`); the operate layer's loader (`operate.config.load_provider`) validates the whole block once and
hands each part down. So the constructor contract is `Backend(settings, cluster_name)`, `settings` an instance of
`Backend.settings_model`, and the config-time checks get that same instance (`check_node_config(settings, ...)`,
`requirement_overrides(settings, ...)`), never the raw provider dict: a key a backend reads must be declared in its
model (a key of the core's, such as `region`, too). A third-party backend (`providers.register_backend`) follows
the same contract; with no keys of its own it keeps the default `settings_model` (the empty `Section`).
`Backend.from_provider(provider, cluster_name)` parses only the backend's own section of a raw block, for tests and
tools that hold one; the adapter, `sweep` and `status` build backends from the loader's bundle.
"""
from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, TypeVar

from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.node_resources import GENERIC_FILL, FillRule
from ray_nodeless.core.catalog.refresh import LiveCatalog
from ray_nodeless.core.schema import Section, parse_section
from ray_nodeless.errors import BackendError, ConfigError

if TYPE_CHECKING:
    from ray.autoscaler.command_runner import CommandRunnerInterface   # Ray's public API; for annotations only

    from ray_nodeless.providers.swapin import SwapIn

logger = logging.getLogger(__name__)

# Tags (AWS tags / GCE labels / local metadata) that ray_nodeless sets on every machine, beside Ray's own
# (`ray-node-type`, `ray-user-node-type`, `ray-node-name`, `ray-node-status`, `ray-launch-config`).
TAG_CLUSTER = "ray-cluster-name"
# Ray's own tag keys (ray.autoscaler.tags TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE), named once here for the layers
# that do not import Ray (tests/ray_compat/test_compat.py checks them against Ray's).
TAG_RAY_NODE_KIND = "ray-node-type"          # head | worker
TAG_RAY_USER_NODE_TYPE = "ray-user-node-type"
TAG_INSTANCE_TYPE = "nodeless-instance-type"
TAG_ZONE = "nodeless-zone"
TAG_CAPACITY = "nodeless-capacity"
TAG_PRICE = "nodeless-hourly-price"          # the effective price (provider.price_overrides applied)
TAG_LIST_PRICE = "nodeless-list-price"       # the catalog's price, only where an override changed it
TAG_RULE = "nodeless-rule"
TAG_RESERVATION = "nodeless-reservation"     # capacity `reserved`: the reservation it was launched into
TAG_CATALOG = "nodeless-catalog"
# Set just before this cluster terminates a machine: a machine that vanishes with it was ended by us (by any
# provider object of the cluster), not interrupted.
TAG_TERMINATING = "nodeless-terminating"
# On the head only, shape-open clusters: the pending demands no allowed offering can serve, and why (what
# `ray-nodeless status` shows; at most TAG_UNSERVED_MAX characters, cloud tag values are short).
TAG_UNSERVED = "nodeless-unserved"
TAG_UNSERVED_MAX = 250

MACHINE_PENDING = "pending"
MACHINE_RUNNING = "running"


def tag_update(cluster_name: str, machine_id: str, tags: Mapping[str, Any]) -> dict[str, str]:
    """`tags` as strings, for `set_tags`; refuses (BackendError, category WrongCluster) a `ray-cluster-name` other
    than `cluster_name`: re-tagging would move the machine out of this cluster's reach and into another's."""
    out = {str(k): str(v) for k, v in tags.items()}
    if out.get(TAG_CLUSTER, cluster_name) != cluster_name:
        raise BackendError(f"refusing to set {TAG_CLUSTER}={out[TAG_CLUSTER]!r} on {machine_id}: it is a machine of "
                           f"cluster {cluster_name!r}", category="WrongCluster")
    return out


@dataclass
class LaunchSpec:
    """One launch attempt of `count` machines of one offering."""

    cluster_name: str
    node_type: str                      # the Ray node type name (ray-user-node-type)
    offering: Offering
    count: int
    tags: dict[str, str]                # Ray tags + ray-cluster-name + decision tags; set at creation
    node_config: dict[str, Any]         # backend keys of node_config (ray_nodeless requirement keys removed)
    request_token: str                  # idempotency key: ClientToken (AWS) / requestId (GCP)
    resources: dict[str, float] = field(default_factory=dict)   # Ray logical resources of the node
    labels: dict[str, str] = field(default_factory=dict)
    is_head: bool = False
    # With `disable_node_updaters: true` on a cloud: the script the machine runs at boot to join Ray (EC2 UserData,
    # GCE startup-script). Empty otherwise. A backend that cannot run it must say so (ConfigError).
    boot_script: str = ""
    # Capacity `reserved` (offering.capacity): the reservation (`Reservation.id`) the machines launch into.
    reservation_id: str = ""


@dataclass(frozen=True)
class Reservation:
    """A capacity reservation the cloud holds for this account (AWS: an On-Demand Capacity Reservation or a
    Capacity Block), as `MachineBackend.reservations` lists it."""

    id: str
    instance_type: str
    zone: str
    total: int
    available: int                      # instances it can take now
    match: str = "targeted"             # "open" | "targeted" (AWS InstanceMatchCriteria): launches target it by id
    kind: str = "default"               # "default" | "capacity-block" (AWS ReservationType)
    start: float | None = None          # epoch seconds; a capacity block takes instances from then
    end: float | None = None            # epoch seconds; None: no end date
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Machine:
    """A machine as a backend lists it."""

    id: str
    tags: dict[str, str]
    state: str = MACHINE_RUNNING        # MACHINE_PENDING | MACHINE_RUNNING; terminated machines are not listed
    internal_ip: str | None = None
    external_ip: str | None = None
    launched_at: float = 0.0            # epoch seconds


@dataclass
class Recheck:
    """A second look at machines a listing did not show (`MachineBackend.recheck`)."""

    live: list[Machine] = field(default_factory=list)      # still there: the listing missed them
    gone: dict[str, str] = field(default_factory=dict)     # id -> "terminated" | "interrupted" | "" (not told)
    # An id asked about in neither: the cloud showed nothing of it (EC2 keeps a terminated instance listed for
    # about an hour, so for one listed moments ago that is a glitch, not "gone").


class BackendConfig:
    """The config-time half of a backend: its provider-block keys and node_config checks, and the hooks below
    that callers outside providers/ use instead of switching on the cloud's name; importable without the backend
    (no client, no cloud SDK, no Ray: a hook imports what it needs when called), so `ray-nodeless plan` stays fast.
    Each built-in backend has one (`providers/<cloud>/config.py` for aws and gcp), registered in
    `ray_nodeless.providers` next to the backend class; the backend class answers the same calls."""

    cloud: ClassVar[str] = ""
    settings_model: ClassVar[type[Section]] = Section

    @classmethod
    def check_node_config(cls, settings: Section, node_type: str, node_config: dict[str, Any],
                          key: str) -> None:
        """Raise ConfigError (naming `key`.<field>) for backend keys of node_config that cannot work, given the
        backend's parsed provider keys `settings` (an instance of `settings_model`). No client, no network."""

    @classmethod
    def requirement_overrides(cls, settings: Section, node_config: dict[str, Any]) -> dict[str, Any]:
        """Requirement keys implied by backend keys (given the backend's parsed `settings`), e.g. AWS
        `InstanceType: x` -> `{"instance_types": [x]}`."""
        return {}

    # -- static parts of `ray up`'s bootstrap, as Ray's own provider of this cloud does them (no API call;
    #    ray_adapter/bootstrap.py and `plan` call these; the cloud set-up is MachineBackend.bootstrap) --

    @classmethod
    def fill_default_images(cls, settings: Section, cluster_config: dict[str, Any]) -> None:
        """Static, before planning (no API call): give each node type without an image the one Ray's own provider
        of this cloud would (AWS: Ray's default AMI of the region), in place; raise ConfigError naming the key when
        there is none. Default: nothing (the backend needs no image, or reads it from its own keys)."""

    # ----- hooks: what callers outside providers/ ask of a cloud, instead of switching on its name. Each has a
    # default that is right for a backend that is not a cloud (a third-party or test backend registered with
    # `providers.register_backend`): it opts out of the feature, and the caller says so or does without.

    # The catalog cloud (core/catalog) whose offerings and prices are this backend's machines: a cloud's own name.
    # Default None: the machines are no cloud's (local processes, a test backend), so decisions are priced as
    # `provider.simulate_cloud` (default aws); the loader refuses `simulate_cloud` for a backend that has one
    # (operate/config.py). `providers.price_clouds()` lists them: the `--cloud` choices of `plan` and `catalog`.
    catalog_cloud: ClassVar[str | None] = None
    # Real instance families of that catalog cloud no catalog lists (retired, dedicated-host, unpriced; data in
    # core/family_names.py): accepted where a family is named, so excluding one is no error.
    unlisted_families: ClassVar[frozenset[str]] = frozenset()
    # That cloud's previous-generation families (core/family_names.py): out of every search unless
    # `provider.allow_previous_generation` (CoreSettings.default_exclusions).
    previous_generation_families: ClassVar[frozenset[str]] = frozenset()

    # The `provider.type` of Ray's own provider for this backend's cloud: the one whose defaults.yaml `ray up`
    # merges into a YAML of that type. `bootstrap_config` fills a swapped YAML's missing keys from it
    # (ray_adapter/ray_defaults.py) and `convert` reads Ray YAMLs of that type (swapin/ray_defaults.py).
    # Default None: Ray has no provider of this cloud (empty fill-ins, nothing to convert from).
    ray_provider_type: ClassVar[str | None] = None

    # The backend polls a queue of interruption warnings (`provider.interruption_queue_url`; AWS: EventBridge ->
    # SQS). Default False: the key is refused for this backend, naming it (operate/config.py).
    supports_interruption_queue: ClassVar[bool] = False

    @classmethod
    def interruption_queue_client(cls, queue_url: str, settings: Section) -> Any:
        """A client of the interruption queue at `queue_url` with SQS's `receive_message` / `delete_message`
        (interruptions/queue.py polls it), from the backend's parsed `settings` (an instance of `settings_model`:
        its credentials, region). Only called when `supports_interruption_queue`; default: ConfigError."""
        raise ConfigError("provider.interruption_queue_url", f"backend {cls.cloud or cls.__name__!r} polls no "
                                                             "interruption queue")

    @classmethod
    def interruption_source(cls, metadata_url: str | None) -> Any:
        """Where a machine of this backend reads its own interruption notice, for the node-side watcher
        (interruptions/watch.py): an object with `blocks` (True: `poll` waits in a hanging GET itself; False: the
        watcher sleeps between polls) and `poll(wait_s) -> Notice | None`. `metadata_url` overrides the metadata
        server's base URL (tests). Default None: no notices on this backend (the watcher refuses the cloud)."""
        return None

    @classmethod
    def instance_id_snippet(cls, var: str) -> str | None:
        """Bash lines that set the shell variable `var` to the booting machine's own id (the id `launch`
        returned), read from the cloud's instance metadata: boot scripts (registrations/vm_boot.py, Kubernetes
        join user data) start with it. Default None: the machine cannot tell, so ray_nodeless writes no boot script
        of its own for it (updaters start Ray; a Kubernetes join takes the id from its environment)."""
        return None

    @classmethod
    def fill_rule(cls) -> FillRule:
        """The cloud's part of Ray's resource fill-in for a node type pinned to one of its catalog's instance
        types (core/node_resources.py): the name Ray gives its GPUs, accelerator cores per type, whether declared
        CPU/GPU keep Ray from filling. Asked of the backend config of the catalog cloud (`price_cloud`). Default:
        Ray's generic rule."""
        return GENERIC_FILL

    @classmethod
    def swapin(cls) -> SwapIn | None:
        """How `ray-nodeless convert` turns a Ray YAML of this cloud (`type: <cloud>`) into a ray_nodeless one
        (providers/swapin.py). Default None: Ray has no provider of that name to convert from."""
        return None

    @classmethod
    def plan_notes(cls, node_config: Mapping[str, Any]) -> list[str]:
        """Lines `ray-nodeless plan` prints under a node type: what its static preview cannot know of this
        node_config (AWS: a LaunchTemplate is read only by `ray up`). Default: none."""
        return []

    @classmethod
    def live_catalog(cls, settings: Section, region: str) -> LiveCatalog | None:
        """For `provider.catalog: live`: how to read `region`'s catalog from this backend's cloud, with what its
        parsed `settings` (an instance of `settings_model`) say of credentials, endpoint and project (no I/O here;
        the policy of `core/catalog/refresh.py` decides when to call its `fetch`). None, the default (local and
        third-party backends): no live catalog; the embedded one is used, with a warning. May raise ConfigError
        for settings that cannot name what to read."""
        return None


_Backend = TypeVar("_Backend", bound="MachineBackend")


class MachineBackend(BackendConfig, abc.ABC):
    """A place where machines run: local processes, EC2, Compute Engine. A built-in backend class also derives from
    its BackendConfig (`class AwsBackend(AwsConfig, MachineBackend)`), so both answer the config calls alike."""

    # Set by the caller that shows machines to Ray (ray_adapter/provider.py: the view's `launched`), called by a
    # backend whose launch call returns only after the machines' Ray is up (local processes; a played cloud's
    # machines, once the cloud made them and before their players start Ray) with the machines it has made so far,
    # before it waits. Why: Ray v2's instance manager takes a Ray node whose instance no listing has shown yet for
    # an unmanaged one, and its own launch request then stays pending for 10 min, counted as capacity on its way
    # (a second demand is never launched for). A cloud whose launch call returns its ids before they boot never
    # calls it. `created` is the safe call (a failing hook is logged, never fails the launch).
    on_created: Callable[[list[Machine]], None] | None = None

    def __init__(self, settings: Section, cluster_name: str):
        """`settings`: this backend's provider keys as parsed by the loader (an instance of `settings_model`)."""
        self.settings = settings
        self.cluster_name = cluster_name

    def created(self, machines: list[Machine]) -> None:
        hook = self.on_created
        if hook is None or not machines:
            return
        try:
            hook(machines)
        except Exception as e:      # the view's bookkeeping must never fail a launch that made machines
            logger.warning("%s: shown-before-ready hook failed for %s: %s", type(self).__name__,
                           [m.id for m in machines], e)

    @classmethod
    def from_provider(cls: type[_Backend], provider: Mapping[str, Any], cluster_name: str) -> _Backend:
        """A backend from a raw provider block, parsing only its own section (errors name the key). For tests and
        tools; the launch path builds backends from `operate.config.load_provider`'s bundle."""
        return cls(parse_section(cls.settings_model, provider, "provider"), cluster_name)

    @classmethod
    def bootstrap(cls, cluster_config: dict[str, Any], registration: str,
                  allowed_zones: Mapping[str, frozenset[str] | None]) -> bool:
        """The cloud resources `ray up` sets up before the head exists, as Ray's own provider of this cloud does
        (AWS: instance profile, key pair, subnets, security group; GCP: SSH key, subnet, service account), filled
        into `cluster_config` in place; failures are ConfigErrors naming the key to set. API calls: on the backend
        class, not its BackendConfig. `registration`: how machines join Ray (`vm` needs SSH, IAM, ...);
        `allowed_zones`: node type -> the zones its rule and node_config allow (None: any). True when steps ran and
        may have narrowed where node types can launch (the caller then plans again). Default: nothing, False."""
        return False

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec) -> list[str]:
        """Create `spec.count` machines of `spec.offering`; return their ids."""

    @abc.abstractmethod
    def list_machines(self) -> list[Machine]:
        """Every non-terminated machine of this cluster, in one listing."""

    @abc.abstractmethod
    def terminate(self, machine_ids: list[str]) -> None:
        """Terminate these machines in one batched call: gone ids ignored, foreign ones refused (see above)."""

    def vanished_reasons(self, machine_ids: list[str]) -> dict[str, str]:
        """Why these machines left the listing, where the cloud still tells: "terminated" (ended by a terminate
        call) or "interrupted" (reclaimed by the cloud). Ids it cannot tell about are left out (the default)."""
        return {}

    def recheck(self, machine_ids: list[str] | None) -> Recheck:
        """A second look at what a listing did not show (see the contract above). Default: a second listing; an id
        it does not show either is gone, with `vanished_reasons`' reason ("" where none is told)."""
        listed = {m.id: m for m in self.list_machines() if m.tags.get(TAG_CLUSTER) == self.cluster_name}
        if machine_ids is None:
            return Recheck(live=[listed[i] for i in sorted(listed)])
        missing = [i for i in machine_ids if i not in listed]
        reasons = self.vanished_reasons(missing) if missing else {}
        return Recheck(live=[listed[i] for i in machine_ids if i in listed],
                       gone={i: reasons.get(i, "") for i in missing})

    def reservations(self) -> list[Reservation]:
        """The active capacity reservations of the cluster's region this account may launch into (capacity
        `reserved`): listed afresh. Default: none (a backend without reservations; a rule's `reserved` then never
        has a candidate). Raises BackendError when the cloud cannot be asked."""
        return []

    def forget(self, machine_ids: list[str]) -> None:
        """These machines left the listing without a terminate call of this object (interrupted, or ended by
        another process of the cluster): release what the backend keeps for them beside the machine itself (a
        decorator's local player, see providers/local/played.py). Default: nothing."""

    @abc.abstractmethod
    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        """Merge `tags` into an ours machine's tags: True when written, False when the machine is gone;
        `ForeignMachineError` for a machine of another cluster (see the contract above). `tag_update` checks and
        normalises `tags` the same way for every backend."""

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict[str, Any], cluster_name: str,
                       process_runner: ModuleType, use_internal_ip: bool,
                       docker_config: dict[str, Any] | None = None) -> CommandRunnerInterface | None:
        """A Ray CommandRunnerInterface for this machine, or None to use Ray's SSH runner (the arguments are those
        of Ray's `NodeProvider.get_command_runner`)."""
        return None

    def leftovers(self) -> list[dict[str, str]]:
        """What this cluster holds on the backend besides its listed machines, for `ray-nodeless sweep`: dicts with
        `kind`, `name`, `machine_id`, `node_kind` (head / worker / ""), `state`. The local backend: processes the
        head's command runner started (the head's Ray). Listed afresh, never from a cache. Default: nothing."""
        return []

    def end_leftovers(self, leftovers: list[dict[str, str]]) -> None:
        """End these leftovers (from `leftovers()`); raise BackendError if it could not. Default: nothing to do."""

    def close(self) -> None:
        """Release clients and threads. Machines keep running."""
