"""`MonitorContext`: what the process that built a provider is, passed to it rather than guessed by its parts.

A provider object is built by Ray's monitor on the head (which acts on the cluster: metrics endpoint, decision
events, the `ray status` block, reversion, the SQS drain, shape-open types, its own loop), and also by `ray up`,
`ray down`, `ray-nodeless sweep` / `plan` (which must do none of that, and must see the cloud's truth at each
listing). The context says which, once:
- Ray's own monitor (`ray up` clusters): `MonitorContext.of_this_process()`, from Ray's monitor command line, the
  one documented detection (ray_compat/process.py `monitor_args`, checked against the installed Ray's argparse).
- The KubeRay bridge (`ray-nodeless kuberay-autoscaler`) runs Ray's monitor in-process: it builds the context from
  what it knows (the GCS address it derived, the session's logs dir it read from the head, the config file it
  writes) and hands it to the provider in the provider block (kuberay/provider.py).
- Everything else: `OUTSIDE` (acts on nothing; every listing asks the cloud).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from ray_nodeless.errors import ConfigError
from ray_nodeless.ray_compat import monitor_args


@dataclass(frozen=True)
class MonitorContext:
    """`gcs_address`: the head's GCS this process serves (None outside a monitor); `config_path`: the cluster config
    file the monitor re-reads every loop (shape-open types are written there); `logs_dir`: the session's logs
    directory (Ray's autoscaler events); `acts_on_cluster`: this process is the cluster's autoscaler."""

    gcs_address: str | None = None
    config_path: str | None = None
    logs_dir: str | None = None
    acts_on_cluster: bool = False

    def __post_init__(self) -> None:
        if self.acts_on_cluster and not self.gcs_address:
            raise ConfigError("gcs_address", "a context that acts on the cluster needs the head's GCS address")

    @classmethod
    def of_this_process(cls) -> MonitorContext:
        """Ray's monitor (its command line), else OUTSIDE. Read by the provider once, when it is built."""
        args = monitor_args()
        if args is None:
            return OUTSIDE
        return cls(gcs_address=args.gcs_address, config_path=args.config_path, logs_dir=args.logs_dir,
                   acts_on_cluster=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], key: str) -> MonitorContext:
        """A context a parent wrote into a mapping (`to_mapping`), errors naming `key`."""
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", "is not a field of the monitor context")
        try:
            return cls(**dict(data))
        except TypeError as e:
            raise ConfigError(key, str(e)) from e

    def to_mapping(self) -> dict[str, Any]:
        return asdict(self)


OUTSIDE = MonitorContext()

