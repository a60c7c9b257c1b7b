"""Waiting for zone operations: every mutation (insert, delete, setLabels, setMetadata) returns one.

The backend issues all the mutations of a launch or a terminate first and then waits for their operations, which
run concurrently on GCE's side, within one shared deadline. Each operation is polled with `operations.wait` (which
blocks server-side until the operation is done or about two minutes have passed) under a google.api_core `Retry`
whose predicate is "not done yet, or throttled / 5xx"; its timeout is what is left of the shared deadline.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ray_nodeless.providers.gcp.errors import Classified, classify_http_error, classify_operation_error, is_retryable
from ray_nodeless.providers.gcp.retries import RETRY_MULTIPLIER

# GCE's operations.wait answers after at most about 2 minutes even if the operation is still running; a few
# seconds more so our client never cuts a healthy wait short.
WAIT_CALL_MAX_S = 130.0
# Shortest client timeout of one wait call: a sub-second HTTP timeout fails on connection setup alone.
WAIT_CALL_MIN_S = 1.0
# First pause between two polls (then doubling up to `poll_interval_s`): a server that answers `wait` at once
# with RUNNING is asked again soon, without spinning.
POLL_INITIAL_S = 0.1


@dataclass
class PendingOp:
    """An issued zone operation still to be waited for."""

    name: str                # what the result is reported under (the instance name)
    zone: str
    operation: Any           # compute_v1.Operation


class _NotDone(Exception):
    """The operation is still running: poll again."""


def wait_all(zone_operations: Any, project: str, ops: list[PendingOp], what: str, timeout_s: float,
             poll_interval_s: float) -> dict[str, Classified | None]:
    """Wait for every operation within one shared deadline of `timeout_s`.

    Returns name -> classified error (None = success). An operation that does not finish in time is reported as a
    `timeout` error naming the operation.
    """
    deadline = time.monotonic() + timeout_s
    return {p.name: _wait_one(zone_operations, project, p, what, deadline, timeout_s, poll_interval_s)
            for p in ops}


def _wait_one(zone_operations: Any, project: str, p: PendingOp, what: str, deadline: float, timeout_s: float,
              poll_interval_s: float) -> Classified | None:
    from google.api_core import exceptions as gexc
    from google.api_core.retry import Retry
    from google.cloud import compute_v1

    done = compute_v1.Operation.Status.DONE
    op = p.operation
    if op.status == done:
        return classify_operation_error(op)

    def poll() -> Any:
        left = deadline - time.monotonic()
        current = zone_operations.wait(project=project, zone=p.zone, operation=op.name, retry=None,
                                       timeout=max(WAIT_CALL_MIN_S, min(left, WAIT_CALL_MAX_S)))
        if current.status != done:
            raise _NotDone(op.name)
        return current

    timed_out = Classified("timeout", "OperationTimeout",
                           f"operation {op.name} ({what} {p.name} in {p.zone}) did not finish within {timeout_s:g}s")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return timed_out
    retry = Retry(predicate=lambda e: isinstance(e, _NotDone) or is_retryable(e), initial=POLL_INITIAL_S,
                  maximum=poll_interval_s, multiplier=RETRY_MULTIPLIER, timeout=remaining)
    try:
        return classify_operation_error(retry(poll)())
    except gexc.RetryError:
        return timed_out
    except Exception as e:  # noqa: BLE001 - a non-retryable API error, classified
        return classify_http_error(e)
