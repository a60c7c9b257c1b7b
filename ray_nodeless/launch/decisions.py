"""What a launch decides and records, as pure functions of its inputs: the idempotency key of a launch attempt
(`request_token`), the slot it fills (`launch_slot`), the decision tags a machine carries (`decision_tags`) and the
labels it starts Ray with (`machine_labels`). The launcher (launcher.py) calls them; so do the fault matrix and the
provider (a machine's start labels)."""
from __future__ import annotations

import hashlib
import logging
import uuid

from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.demand import PROMISABLE, offering_labels
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_CATALOG, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_LIST_PRICE, TAG_PRICE, TAG_RULE, TAG_ZONE,
)

logger = logging.getLogger(__name__)


def request_token(cluster: str, launch_request: str, node_type: str, batch: int, offering: Offering,
                  count: int, generation: int = 0) -> str:
    """A deterministic idempotency key per (launch request, node type, count, batch, offering), `batch` numbering
    the calls of one count within a round of the request (`Launcher._ordinal`): every batch Ray v2 sends under one
    request id gets its own machines; Ray's retry of the request (the same id, the same counts) gets the same keys,
    so the cloud returns the machines the first round made; a fallback to the next offering gets a new one. 32 hex
    chars fit both EC2's ClientToken (<= 64) and GCE's requestId (a UUID). `generation` moves on when the slot's
    machines were ended since (`Launcher._generation`): the old key would answer with machines that are gone."""
    text = f"{cluster}|{launch_request}|{node_type}|{batch}|{'|'.join(offering.key)}|{count}"
    if generation:
        text += f"|g{generation}"
    return str(uuid.UUID(hashlib.sha256(text.encode()).hexdigest()[:32]))


def launch_slot(cluster: str, launch_request: str, node_type: str, count: int, batch: int) -> str:
    """The slot a launch fills, whatever offering it lands on (tagged on its machines as TAG_LAUNCH_SLOT)."""
    return hashlib.sha256(f"{cluster}|{launch_request}|{node_type}|{count}|{batch}".encode()).hexdigest()[:32]


def decision_tags(cluster: str, catalog_id: str, offering: Offering, rule: str) -> dict[str, str]:
    """The tags that record a launch decision on the machine (the state rebuilt after a restart). The price is the
    effective one (what the cost cap counts); the list price is tagged beside it only when an override changed it."""
    tags = {
        TAG_CLUSTER: cluster,
        TAG_INSTANCE_TYPE: offering.instance_type.name,
        TAG_ZONE: offering.zone,
        TAG_CAPACITY: offering.capacity,
        TAG_PRICE: f"{offering.hourly_price:.6f}" if offering.hourly_price is not None else "unknown",
        TAG_RULE: rule,
        TAG_CATALOG: catalog_id,
    }
    listed = offering.listed
    differs = offering.hourly_price is None or listed is None or abs(listed - offering.hourly_price) > 5e-7
    if offering.list_price is not None and differs:
        tags[TAG_LIST_PRICE] = f"{listed:.6f}" if listed is not None else "unknown"
    return tags


def machine_labels(node_type: str, declared: dict[str, str] | None, offering: Offering) -> dict[str, str]:
    """The labels a machine of `offering` starts Ray with: the node type's declared ones, except Ray's default
    `ray.io/` keys we set (market type, zone, region, accelerator type: `core.demand.PROMISABLE`), which are always
    the machine's facts. A declared value for one of them that is not the fact (a node type declaring
    `ray.io/accelerator-type: H100` lands on a CPU machine) is overridden, or dropped where the machine has no such
    fact (no accelerator), with a warning naming the key: a selector on those labels must never be served by a
    machine that does not match."""
    facts = offering_labels(offering)
    declared = {str(k): str(v) for k, v in (declared or {}).items()}
    lies = {k: v for k, v in declared.items() if k in PROMISABLE and facts.get(k) != v}
    if lies:
        logger.warning("%s: declared label(s) %s are not what this %s machine is (%s); its facts are used", node_type,
                       ", ".join(f"{k}={v}" for k, v in sorted(lies.items())), offering.instance_type.name,
                       ", ".join(f"{k}={facts.get(k, '(none)')}" for k in sorted(lies)))
    out = {k: v for k, v in declared.items() if k not in PROMISABLE}
    out.update(facts)
    return out
