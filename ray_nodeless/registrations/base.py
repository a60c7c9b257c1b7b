"""How a machine joins the Ray cluster, composed with any machine backend (`provider.registration`)."""
from __future__ import annotations

import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from ray_nodeless.core.schema import Section, parse_section
from ray_nodeless.core.settings import CoreSettings, parse_provider
from ray_nodeless.providers.base import LaunchSpec, Machine

if TYPE_CHECKING:
    from ray.autoscaler.command_runner import CommandRunnerInterface   # Ray's public API; for annotations only


class Clock(Protocol):
    """A registration's time source: seconds since the epoch (a wall clock: registrations compare it with the
    timestamps of outside systems, a Node's creationTimestamp, a backend's launch time). The default is `time.time`;
    a test passes a clock it moves by hand (ray_nodeless/testing/clock.py's FakeClock satisfies this) to step past a
    timeout instead of sleeping through it. Only deadlines and ages are read from it: the waits that pace a
    background loop stay real (an `Event.wait`, so `close()` cuts them short), since a fake sleep that returns at
    once would turn them into busy loops."""

    def __call__(self) -> float: ...


WALL_CLOCK: Clock = time.time


# Not an ABC: every hook has a default (a registration overrides what it needs), so there is nothing abstract.
class Registration:
    """How a machine joins the Ray cluster, composed with any backend (`provider.registration`).

    `vm` (BareVM): the machine runs Ray itself. `kubernetes`: the machine joins a Kubernetes cluster as a node.
    `local-player`: every machine a backend launches is *played* by a local `ray start` process carrying its id,
    so the real cloud control-plane code (EC2 under moto, GCE under a fake server) drives a real Ray cluster; the
    playing is a backend decorator (providers/local/played.py), not the registration's.

    Constructor contract: `Registration(settings, cluster_name, core)`: `settings` its own provider keys as the
    loader (`operate.config.load_provider`) parsed them (an instance of `settings_model`), `core` the core's
    (`core.settings.CoreSettings`: cloud, region, the recorded worker boot commands, ...). Never the raw block.
    """

    name: ClassVar[str] = ""
    # The registration's own provider-block keys, declared once (see core/schema.py).
    settings_model: ClassVar[type[Section]] = Section

    def __init__(self, settings: Section, cluster_name: str, core: CoreSettings) -> None:
        self.settings = settings
        self.cluster_name = cluster_name
        self.core = core

    @classmethod
    def check_config(cls, settings: Section) -> None:
        """Config-time checks of the registration's keys that need no network (`ray-nodeless plan` and
        `bootstrap_config` run them), on its section as the loader parsed it (`ProviderBundle.
        registration_settings`); ConfigError naming the key."""

    @classmethod
    def preflight(cls, settings: Section, cluster_name: str) -> None:
        """What `bootstrap_config` checks against the registration's live services before `ray up` creates the
        head (the API server a machine joins, ...), on its parsed section; ConfigError naming the key. Includes
        `check_config`."""
        cls.check_config(settings)

    @classmethod
    def for_sweep(cls, settings: Section, cluster_name: str, core: CoreSettings) -> "Registration":
        """An instance for `ray-nodeless sweep`: it must create nothing (no pod, no join), only list and end."""
        return cls(settings, cluster_name, core)

    @classmethod
    def from_provider(cls, provider: Mapping[str, Any], cluster_name: str,
                      core: CoreSettings | None = None) -> "Registration":
        """A registration from a raw provider block: its own section, then (unless given) the core's keys, each
        parsed alone (errors name the key; no check of unknown keys). For tests and tools; the launch path builds
        registrations from `operate.config.load_provider`'s bundle."""
        settings = parse_section(cls.settings_model, provider, "provider")
        return cls(settings, cluster_name, core if core is not None else parse_provider(provider))

    def prepare(self, spec: LaunchSpec) -> LaunchSpec:
        """Adjust a launch before it reaches the backend (e.g. add a join script to user data)."""
        return spec

    def after_launch(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        """Called once the backend has created the machines."""

    def describe(self, machine: Machine) -> Machine:
        """Adjust a listed machine (e.g. the IP Ray sees). Must be cheap: called for every machine per listing."""
        return machine

    def after_terminate(self, machine_ids: list[str]) -> None:
        """Called after the backend has terminated the machines."""

    def observe_listing(self, machine_ids: set[str]) -> None:
        """The full listing of the cluster's machines, after every refresh (to judge what it keeps against)."""

    def machines_to_end(self) -> dict[str, str]:
        """Machines that will never join and should be terminated (machine id -> reason), e.g. a join timeout."""
        return {}

    def status(self, machine_id: str) -> dict[str, Any]:
        """Extra per-machine fields for `ray-nodeless status` (e.g. the Kubernetes Node and pod)."""
        return {}

    def leftovers(self) -> list[dict[str, str]]:
        """What the registration keeps for this cluster outside the machines (Kubernetes Nodes and Ray pods), for
        `ray-nodeless sweep`: dicts with `kind`, `name`, `machine_id`, `node_kind`, `state`. Listed
        afresh from the source of truth, not a cache. Default: nothing."""
        return []

    def sweep(self, machine_ids: list[str]) -> None:
        """End what the registration keeps for these machines (ended by a sweep, or gone already) and wait for it,
        by the same clean-up as `after_terminate`. Default: `after_terminate`, which is synchronous for every
        registration but Kubernetes."""
        self.after_terminate(machine_ids)

    def command_runner(self, log_prefix: str, node_id: str, auth_config: dict[str, Any], cluster_name: str,
                       process_runner: ModuleType, use_internal_ip: bool,
                       docker_config: dict[str, Any] | None = None) -> CommandRunnerInterface | None:
        """A Ray CommandRunnerInterface for this machine when the registration reaches it other than by SSH, asked
        by the provider's `get_command_runner` when the backend has none (`MachineBackend.command_runner`, same
        arguments: Ray's `NodeProvider.get_command_runner`'s). Default None: Ray's SSH runner."""
        return None

    def wait_ready(self, timeout_s: float) -> None:
        """Block until status() can answer (a registration that watches an API fills its cache first)."""

    def close(self) -> None:
        """Release what the registration holds."""
