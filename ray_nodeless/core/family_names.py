"""Real instance-family names the embedded catalog does not list, per cloud: data, kept by hand.

Why: a family named in `exclude`, `exclude_families` or a rule's `families` is checked so that a typo (`g4dm`,
`zz9`) is an error instead of an exclusion that silently excludes nothing. The catalog knows the families whose
types are priced in at least one of its regions (its type table is the union of every region's), but users'
YAMLs also name families the catalog has no price for: previous-generation families AWS still runs for old
accounts but no longer lists (`g3`, `p2`, `p3`: common in exclusion lists written against Ray's own AWS provider),
and current families sold only as dedicated hosts, bare metal or accelerator VMs the catalog's price sources do not
cover. Excluding one of those is harmless and must be accepted; allowing only those leaves nothing to launch,
which `plan` says as a note.

Sources: the clouds' "previous generation instances" pages (AWS), the machine-family pages (GCE), as of 2026-11.
Add a family here when a real name is refused; a name the catalog lists needs no entry.
"""
from __future__ import annotations

from typing import Iterable

# AWS families no longer (or never) in the price lists the embedded catalog is built from.
AWS_RETIRED_FAMILIES = frozenset({
    # previous generation (EC2 "Previous generation instances"; some still run in old accounts)
    "m1", "m2", "m3", "m4", "c1", "c3", "c4", "cc1", "cc2", "cg1", "cr1", "g2", "g3", "g3s", "g4ad", "hi1", "hs1",
    "i2", "i3", "p2", "p3", "p3dn", "r3", "r4", "t1", "x1", "x1e", "d2", "f1", "dl1", "h1", "inf1", "a1",
    # dedicated hosts and metal-only families (macOS, high memory), not in the on-demand price lists
    "mac1", "mac2", "mac2-m1ultra", "mac2-m2", "mac2-m2pro", "mac-m4", "mac-m4pro",
    "u-3tb1", "u-6tb1", "u-9tb1", "u-12tb1", "u-18tb1", "u-24tb1",
    # accelerator families sold as capacity blocks or UltraServers
    "p6e-gb200", "trn2u",
})

# GCE machine families the catalog's price sources do not cover (Arm and newer series, memory- and
# compute-optimised series, TPU VMs) and the N1-era shared-core types' families.
GCP_RETIRED_FAMILIES = frozenset({
    "n1", "f1", "g1",                                   # the N1 era (first generation, shared-core f1/g1)
    "c4a", "n4a", "n4d", "h3", "h4d", "z3", "m2", "m4", "x4", "a4x", "g4",
    "ct4p", "ct5l", "ct5lp", "ct6e",                    # TPU VMs (ct5lp-hightpu-4t, ...)
})

# Previous-generation families, left out of every search by default (`provider.allow_previous_generation: true`
# brings them back; a node type or rule that names an instance type or family keeps what it names). Karpenter's
# default NodePool does the same (instance generation > 2). AWS: the families of EC2's "Previous generation
# instances" page that a price list still carries (a 1-CPU demand otherwise got m1.small: 2006, 1.7 GiB).
AWS_PREVIOUS_GENERATION = frozenset({
    "t1", "m1", "m2", "m3", "c1", "c3", "cc1", "cc2", "cg1", "cr1", "g2", "hi1", "hs1", "i2", "r3",
})
# GCE: the first-generation shared-core types (f1-micro, g1-small). N1 stays: it is the only host of the T4, V100,
# P100 and P4 GPUs, and where a newer family is cheaper for a CPU demand the ranking already takes it.
GCP_PREVIOUS_GENERATION = frozenset({"f1", "g1"})

# Which cloud a set belongs to is its backend's to say (`BackendConfig.unlisted_families`, asked through
# `providers.unlisted_families(catalog_cloud)`): the core names no cloud.


def cloud_families(catalog_families: Iterable[str], unlisted: Iterable[str] = ()) -> frozenset[str]:
    """Every family name a cloud has: the catalog's (the union of its regions') and the real ones it lacks."""
    return frozenset(catalog_families) | frozenset(unlisted)
