"""The provider the KubeRay bridge hands Ray: NodelessProvider plus KubeRay's head pod as the cluster's head node.

Under `ray up` the head is a machine ray_nodeless launched, listed like the workers. Under KubeRay the operator owns
the head pod; Ray's autoscaler still needs to see a head node of `head_node_type` (v1 launches one when none is
listed: "Adding 1 node(s) of type headgroup"), as Ray's own KubeRayNodeProvider lists the head pod. So this provider
lists one more node, the head, with the head's tags and IP (`kuberay.head_ip`: the host of the GCS address the
autoscaler serves), and never launches or terminates it. Its MonitorContext is `kuberay.monitor`, built by the
bridge (GCS address, session logs dir, the config file the bridge writes). Everything else is NodelessProvider's.
"""
from __future__ import annotations

from typing import Any, Iterable

from ray.autoscaler.tags import (
    NODE_KIND_HEAD, STATUS_UP_TO_DATE, TAG_RAY_NODE_KIND, TAG_RAY_NODE_NAME, TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay.bridge import MONITOR_KEY
from ray_nodeless.ray_adapter.context import OUTSIDE, MonitorContext
from ray_nodeless.ray_adapter.provider import NodelessProvider

KEY = "kuberay"       # the provider block's key this provider reads (and takes out before NodelessProvider's loader)


class KubeRayNodelessProvider(NodelessProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        block = dict(provider_config)
        head = block.pop(KEY, None)
        if not isinstance(head, dict) or not {"head_id", "head_ip", "head_node_type"} <= set(head):
            raise ConfigError(f"provider.{KEY}", "the KubeRay head ({head_id, head_ip, head_node_type}): written by "
                                                 "`ray-nodeless kuberay-autoscaler`, not by hand")
        monitor = head.get(MONITOR_KEY)
        if monitor is not None and not isinstance(monitor, dict):
            raise ConfigError(f"provider.{KEY}.{MONITOR_KEY}", "must be the bridge's monitor context (a mapping)")
        # The bridge's context, passed through the provider block: Ray builds the provider from the block's module
        # path with (provider_config, cluster_name) only, and the block is what the bridge hands Ray. Without one
        # (the provider built outside the bridge's monitor) it acts on nothing: never a guess from argv.
        context = MonitorContext.from_mapping(monitor, f"provider.{KEY}.{MONITOR_KEY}") if monitor else OUTSIDE
        super().__init__(block, cluster_name, context=context)
        self.provider_config = provider_config      # what Ray compares; the loader read the block without KEY
        self.head_id = str(head["head_id"])
        self.head_ip = str(head["head_ip"])
        self.head_tags = {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: str(head["head_node_type"]),
                          TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE, TAG_RAY_NODE_NAME: self.head_id}

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        nodes = super().non_terminated_nodes(tag_filters)
        if all(self.head_tags.get(k) == v for k, v in tag_filters.items()):
            nodes = sorted(nodes + [self.head_id])
        return nodes

    def is_running(self, node_id: str) -> bool:
        return node_id == self.head_id or super().is_running(node_id)

    def is_terminated(self, node_id: str) -> bool:
        return node_id != self.head_id and super().is_terminated(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        return dict(self.head_tags) if node_id == self.head_id else super().node_tags(node_id)

    # Ray types these `str`, yet its own KubeRayNodeProvider answers None for a pod without an IP, and v1 handles it.
    def internal_ip(self, node_id: str) -> str | None:  # type: ignore[override]
        # As Ray's KubeRayNodeProvider (a pending pod has no IP): a worker's address is its Ray pod's, once the pod
        # runs. Before that no raylet can claim it, and v1's idle check (by IP) must not match another Ray node.
        if node_id == self.head_id:
            return self.head_ip
        return super().internal_ip(node_id) if self.is_running(node_id) else None

    def external_ip(self, node_id: str) -> str | None:  # type: ignore[override]  # as internal_ip
        if node_id == self.head_id:
            return self.head_ip
        return super().external_ip(node_id) if self.is_running(node_id) else None

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        if node_id == self.head_id:
            self.head_tags.update(tags)
            return
        super().set_node_tags(node_id, tags)

    def terminate_nodes(self, node_ids: Iterable[str]) -> dict | None:
        # The head pod is the operator's: never ended from here.
        return super().terminate_nodes([i for i in node_ids if i != self.head_id])

    def terminate_node(self, node_id: str) -> dict | None:
        return self.terminate_nodes([node_id])
