"""Compute Engine errors, in one place: what GCE answers (an HTTP error, or a DONE operation that carries an error)
mapped to what the backend does next, and to our typed exceptions (`CapacityError`, `TransientBackendError`,
`BackendError`; never a raw google.api_core exception).

GCE reports one shortage in several shapes: an error code in a failed insert operation
(`ZONE_RESOURCE_POOL_EXHAUSTED`), the same code inside an HTTP error's text, only the stockout sentence with an
unhelpful code, or an HTTP 403 with reason `quotaExceeded` / the text "Quota '...' exceeded". Throttling comes as 429,
or as 403 with reason `rateLimitExceeded`. So the code is checked first, then reasons and statuses, then the text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from ray_nodeless.errors import BackendError, CapacityError, CapacityScope, TransientBackendError

# Cloud error codes that mean "no capacity / quota for this offering right now": the launcher moves on.
CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT",
                  "QUOTA_EXCEEDED")
QUOTA_CODE = "QUOTA_EXCEEDED"
_STOCKOUT_PHRASES = ("does not have enough resources available", "resource pool exhausted")
# A specific reservation that is full, or holds another machine type (CONDITION_NOT_MET in the insert operation):
# capacity of that (type, zone, reserved) offering only; the launcher walks on to the rule's next capacity type.
RESERVATION_CODE = "RESERVATION_CAPACITY_EXCEEDED"
_RESERVATION_PHRASES = ("does not have available resources for the request",
                        "No available resources in specified reservations")
_QUOTA_RE = re.compile(r"Quota '[^']*' exceeded", re.IGNORECASE)
_RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
# 5xx GCE documents as worth retrying with backoff; 501 (not implemented) never gets better.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

# What the backend does next about an error.
Kind = Literal["capacity", "retry", "notfound", "conflict", "precondition", "timeout", "fatal"]


@dataclass(frozen=True)
class Classified:
    kind: Kind
    category: str      # the cloud's code or reason, carried by the typed exception (and Ray's NodeLaunchException)
    message: str


def _error_reasons(exc: Any) -> list[str]:
    reasons: list[str] = []
    for e in getattr(exc, "errors", None) or []:
        if isinstance(e, dict):
            reasons.append(str(e.get("reason", "")))
        else:
            reasons.append(str(getattr(e, "reason", "")))
    r = getattr(exc, "reason", None)
    if r:
        reasons.append(str(r))
    return reasons


def classify_http_error(exc: BaseException) -> Classified:
    """Map a google.api_core exception (or a transport failure) to what the backend does next."""
    from google.api_core import exceptions as gexc

    text = str(exc)
    if not isinstance(exc, gexc.GoogleAPICallError):
        # connection reset, DNS, a read timeout: the request may never have reached GCE
        return Classified("retry", type(exc).__name__, text)
    status = exc.code if isinstance(exc.code, int) else 0
    reasons = _error_reasons(exc)
    for code in CAPACITY_CODES:
        if code in text:
            return Classified("capacity", code, text)
    if status == 429 or any(r in _RATE_REASONS for r in reasons):
        return Classified("retry", "rateLimitExceeded", text)
    if "quotaExceeded" in reasons or _QUOTA_RE.search(text):
        return Classified("capacity", QUOTA_CODE, text)
    if any(p in text for p in _STOCKOUT_PHRASES):
        return Classified("capacity", "STOCKOUT", text)
    if status == 404:
        return Classified("notfound", "notFound", text)
    if status == 409:
        return Classified("conflict", "alreadyExists", text)
    if status == 412:
        return Classified("precondition", "conditionNotMet", text)
    if status in _RETRY_STATUSES:
        return Classified("retry", f"HTTP{status}", text)
    return Classified("fatal", reasons[0] if reasons and reasons[0] else f"HTTP{status}", text)


def is_retryable(exc: BaseException) -> bool:
    """The predicate of every retried call: throttling, 5xx and transport failures."""
    return classify_http_error(exc).kind == "retry"


def classify_operation_error(op: Any) -> Classified | None:
    """The error a DONE operation carries, classified; None if it succeeded."""
    errs = list(op.error.errors) if op.error and op.error.errors else []
    if not errs:
        return None
    code = errs[0].code or "UNKNOWN"
    msg = "; ".join(f"{e.code}: {e.message}" for e in errs)
    for c in CAPACITY_CODES:
        if any(e.code == c for e in errs):
            return Classified("capacity", c, msg)
    if any(p in msg for p in _STOCKOUT_PHRASES):
        return Classified("capacity", "STOCKOUT", msg)
    if any(p in msg for p in _RESERVATION_PHRASES):
        return Classified("capacity", RESERVATION_CODE, msg)
    if _QUOTA_RE.search(msg):
        return Classified("capacity", QUOTA_CODE, msg)
    if code == "RESOURCE_NOT_FOUND":
        return Classified("notfound", code, msg)
    if code == "RATE_LIMIT_EXCEEDED":
        return Classified("retry", code, msg)
    return Classified("fatal", code, msg)


def backend_error(c: Classified, what: str) -> BackendError:
    """The typed exception for a classified error (the caller raises it)."""
    if c.kind == "capacity":
        # Quotas are regional: no other zone of the region can launch this type either.
        scope = CapacityScope.REGION if c.category == QUOTA_CODE else CapacityScope.ZONE
        return CapacityError(f"{what}: {c.message}", category=c.category, scope=scope)
    if c.kind == "retry":
        return TransientBackendError(f"{what}: {c.message}", category=c.category)
    return BackendError(f"{what}: {c.message}", category=c.category)
