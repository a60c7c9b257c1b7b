"""Every name of Ray's that is not its NodeProvider API: the one place a Ray upgrade has to be checked.

Ray's private modules (`ray._private`, `ray._raylet`, `ray.autoscaler._private`, `ray.core.generated`) are imported
here and nowhere else in ray_nodeless (tests/cli/test_layering.py enforces it). Each module below wraps one thing Ray
does that ray_nodeless relies on, and lists in `RAY_NAMES` the (module, attribute) pairs it reads, so that
tests/ray_compat/test_compat.py fails on a Ray that renamed or moved one of them rather than a user's `ray up`.

The package is a leaf: it imports no other ray_nodeless module except `ray_nodeless.errors`, so every layer (the
adapter, providers, registrations, interruptions, simulate, swapin) may use it without an import cycle. Ray itself
is imported lazily (inside functions) except in `command_runner`, whose callers subclass Ray's classes anyway:
`ray-nodeless plan` must not pay for importing Ray.

    process          is this Ray's monitor (its command line: GCS, config file, logs dir)? is this `ray down`?
    node_ip          this host's address as Ray's raylet reports it
    gcs              Ray's GCS client: the node table, draining a node
    defaults         Ray's per-cloud defaults.yaml and its own config preparation and checks
    aws_amis         Ray's default AMI per region, read without importing Ray
    aws_bootstrap    Ray's AWS bootstrap steps, given our credentials and endpoint
    gcp_bootstrap    Ray's GCP bootstrap helpers (SSH key names, the head's service account)
    command_runner   Ray's command-runner internals (output redirection, environment prefix, errors)
    scheduler        Ray's v1 ResourceDemandScheduler, for `ray-nodeless simulate`
    demand           Ray's pending demands and nodes as the GCS reports them (ClusterResourceState)
    kuberay          Ray's KubeRay path: a RayCluster's autoscaling config, Ray's monitor (v1/v2) over our reader
    ray_status       the text slot `ray status` prints after its report; `ray exec`'s path to the head
"""
from __future__ import annotations

from ray_nodeless.ray_compat.process import MonitorArgs, in_teardown, monitor_args

# The modules that list the Ray names they rely on (tests/ray_compat/test_compat.py imports each).
MODULES = ("process", "node_ip", "gcs", "defaults", "aws_amis", "aws_bootstrap", "gcp_bootstrap", "command_runner",
           "scheduler", "demand", "kuberay", "ray_status")

__all__ = ["MODULES", "MonitorArgs", "in_teardown", "monitor_args"]
