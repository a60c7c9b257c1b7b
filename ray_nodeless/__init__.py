"""ray_nodeless: a Ray autoscaler node provider that launches the cheapest-fit instance for each node type.

Use it from a cluster YAML as `provider: {type: external, module: ray_nodeless.NodelessProvider, ...}`.
`NodelessProvider` is imported lazily so that the CLI and the pure core do not import Ray.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["NodelessProvider", "__version__"]


def __getattr__(name: str):
    if name == "NodelessProvider":
        from ray_nodeless.ray_adapter.provider import NodelessProvider
        return NodelessProvider
    raise AttributeError(f"module 'ray_nodeless' has no attribute {name!r}")
