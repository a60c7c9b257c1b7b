"""The AWS backend's settle step: what a RunInstances made when its answer was not seen.

A RunInstances whose answer is lost (a read timeout, a dropped connection) or is a server error (5xx) may have
created its instances. Before the backend sends that launch again, or gives it up, it must know what the first
attempt made, on EC2 and on an endpoint that does not honour ClientToken (moto, some emulators and proxies): a
re-send there creates a second set. What it can see is a lookup by the request tag (`nodeless-request=<token>`,
set at creation through TagSpecifications), which EC2 answers eventually consistently: new instances appear in
DescribeInstances one by one, seconds after they were made. So:

- **Never re-sent without knowing.** After an answer that may have run, the launch is looked up by its tag until
  the whole set is there or `aws_settle_wait_s` has passed since it was sent. A launch is sent again only when a
  lookup that succeeded at least that long after the send still shows nothing of it. A failing lookup is never
  read as "nothing": the launch is reported as transient and not sent.
- **Never a machine it may return terminated.** A short set (some of the new instances listed, not all yet) is not
  a broken endpoint: MinCount == MaxCount makes RunInstances all-or-nothing, so the rest exist. It is waited for;
  if the window ends first, the launch raises `TransientBackendError` (category `PartialLookup`) and terminates
  nothing; the launcher's retry with the same token looks again, and never sends again once anything was seen.
- **Never returns one it terminated.** Ids this backend terminated are remembered (bounded) and never part of a
  launch's result: a lookup skips them, and an answer that names one (an endpoint replaying a ClientToken's first
  answer) is not returned.
- More instances than asked (an endpoint that ignored ClientToken on an earlier re-send): the first `count` by
  launch time and id are the result, always the same ones, and only the others are terminated.

A throttled RunInstances (RequestLimitExceeded and the like) was refused before it ran: one lookup, no wait.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import botocore.exceptions

from ray_nodeless.core import ttls
from ray_nodeless.errors import TransientBackendError
from ray_nodeless.providers.aws.errors import (
    AMBIGUOUS_EXCEPTIONS, CALL_ERRORS, THROTTLE_CODES, describe, error_code, is_ambiguous,
)

# The wait between two lookups of a launch by its tag: backs off from the backend's retry base delay, never
# shorter than this (a base delay of 0 in tests must not spin) nor longer (new instances appear within seconds).
SETTLE_POLL_MIN_S = 0.05
SETTLE_POLL_MAX_S = 2.0
# A throttling code that says an earlier request with the same token is still running: it may have run.
STILL_RUNNING_CODES = frozenset({"PriorRequestNotComplete"})


def may_have_run(exc: BaseException) -> bool:
    """True if a failed RunInstances may have created instances: no answer was read (transport failure), or EC2
    answered with a server fault (5xx, which AWS documents as possibly committed). A throttling answer or a client
    error means EC2 refused the request before it ran."""
    if isinstance(exc, AMBIGUOUS_EXCEPTIONS):
        return True
    if not is_ambiguous(exc):
        return False
    return error_code(exc) not in THROTTLE_CODES or error_code(exc) in STILL_RUNNING_CODES


@dataclass
class TokenState:
    """What this backend knows of one launch token."""

    sent_at: float = 0.0            # monotonic time of the last RunInstances sent with it
    may_have_run: bool = False      # an attempt's answer was lost or a 5xx: instances may exist
    seen: int = 0                   # the most instances a lookup ever found under it (0: none yet)


class Tokens:
    """Launch tokens this backend has sent, and ids it terminated; both bounded like the view's memory of vanished
    machines (oldest forgotten first). Shared by the launch threads of one backend object."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._tokens: OrderedDict[str, TokenState] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()

    def sending(self, token: str) -> TokenState | None:
        """Record that a launch with `token` is being sent; the earlier state if one was sent before (a retry)."""
        with self._lock:
            prior = self._tokens.get(token)
            if prior is None:
                self._tokens[token] = TokenState(sent_at=self.clock())
                self._trim(self._tokens)
            return None if prior is None else TokenState(prior.sent_at, prior.may_have_run, prior.seen)

    def sent_now(self, token: str) -> None:
        """A RunInstances with `token` leaves now: "nothing was made" is judged from this send on."""
        with self._lock:
            self._tokens.setdefault(token, TokenState()).sent_at = self.clock()

    def state(self, token: str) -> TokenState:
        with self._lock:
            s = self._tokens.setdefault(token, TokenState(sent_at=self.clock()))
            return TokenState(s.sent_at, s.may_have_run, s.seen)

    def mark_may_have_run(self, token: str) -> None:
        with self._lock:
            self._tokens.setdefault(token, TokenState(sent_at=self.clock())).may_have_run = True

    def saw(self, token: str, n: int) -> None:
        with self._lock:
            s = self._tokens.setdefault(token, TokenState(sent_at=self.clock()))
            s.seen = max(s.seen, n)

    def ended(self, ids: list[str]) -> None:
        """These ids were terminated (or are being terminated) by this backend: never a launch's result."""
        with self._lock:
            for i in ids:
                self._ended[i] = None
                self._ended.move_to_end(i)
            self._trim(self._ended)

    def was_ended(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._ended

    @staticmethod
    def _trim(d: OrderedDict) -> None:
        while len(d) > ttls.LAST_KNOWN_LIMIT:
            d.popitem(last=False)


class Settle:
    """Looks a launch up by its request tag and says what it made (see the module docstring)."""

    def __init__(self, lookup: Callable[[str], list[dict[str, Any]]], tokens: Tokens, wait_s: float,
                 base_delay_s: float, sleep: Callable[[float], None] = time.sleep):
        self.lookup = lookup            # token -> live instances of this cluster tagged with it (raises botocore)
        self.tokens = tokens
        self.wait_s = wait_s
        self.base_delay_s = base_delay_s
        self.sleep = sleep

    def _poll_delay(self, n: int) -> float:
        return min(SETTLE_POLL_MAX_S, max(SETTLE_POLL_MIN_S, self.base_delay_s * (2 ** n)))

    def _look(self, token: str) -> list[dict[str, Any]]:
        found = [i for i in self.lookup(token) if not self.tokens.was_ended(i["InstanceId"])]
        if found:
            self.tokens.saw(token, len(found))
        return found

    def outcome(self, token: str, count: int) -> list[dict[str, Any]] | None:
        """The instances the earlier attempts under `token` made (at least `count`: the caller keeps `count`), or
        None when they made nothing and the launch may be sent. Raises TransientBackendError when that cannot be
        told: a short set past the wait, lookups failing, or something seen before and nothing now."""
        state = self.tokens.state(token)
        if not state.may_have_run:
            # Only refused answers so far (throttling): nothing ran, unless an earlier object's attempt did.
            found = self._checked_look(token)
            if len(found) >= count:
                return found
            if found or state.seen:
                return self._wait(token, count, state)
            return None
        return self._wait(token, count, state)

    def _checked_look(self, token: str) -> list[dict[str, Any]]:
        try:
            return self._look(token)
        except CALL_ERRORS as e:
            # If we cannot tell whether the launch happened we must not launch again: report a transient failure.
            # Anything it did create carries the cluster tag and shows up in the next listing.
            raise TransientBackendError(
                f"cannot check launch token {token} after an ambiguous RunInstances failure: {describe(e)}",
                category="DescribeInstances") from e

    def _wait(self, token: str, count: int, state: TokenState) -> list[dict[str, Any]] | None:
        clock = self.tokens.clock
        start = clock()
        # "Nothing was made" needs a lookup at least wait_s after the send; each call also waits up to wait_s for
        # a short set to fill up.
        end = max(state.sent_at + self.wait_s, start + (self.wait_s if state.seen or state.may_have_run else 0.0))
        found: list[dict[str, Any]] = []
        looked_ok_at: float | None = None
        last_error: BaseException | None = None
        n = 0
        while True:
            try:
                found = self._look(token)
                looked_ok_at = clock()
                last_error = None
            except CALL_ERRORS as e:
                last_error = e
                if not is_ambiguous(e) and not isinstance(e, botocore.exceptions.BotoCoreError):
                    break                   # denied, bad request: asking again will not tell
            if len(found) >= count:
                return found
            now = clock()
            if now >= end:
                break
            self.sleep(min(self._poll_delay(n), max(0.0, end - now)))
            n += 1
        seen = self.tokens.state(token).seen
        if last_error is not None and (looked_ok_at is None or found or seen):
            raise TransientBackendError(
                f"cannot check launch token {token} after an ambiguous RunInstances failure: {describe(last_error)}",
                category="DescribeInstances") from last_error
        if found or seen:
            raise TransientBackendError(
                f"launch token {token}: EC2 lists {len(found)} of the {count} instances it made so far (new "
                f"instances are listed eventually); nothing terminated and nothing sent again: retry the launch",
                category="PartialLookup")
        if looked_ok_at is None or looked_ok_at < state.sent_at + self.wait_s:
            raise TransientBackendError(
                f"cannot tell yet whether launch token {token} made instances; not sent again", category="Unsettled")
        return None
