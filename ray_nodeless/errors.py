"""One exception type per failure kind.

Every error a user can cause names the offending key (a dotted path into the cluster YAML) so that `ray up`
fails with a message that says what to fix, before anything launches.
"""
from __future__ import annotations

import enum


class NodelessError(Exception):
    """Base class of every error raised by ray_nodeless."""


class ConfigError(NodelessError, ValueError):
    """The cluster YAML (provider block, rules, node_config) is invalid. `key` is the dotted path at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class CatalogError(NodelessError):
    """The catalog file is missing, corrupt, or does not cover the requested cloud/region."""


class NoFeasibleOffering(NodelessError):
    """No offering satisfies a shape under its rule. Carries the explanation of every rejection."""

    def __init__(self, message: str, explanation: "object | None" = None, key: str | None = None):
        self.explanation = explanation
        self.key = key      # the config key that emptied the candidates, where core/diagnose.py could tell
        super().__init__(message)


class BackendError(NodelessError):
    """A machine backend call failed in a way that is not a capacity shortage (auth, bad request, ...)."""

    def __init__(self, message: str, category: str = "BackendError"):
        self.category = category
        super().__init__(message)


class ForeignMachineError(BackendError):
    """A call named machines that exist but are not this cluster's (not tagged `ray-cluster-name=<cluster>`): they
    were left untouched. `machine_ids` are the refused ids; whatever else the call named was done."""

    def __init__(self, message: str, machine_ids: "list[str] | tuple[str, ...]" = ()):
        super().__init__(message, category="ForeignMachine")
        self.machine_ids = sorted(machine_ids)


class CapacityScope(str, enum.Enum):
    """How far a capacity shortage reaches."""

    ZONE = "zone"          # this offering only (a stockout in one zone)
    REGION = "region"      # this instance type and capacity type in every zone of the region (a regional quota)


class CapacityError(BackendError):
    """The cloud has no capacity (or quota) for one offering right now. The launcher moves to the next candidate.

    `scope` says how far the shortage reaches: "zone" (this offering only; a stockout) or "region" (this instance
    type and capacity type in every zone of the region; a regional quota), so the launcher does not walk the
    other zones of a type that cannot launch anywhere in the region.
    """

    def __init__(self, message: str, category: str = "BackendError", scope: str | CapacityScope = CapacityScope.ZONE):
        super().__init__(message, category)
        self.scope = CapacityScope(scope)


class ListingError(BackendError):
    """No trustworthy listing of the cluster's machines: the backend failed before any listing succeeded. Raised to
    Ray (never answered as "no machines"), so `ray down` fails loudly and can be retried."""


class TransientBackendError(BackendError):
    """Throttling or a passing network fault: retry later, never treat as a launch result."""


class LaunchError(NodelessError):
    """A launch request could not be satisfied: every candidate failed for capacity, or an error that is not a
    capacity miss stopped it. `category` is what Ray's NodeLaunchException carries (v2 demotes the node type)."""

    def __init__(self, message: str, category: str):
        self.category = category
        super().__init__(message)


class NoticeFormatError(NodelessError):
    """An interruption notice (IMDS instance-action, GCE `preempted`, an EventBridge event) that does not parse.
    Never guessed at: a malformed notice is reported, not turned into a drain with an invented deadline."""


class MetadataError(NodelessError):
    """The instance metadata endpoint (EC2 IMDS, GCE metadata server) could not be read: unreachable, a token
    refused, an unexpected status. The watcher logs it and polls again."""


class DrainError(NodelessError):
    """A Ray node could not be drained: no node of the GCS node table matches the machine, GCS is unreachable, or
    GCS rejected the drain request."""


class ConfigErrors(ConfigError):
    """Several mistakes of one YAML found in one pass (unknown keys and missing required keys), so a user fixes
    them in one edit instead of one `plan` run each. `errors` holds each one, `key` is the first's. The first line
    is the first error; each further one follows on its own line."""

    def __init__(self, errors: "list[ConfigError]"):
        self.errors = list(errors)
        first = self.errors[0]
        more = "".join(f"\n  also {e}" for e in self.errors[1:])
        ValueError.__init__(self, f"{first}{more}")
        self.key = first.key

    @classmethod
    def of(cls, errors: "list[ConfigError]") -> "ConfigError":
        """One error as itself, several as a ConfigErrors."""
        return errors[0] if len(errors) == 1 else cls(errors)
