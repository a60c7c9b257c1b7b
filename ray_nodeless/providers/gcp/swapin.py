"""`ray-nodeless convert` for Ray's `type: gcp` YAMLs (`GcpConfig.swapin()`; the conversion is swapin/convert.py).

What is GCP's own: `machineType` (with `guestAccelerators`) pins a type; `scheduling` may be in Ray's list form;
custom machine types (`custom-N-M`) are not in the catalog but their shape is in their name; and Ray's bootstrap
refuses a null `project_id`.
"""
from __future__ import annotations

from typing import Any, Mapping

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.gcp import node_config as gcp_nc
from ray_nodeless.providers.swapin import KeyMapping, Note, SwapIn


def custom_machine(machine_type: str) -> bool:
    """True for a GCE custom machine type name (`custom-6-16384`, `n2-custom-4-8192-ext`)."""
    return bool(gcp_nc.CUSTOM_MACHINE_TYPE.match(machine_type or ""))


class GcpSwapIn(SwapIn):
    ray_type = "gcp"
    pin_key = "machineType"
    pin_keys = ("machineType", "guestAccelerators")
    unpinned_launch = "GCE requires a machineType"
    keys = (
        KeyMapping("gcp", "provider.availability_zone", "zones: that zone (a comma-separated list is accepted; "
                   "kept)", "providers/gcp/node_config.py requirement_overrides"),
        KeyMapping("gcp", "provider.project_id", "the project (kept; null is an error, as in Ray's bootstrap)",
                   "providers/gcp/settings.py"),
        KeyMapping("gcp", "provider.cache_stopped_nodes", "true cannot be honoured (VMs are deleted, never "
                   "stopped): error; convert drops it with a note", "providers/gcp/settings.py"),
        KeyMapping("gcp", "provider.gcp_credentials", "the clients' credentials, built as Ray builds them "
                   "(service_account: the key's JSON; credentials_token: an access token) (kept)",
                   "providers/gcp/settings.py GcpCredentials"),
        KeyMapping("gcp", "node_config.machineType", "instance_types: [it] (pinned); custom-N-M: error (the "
                   "catalog has no per-vCPU / per-GB rates); --free-instance-types: its shape (custom-N-M: N vCPU, "
                   "M MiB; a GPU model no offering has any more: any model)",
                   "providers/gcp/node_config.py requirement_overrides"),
        KeyMapping("gcp", "node_config.guestAccelerators", "GPU model and count of the pinned type "
                   "(`n1-standard-8+1xT4`); more than one entry, or one beside a machine type with built-in GPUs: "
                   "error", "providers/gcp/node_config.py pinned_machine"),
        KeyMapping("gcp", "node_config.scheduling (map, or Ray's list form)", "merged; preemptible: true / "
                   "provisioningModel: SPOT -> capacity: [spot]; false / STANDARD -> [on-demand]; "
                   "instanceTerminationAction other than DELETE, automaticRestart or MIGRATE on spot: error",
                   "providers/gcp/node_config.py scheduling_map / scheduling_capacity"),
        KeyMapping("gcp", "node_config.<other Instance fields>", "passed to instances.insert as Ray passes them",
                   "providers/gcp/instance_body.py"),
    )

    def complete_provider(self, provider: dict[str, Any], project_id: str | None) -> None:
        if project_id:
            provider["project_id"] = project_id
        if not provider.get("project_id"):
            raise ConfigError("provider.project_id", "is not set (Ray's own GCP bootstrap requires it too); set it "
                                                     "in the YAML or pass --project-id")

    def settle_node_config(self, provider: Mapping[str, Any], node_config: dict[str, Any], key: str) -> list[Note]:
        if not isinstance(node_config.get("scheduling"), list):
            return []
        node_config["scheduling"] = gcp_nc.scheduling_map(node_config["scheduling"], f"{key}.scheduling")
        return [(("node_config", "scheduling"), "Ray's list form merged into one mapping (what it means to GCE)")]

    def pinned_type(self, node_config: Mapping[str, Any], catalog: catalog_mod.Catalog, key: str
                    ) -> catalog_mod.InstanceType | None:
        """From the catalog; a custom machine type from its name; a known host with GPUs the catalog does not
        attach to it, from the host (the GPUs are checked against the region by convert)."""
        pinned = gcp_nc.pinned_machine(node_config, key)
        if pinned is None:      # no machineType: nothing pinned
            return None
        machine, model, count = pinned
        name = gcp_nc.catalog_type_name(machine, model, count)
        m = gcp_nc.CUSTOM_MACHINE_TYPE.match(machine)
        if m:
            return catalog_mod.InstanceType(
                cloud="gcp", name=name, family=m.group("series") or "n1", vcpus=int(m.group("vcpus")),
                memory_gib=int(m.group("mib")) / 1024, gpu_model=model, gpu_count=count, machine_type=machine)
        t = catalog.instance_type("gcp", name)
        if t is None and count:
            host = catalog.instance_type("gcp", machine)
            if host is not None and model:
                return catalog_mod.InstanceType(cloud="gcp", name=name, family=host.family, vcpus=host.vcpus,
                                                memory_gib=host.memory_gib, gpu_model=model, gpu_count=count,
                                                machine_type=machine)
        return t

    def off_catalog_note(self, t: catalog_mod.InstanceType, catalog: catalog_mod.Catalog) -> str | None:
        if not custom_machine(t.machine_type):
            return None
        return (f"{t.machine_type} is a GCE custom machine type (not in the catalog, which has no custom rates): "
                f"its shape is read from its name, {t.vcpus:g} vCPU and {int(round(t.memory_gib * 1024))} MiB")

    def check_pinned(self, node_config: Mapping[str, Any], catalog: catalog_mod.Catalog, key: str
                     ) -> tuple[str, str] | None:
        gcp_nc.check_machine_type(node_config, key)
        pinned = gcp_nc.pinned_machine(node_config, key)
        if pinned is None:
            return None
        machine, model, count = pinned
        if count and catalog.instance_type("gcp", machine) is not None:
            return model, f"{key}.guestAccelerators[0].acceleratorType"
        return None
