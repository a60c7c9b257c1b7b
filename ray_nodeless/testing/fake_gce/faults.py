"""Fault injection: capacity errors in the insert operation, quota 403, throttling (429, or 403 with reason
rateLimitExceeded), "ambiguous" 5xx answered after the work was done, any method failing with any status, a list
answered empty."""
from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class Fault:
    """An injected failure; `times` counts down to 0 (None = forever)."""

    kind: str                          # "insert-op" | "http"
    methods: tuple[str, ...]
    times: int | None
    zone: str | None = None
    machine_type: str | None = None
    status: int = 503
    code: str = ""
    message: str = ""
    reason: str = ""
    domain: str = "global"
    after: bool = False                # ambiguous: perform the call, then answer the error
    leave_instance: bool = False       # insert-op: the failed instance stays behind (as GCE sometimes shows)
    skip: int = 0                      # let this many matching calls through first (fail the Nth instance)
    spot: bool | None = None           # insert only: fail spot (True) or standard (False) instances; None: both

    def matches(self, method: str, zone: str | None, machine_type: str | None, spot: bool | None = None) -> bool:
        if method not in self.methods or self.times == 0:
            return False
        if self.zone is not None and zone != self.zone:
            return False
        if self.machine_type is not None and machine_type != self.machine_type:
            return False
        if self.spot is not None and spot is not None and spot != self.spot:
            return False
        return True

    def consume(self) -> bool:
        """Account for one matching call; False while the fault is still skipping calls."""
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is not None:
            self.times -= 1
        return True


class FaultInjection:
    """The fault-injection half of FakeGce (a mixin: `faults`, `lock` and `project` live on the server)."""

    project: str
    faults: list[Fault]
    lock: threading.RLock

    def fail_insert(self, zone: str | None = None, machine_type: str | None = None,
                    code: str = "ZONE_RESOURCE_POOL_EXHAUSTED", times: int | None = 1, message: str | None = None,
                    http_status: int = 503, leave_instance: bool = False, skip: int = 0,
                    spot: bool | None = None) -> Fault:
        """The insert is accepted, but its operation ends DONE with `error.errors[0].code = code` (only for spot
        instances if `spot` is True, only for standard ones if False)."""
        msg = message or (f"The zone 'projects/{self.project}/zones/{zone or 'ZONE'}' does not have enough "
                          f"resources available to fulfill the request. Try a different zone, or try again later.")
        f = Fault("insert-op", ("instances.insert",), times, zone=zone, machine_type=machine_type, code=code,
                  message=msg, status=http_status, leave_instance=leave_instance, skip=skip, spot=spot)
        self.faults.append(f)
        return f

    def quota_error(self, machine_type: str | None = None, zone: str | None = None,
                    quota: str = "NVIDIA_T4_GPUS", times: int | None = None, region: str = "us-central1") -> Fault:
        """instances.insert answers HTTP 403 "Quota '<quota>' exceeded", reason quotaExceeded."""
        f = Fault("http", ("instances.insert",), times, zone=zone, machine_type=machine_type, status=403,
                  message=f"Quota '{quota}' exceeded.  Limit: 0.0 in region {region}.", reason="quotaExceeded",
                  domain="usageLimits")
        self.faults.append(f)
        return f

    def rate_limit(self, method: str = "instances.insert", times: int | None = 1, status: int = 429) -> Fault:
        """Answer `status` (429, or 403 as GCE sometimes does) with reason rateLimitExceeded, doing nothing."""
        f = Fault("http", (method,), times, status=status, message="Rate Limit Exceeded",
                  reason="rateLimitExceeded", domain="usageLimits")
        self.faults.append(f)
        return f

    def ambiguous(self, method: str = "instances.insert", times: int | None = 1, status: int = 503) -> Fault:
        """Perform the call (create the instance), then answer `status` as if the reply was lost."""
        f = Fault("http", (method,), times, status=status, message="Backend Error", reason="backendError",
                  after=True)
        self.faults.append(f)
        return f

    def fail_method(self, method: str, status: int = 500, times: int | None = 1, message: str = "Internal Error",
                    reason: str = "backendError") -> Fault:
        f = Fault("http", (method,), times, status=status, message=message, reason=reason)
        self.faults.append(f)
        return f

    def empty_list(self, method: str = "instances.aggregatedList", times: int | None = 1) -> Fault:
        """Answer a list with no items at all (an eventually consistent or glitched page), doing nothing."""
        f = Fault("empty", (method,), times)
        self.faults.append(f)
        return f

    def _take_fault(self, method: str, zone: str | None, machine_type: str | None, kind: str,
                    spot: bool | None = None) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.kind == kind and f.matches(method, zone, machine_type, spot) and f.consume():
                    return f
        return None
