"""`registration: local-player`: a cloud backend's machines, each *played* by a local Ray node.

The cloud control plane is real code against a fake cloud (EC2 under moto, GCE under a fake server); nothing boots
there. The playing is not the registration's: this name makes the loader parse the player's keys
(`player_state_dir`, `local_*`) and `ProviderBundle.make_backend` wrap the backend in `PlayedBackend` with its
Ray-node player (providers/local/played.py, players.py), which starts a local `ray start --block` node for each
worker machine launched, with `RAY_CLOUD_INSTANCE_ID=<the cloud machine id>`, reports its 127.0.0.N as the
machine's IP, stops it when the machine is terminated or vanishes, and gives `ray up` a local command runner for
the head.

As for joining Ray, a played machine runs Ray itself from the moment it exists: nothing to prepare, nothing to wait
for. So this registration adds nothing to the base class; it exists so that `registration: local-player` stays
the key that says "play these machines" (cluster-configs, tests and the AWS/GCP bootstrap steps read it).
"""
from __future__ import annotations

from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.registrations.base import Registration


class LocalPlayer(Registration):
    """Played machines join Ray by themselves; see the module docstring for where the playing is."""

    name = "local-player"

    def __init__(self, settings: Section, cluster_name: str, core: CoreSettings):
        super().__init__(settings, cluster_name, core)
