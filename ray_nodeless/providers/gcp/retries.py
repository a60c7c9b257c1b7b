"""How every Compute API call is made: google.api_core's `Retry` on throttling, 5xx and transport failures, with
full-jitter exponential backoff, at most `max_attempts` attempts, all within `call_timeout_s`.

Idempotency: each call is given a request built once (a mutating one carries its `requestId`), and the client's
retry re-sends that same request, so every retry of an insert or delete carries the same requestId and GCE answers
a repeat with the original operation instead of acting twice.

`Retry` bounds a call by time only. The attempt bound is its `on_error` hook, which runs before each retry and may
raise: after `max_attempts` retryable failures it raises `TransientBackendError`, which ends the call.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from ray_nodeless.errors import TransientBackendError
from ray_nodeless.providers.gcp.errors import classify_http_error, is_retryable
from ray_nodeless.providers.gcp.settings import GcpSettings

logger = logging.getLogger(__name__)

# Each retry pause is up to twice the previous one (truncated exponential backoff, as GCE documents).
RETRY_MULTIPLIER = 2.0


class _AttemptBudget:
    """`on_error` of one call's Retry: counts retryable failures and ends the call after `max_attempts`."""

    def __init__(self, what: str, max_attempts: int):
        self.what = what
        self.max_attempts = max_attempts
        self.failures = 0

    def __call__(self, exc: Exception) -> None:
        self.failures += 1
        c = classify_http_error(exc)
        if self.failures >= self.max_attempts:
            raise TransientBackendError(
                f"{self.what}: still failing after {self.max_attempts} attempts: {c.message}",
                category=c.category) from exc
        logger.info("%s: %s (attempt %d/%d), retrying", self.what, c.category, self.failures, self.max_attempts)


class CallPolicy:
    """Retries and deadlines of the backend's API calls, from the provider block."""

    def __init__(self, settings: GcpSettings):
        self.settings = settings

    def retry(self, what: str) -> Any:
        """A fresh `google.api_core.retry.Retry` for one logical call (the attempt count is per call)."""
        from google.api_core.retry import Retry

        s = self.settings
        return Retry(predicate=is_retryable, initial=s.retry_base_s, maximum=s.retry_max_s,
                     multiplier=RETRY_MULTIPLIER, timeout=s.call_timeout_s,
                     on_error=_AttemptBudget(what, s.max_attempts))

    def call(self, what: str, method: Callable[..., Any], **kwargs: Any) -> Any:
        """`method(**kwargs)` with this policy's retry and deadline. Non-retryable errors come out as the
        google.api_core exception (the caller classifies them); retries running out as TransientBackendError."""
        from google.api_core import exceptions as gexc

        try:
            return method(retry=self.retry(what), timeout=self.settings.call_timeout_s, **kwargs)
        except gexc.RetryError as e:      # the deadline passed before the attempts ran out
            c = classify_http_error(e.cause) if e.cause is not None else None
            raise TransientBackendError(
                f"{what}: no success within {self.settings.call_timeout_s:g}s: {c.message if c else e}",
                category=c.category if c else "RetryError") from e
