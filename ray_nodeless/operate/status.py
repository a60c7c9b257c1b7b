"""`ray-nodeless status`: the live machines of a cluster with their decision, uptime and accumulated cost.

It lists the backend directly (one listing call), so it works without a running autoscaler and shows exactly
what is billed: every machine tagged with the cluster's name.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ray_nodeless.core.documents import Document
from ray_nodeless.metrics.events import (
    Event, events_from_machines, events_path, head_events_path, head_read_command, head_read_output, merged_events,
    parse_log, read_log,
)
from ray_nodeless.operate.config import ProviderBundle, load_provider
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_LIST_PRICE, TAG_PRICE, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, TAG_RULE,
    TAG_UNSERVED, TAG_ZONE, Machine,
)


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    node_type: str
    kind: str
    instance_type: str
    zone: str
    capacity: str
    hourly_price: float | None
    rule: str
    uptime_s: float
    cost: float | None
    registration: Document = field(default_factory=dict)    # e.g. k8s_node, k8s_ready, pod, pod_phase
    unserved: str = ""        # the head of a shape-open cluster: demands nothing allowed can serve, and why
    list_price: float | None = None   # the catalog's price; differs from hourly_price where an override applied


def price_of(tags: dict[str, str], key: str = TAG_PRICE) -> float | None:
    try:
        return float(tags.get(key, ""))
    except ValueError:
        return None


def list_price_of(tags: dict[str, str]) -> float | None:
    """The list price a machine was launched at: its own tag where a price override changed it, else its price."""
    return price_of(tags, TAG_LIST_PRICE) if TAG_LIST_PRICE in tags else price_of(tags)


def _list(cluster_config: Document) -> tuple[ProviderBundle, list[Machine]]:
    bundle = load_provider(cluster_config.get("provider"))
    backend = bundle.make_backend(cluster_config["cluster_name"])
    try:
        return bundle, list(backend.list_machines())
    finally:
        backend.close()


def cluster_status(cluster_config: Document, now: float | None = None) -> list[NodeStatus]:
    bundle, machines = _list(cluster_config)
    now = time.time() if now is None else now
    extra: dict[str, Document] = {}
    if bundle.core.registration == "kubernetes":
        from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings
        from ray_nodeless.registrations.kubernetes.status import machine_status
        settings = bundle.registration_settings
        assert isinstance(settings, KubernetesSettings)     # what the loader parses for `registration: kubernetes`
        extra = machine_status(settings, cluster_config["cluster_name"], [m.id for m in machines])
    out = []
    for m in sorted(machines, key=lambda m: (m.tags.get(TAG_RAY_NODE_KIND) != "head", m.launched_at, m.id)):
        price = price_of(m.tags)
        uptime = max(0.0, now - m.launched_at) if m.launched_at else 0.0
        out.append(NodeStatus(
            node_id=m.id, node_type=m.tags.get(TAG_RAY_USER_NODE_TYPE, ""), kind=m.tags.get(TAG_RAY_NODE_KIND, ""),
            instance_type=m.tags.get(TAG_INSTANCE_TYPE, ""), zone=m.tags.get(TAG_ZONE, ""),
            capacity=m.tags.get(TAG_CAPACITY, ""), hourly_price=price, rule=m.tags.get(TAG_RULE, ""),
            uptime_s=round(uptime, 1), cost=None if price is None else round(price * uptime / 3600, 6),
            registration=extra.get(m.id, {}), unserved=m.tags.get(TAG_UNSERVED, ""),
            list_price=list_price_of(m.tags)))
    return out


def status_document(cluster_config: Document) -> Document:
    nodes = cluster_status(cluster_config)
    return {
        "cluster_name": cluster_config.get("cluster_name"),
        "nodes": [_flat(n) for n in nodes],
        "hourly_cost": round(sum(n.hourly_price or 0.0 for n in nodes), 6),
        "list_hourly_cost": round(sum(n.list_price or 0.0 for n in nodes), 6),
        "accumulated_cost": round(sum(n.cost or 0.0 for n in nodes), 6),
    }


def _flat(n: NodeStatus) -> Document:
    """A node's JSON record: its fields, with the registration's (k8s_node, pod, ...) beside them."""
    d = asdict(n)
    d.update(d.pop("registration"))
    return d


def events_document(cluster_config: Document, since_s: float | None = None, now: float | None = None,
                    read_head: Callable[[str], str] | None = None) -> Document:
    """The provider's decisions: the head's bounded event log and what the cluster's machines carry in their tags,
    from `since_s` ago on. The log is read here when this machine holds it (the head itself, or a local cluster
    run with the same events dir), else through `read_head(command)` -> its output (`ray exec`'s path to the head,
    given by the CLI) when a head is listed."""
    now = time.time() if now is None else now
    name = cluster_config["cluster_name"]
    bundle, machines = _list(cluster_config)
    configured = bundle.core.events_dir
    path = events_path(name, configured)
    logged: list[Event] = []
    source, error = None, None
    where = str(path)
    if path.exists():
        logged, source = read_log(path), "here"
    elif read_head is not None and any(m.tags.get(TAG_RAY_NODE_KIND) == "head" for m in machines):
        where = f"head:{head_events_path(name, configured)}"
        try:
            text = head_read_output(read_head(head_read_command(name, configured)))
        except Exception as e:      # no SSH to the head, a failed command: the machines' tags still answer
            error = f"{type(e).__name__}: {e}"
        else:
            if text is not None:
                logged, source = parse_log(text), "head"
    events = merged_events(logged, events_from_machines(machines, now), None if since_s is None else now - since_s)
    return {"cluster_name": name, "log": where, "log_found": source is not None, "log_source": source,
            "log_error": error, "events": [e.record() for e in events]}
