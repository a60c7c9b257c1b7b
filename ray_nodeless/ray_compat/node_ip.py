"""This host's address as Ray's raylet reports it (`ray._private.services`)."""
from __future__ import annotations

_SERVICES = "ray._private.services"
RAY_NAMES = ((_SERVICES, "get_node_ip_address"), (_SERVICES, "resolve_ip_for_localhost"))


def node_ip_address() -> str:
    """The address Ray's `ray start` on this host would report (what a raylet here registers with)."""
    from ray._private.services import get_node_ip_address

    return get_node_ip_address()


def resolve_localhost(address: str = "127.0.0.1") -> str:
    """What Ray rewrites a loopback `--node-ip-address` to (the host's routable address; loopback without one)."""
    from ray._private.services import resolve_ip_for_localhost

    return resolve_ip_for_localhost(address)
