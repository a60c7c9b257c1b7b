"""EC2 error codes, and the one mapping from a failed botocore call to ray_nodeless's typed errors."""
from __future__ import annotations

import botocore.exceptions
import botocore.parsers

from ray_nodeless.errors import BackendError, CapacityError, TransientBackendError

# Account limits: regional, so the launcher skips the type in every zone of the region at once.
REGIONAL_LIMIT_CODES = frozenset({"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded"})
# "This offering has no capacity or quota right now": the launcher moves to the next candidate and remembers the
# failure for this (type, zone, capacity).
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientFreeAddressesInSubnet",
    "SpotMaxPriceTooLow",
    "UnfulfillableCapacity",
    "Unsupported",
    # A targeted capacity reservation with no room left for the count asked (capacity `reserved`).
    "ReservationCapacityExceeded",
    # Not an EC2 code: raised by subnets.py when the subnets at hand do not cover the planned zone.
    "NoSubnetInZone",
}) | REGIONAL_LIMIT_CODES
THROTTLE_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "SlowDown", "PriorRequestNotComplete",
})
SERVER_CODES = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "ServerInternal"})
DENIED_CODES = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "AuthFailure",
                          "OptInRequired", "Blocked"})
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
# RunInstances: the ClientToken was used before with other parameters.
IDEMPOTENT_MISMATCH = "IdempotentParameterMismatch"

# Transport-level failures: the request may or may not have reached EC2.
AMBIGUOUS_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,        # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ...
    botocore.exceptions.HTTPClientError,         # ConnectionClosedError, ...
    botocore.parsers.ResponseParserError,        # a 5xx HTML page from a proxy or load balancer
)
# Everything a botocore call raises on failure (the ones above, an error response, missing credentials, a
# parameter botocore refuses): what `api_error` turns into our types, so no raw SDK exception leaves the backend.
CALL_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, *AMBIGUOUS_EXCEPTIONS)


def error_code(exc: BaseException) -> str:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return ""
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


def error_message(exc: BaseException) -> str:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return str(exc)
    return str(exc.response.get("Error", {}).get("Message", ""))


def _http_status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _retryable(exc: botocore.exceptions.ClientError) -> bool:
    """Throttling or a server fault, not a capacity answer (AWS sends InsufficientInstanceCapacity as a 5xx)."""
    code = error_code(exc)
    return code not in CAPACITY_CODES and (code in THROTTLE_CODES or code in SERVER_CODES or _http_status(exc) >= 500)


def is_ambiguous(exc: BaseException) -> bool:
    """True if the request may have been executed although it failed (or was refused in a retryable way)."""
    if isinstance(exc, AMBIGUOUS_EXCEPTIONS):
        return True
    return isinstance(exc, botocore.exceptions.ClientError) and _retryable(exc)


def describe(exc: BaseException) -> str:
    """A short one-line account of a failed call, for log lines."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return f"{error_code(exc)}: {error_message(exc)}"
    return f"{type(exc).__name__}: {exc}"


def api_error(operation: str, exc: BaseException) -> BackendError:
    """Turn a botocore failure of `operation` into our error types. The message always names the EC2 action."""
    if isinstance(exc, AMBIGUOUS_EXCEPTIONS):
        return TransientBackendError(f"ec2:{operation} failed to reach EC2: {exc}", category=type(exc).__name__)
    if not isinstance(exc, botocore.exceptions.ClientError):
        return BackendError(f"ec2:{operation} failed: {exc}", category=type(exc).__name__)
    code, message = error_code(exc), error_message(exc)
    if code in CAPACITY_CODES:
        return CapacityError(f"ec2:{operation}: {code}: {message}", category=code,
                             scope="region" if code in REGIONAL_LIMIT_CODES else "zone")
    if _retryable(exc):
        return TransientBackendError(f"ec2:{operation} still failing after retries: {code}: {message}", category=code)
    if code in DENIED_CODES:
        # EC2's UnauthorizedOperation message does not say which action was refused (only an encoded blob), so
        # name it here: that is what the user must add to the head node's policy.
        return BackendError(
            f"not authorized to perform ec2:{operation} ({code}); grant it in the head node's IAM policy "
            f"(see cluster-configs/aws-iam-policy.json): {message}", category=code)
    return BackendError(f"ec2:{operation} failed: {code}: {message}", category=code)
