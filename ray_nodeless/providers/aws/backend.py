"""The EC2 machine backend: one RunInstances per launch, one paginated DescribeInstances per listing.

What this backend guarantees beyond what EC2 gives for free (see `ray_nodeless.providers.base` for the contract):

- Idempotency is enforced here, not only by EC2's ClientToken. RunInstances goes through a client with botocore
  retries switched off, and *our* loop re-issues it; after a failure that may have run (a lost answer, a 5xx) the
  settle step (`settle.py`) looks the launch up by its request tag (`DescribeInstances tag:nodeless-request=<token>`)
  until the whole set is listed or `aws_settle_wait_s` has passed, and sends again only when nothing of it shows by
  then: a short set is waited for, never terminated; a failing lookup never reads as "nothing". On AWS the
  ClientToken alone would dedupe a re-send; moto (and any endpoint or proxy that drops the token) would not, and
  botocore's own retry loop would silently create a second set of machines. The tag is set at creation through
  TagSpecifications, so it is listed as soon as the instance is.
- No instance ever exists without the cluster tag: every tag of `spec.tags` is in the RunInstances TagSpecifications
  for the instance and its volumes (`launch_params.py`).
- `terminate` and `set_tags` only touch instances that were seen carrying `ray-cluster-name=<cluster>` (in the last
  listing, a launch, or a describe by id of the ids it does not know, whose tags are checked here). That describe
  tells gone ids (terminated: ignored) from foreign ones (refused, `ForeignMachineError`) and from ids EC2 does
  not show at all (described again with backoff, then `TransientBackendError` NotYetVisible: never skipped, since a
  provider restarted within the listing lag would otherwise report a running machine as terminated).
- EC2 is eventually consistent: right after RunInstances, DescribeInstances may not show an instance and
  TerminateInstances / CreateTags may answer `InvalidInstanceID.NotFound`. For an instance launched within
  `ttls.LAUNCH_GRACE_S` none of that means "gone": it stays known across listings that miss it, and a NotFound is
  retried with backoff (`ttls.NOT_FOUND_RETRIES`), then reported as a `TransientBackendError` (category
  NotYetVisible) so the caller tries again later. Only an older instance's NotFound means it is gone.

Stopped instances: ray_nodeless never stops instances (spot ones are launched with interruption behaviour
`terminate`), so a stopped instance of this cluster was stopped by someone else. It is not a Ray node and is not
listed, but the listing asks for stopping/stopped too (same single call) and warns once per instance, because a
stopped instance keeps costing EBS money; `leftovers()` reports them, so `ray-nodeless sweep` terminates them.

Listing truth: `recheck` answers a second query for what a listing did not show (by id, or by the cluster tag
alone, in every state), and `vanished_reasons` reads EC2's `StateReason` of a terminated instance and its tags
(`listing.py`), so a machine another provider object ended is never read as a spot interruption.

The parts: `settings.py` (provider keys, node_config checks), `clients.py`, `errors.py`, `subnets.py`,
`launch_params.py`, `settle.py`, `listing.py`.
"""
from __future__ import annotations

import logging
import random
import re
import time
from typing import Any, Callable, Iterable, Mapping

from botocore.client import BaseClient

from ray_nodeless.core import ttls
from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import BackendError, ForeignMachineError, TransientBackendError
from ray_nodeless.providers.aws.clients import ec2_clients
from ray_nodeless.providers.aws.errors import (
    CALL_ERRORS, IDEMPOTENT_MISMATCH, NOT_FOUND_CODES, api_error, describe, error_code, error_message, is_ambiguous,
)
from ray_nodeless.providers.aws.known import Known, Sorted, chunks, launch_time, tags_of
from ray_nodeless.providers.aws.launch_params import TAG_REQUEST, instance_tags, run_instances_params
from ray_nodeless.providers.aws.config import AwsConfig
from ray_nodeless.providers.aws.listing import FILTER_VALUES_CHUNK, LIVE_STATES, AwsListing, machine_of
from ray_nodeless.providers.aws.reservations import list_reservations
from ray_nodeless.providers.aws.settle import Settle, Tokens, may_have_run
from ray_nodeless.providers.aws.settings import AwsSettings
from ray_nodeless.providers.aws.subnets import Subnets
from ray_nodeless.providers.base import (
    TAG_CLUSTER, TAG_RAY_NODE_KIND, LaunchSpec, Machine, MachineBackend, Recheck, Reservation, tag_update,
)

logger = logging.getLogger(__name__)

STOPPED_STATES = ("stopping", "stopped")
LISTED_STATES = LIVE_STATES + STOPPED_STATES
# The kind of a stopped instance in `leftovers()` (what `ray-nodeless sweep` shows and ends).
STOPPED_KIND = "stopped-instance"
# TerminateInstances accepts up to 1000 ids per call.
TERMINATE_CHUNK = 1000
# TerminateInstances calls per chunk while EC2 names ids that are gone (it fails the whole call for one): each
# pass drops the ids named, so a few passes cover ids vanishing during the call itself.
TERMINATE_PASSES = 3
# Longest wait between two RunInstances attempts: backoff must not hold an autoscaler update for long.
RUN_BACKOFF_CAP_S = 20.0

_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


class AwsBackend(AwsConfig, AwsListing, MachineBackend):
    """EC2 instances, one RunInstances per LaunchSpec. Provider keys and node_config checks: `AwsConfig`."""

    settings: AwsSettings

    def __init__(self, settings: AwsSettings, cluster_name: str):
        super().__init__(settings, cluster_name)
        self._clients = ec2_clients(self.settings)
        self.ec2: BaseClient = self._clients.ec2
        self.ec2_launch: BaseClient = self._clients.launch
        self._subnets = Subnets(self.ec2, self.settings.subnets)
        self._known = Known()
        self._tokens = Tokens()
        self._settle = Settle(self._instances_for_token, self._tokens, self.settings.aws_settle_wait_s,
                              self.settings.aws_retry_base_delay_s)
        self._warned_stopped: set[str] = set()

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock the launch grace is measured by (`ttls.LAUNCH_GRACE_S`); settable, for tests."""
        return self._known.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._known.clock = clock

    @property
    def clients(self) -> tuple[BaseClient, BaseClient]:
        """The botocore clients this backend calls through (for event hooks in tests and benchmarks)."""
        return (self.ec2, self.ec2_launch)

    @classmethod
    def bootstrap(cls, cluster_config: dict[str, Any], registration: str,
                  allowed_zones: Mapping[str, frozenset[str] | None]) -> bool:
        from ray_nodeless.providers.aws.bootstrap import bootstrap_aws_resources

        bootstrap_aws_resources(cluster_config, parse_section(AwsSettings, cluster_config["provider"], "provider"),
                                registration, allowed_zones)
        return True

    # ------------------------------------------------------------------ launch

    def launch(self, spec: LaunchSpec) -> list[str]:
        if spec.count <= 0:
            return []
        tags = instance_tags(spec, self.cluster_name)
        params = run_instances_params(spec, tags, self.settings.image_id, self._subnets.for_zone)
        token = spec.request_token
        off = spec.offering
        attempts = self.settings.aws_max_attempts
        logger.info("RunInstances %s x%d in %s (%s), token %s", off.instance_type.name, spec.count, off.zone,
                    off.capacity, token)
        # A token sent before by this object is a retry: what the earlier attempts made is settled first, and
        # nothing is sent unless they made nothing (settle.py; EC2's ClientToken is not relied on, moto ignores it).
        if self._tokens.sending(token) is not None:
            found = self._settle.outcome(token, spec.count)
            if found is not None:
                return self._keep(spec, found)
        last_exc: BaseException | None = None
        for attempt in range(1, attempts + 1):
            self._tokens.sent_now(token)
            try:
                resp = self.ec2_launch.run_instances(**params)
            except CALL_ERRORS as e:
                last_exc = e
                if may_have_run(e):
                    self._tokens.mark_may_have_run(token)
                if is_ambiguous(e) or error_code(e) == IDEMPOTENT_MISMATCH:
                    # A lost answer or a 5xx may have run (5xx: EC2 may have committed); throttling did not, but a
                    # cheap look costs nothing. IdempotentParameterMismatch: the token was used before with other
                    # parameters, and whatever it created is the result.
                    logger.warning("RunInstances %s in %s attempt %d/%d: %s", off.instance_type.name, off.zone,
                                   attempt, attempts, describe(e))
                    found = self._settle.outcome(token, spec.count)
                    if found is not None:
                        return self._keep(spec, found)
                    if error_code(e) != IDEMPOTENT_MISMATCH:
                        if attempt < attempts:
                            time.sleep(self._backoff(attempt))
                        continue
                raise api_error("RunInstances", e) from e
            ids = [i["InstanceId"] for i in resp.get("Instances", [])]
            if any(self._tokens.was_ended(i) for i in ids):
                # An endpoint replayed the first answer of this ClientToken, naming instances this backend has
                # terminated since: never returned. What is still live under the token is the result, if whole.
                found = self._settle.outcome(token, spec.count)
                if found is not None:
                    return self._keep(spec, found)
                raise BackendError(f"ec2:RunInstances answered token {token} with instances this backend terminated "
                                   f"({sorted(i for i in ids if self._tokens.was_ended(i))}); not returned",
                                   category="PartialLaunch")
            if len(ids) != spec.count:
                # MinCount == MaxCount makes EC2 all-or-nothing; anything else is a broken endpoint. Never leak, and
                # never returned later (the ids are remembered as ended; the error is not transient).
                self._terminate_ids(ids)
                raise BackendError(f"ec2:RunInstances returned {len(ids)} instances for MinCount=MaxCount="
                                   f"{spec.count}; terminated them", category="PartialLaunch")
            self._tokens.saw(token, len(ids))
            now = self.clock()
            for i in ids:
                self._known.add(i, tags, born=now)
            logger.info("launched %s (%s in %s, %s)", ",".join(ids), off.instance_type.name, off.zone, off.capacity)
            return ids
        assert last_exc is not None
        err = api_error("RunInstances", last_exc)
        if not isinstance(err, TransientBackendError):
            err = TransientBackendError(str(err), category=err.category)
        raise err from last_exc

    def _backoff(self, n: int) -> float:
        """Full-jitter exponential backoff for our RunInstances loop (n = retries so far, from 1)."""
        base = self.settings.aws_retry_base_delay_s
        if base <= 0:
            return 0.0
        return random.uniform(0.5, 1.0) * min(RUN_BACKOFF_CAP_S, base * (2 ** max(0, n - 1)))

    def _instances_for_token(self, token: str) -> list[dict[str, Any]]:
        """Live instances of this cluster created under `token` (any earlier attempt of this launch). Raises
        botocore's errors: the settle step decides what a failed lookup means."""
        filters = [
            {"Name": f"tag:{TAG_REQUEST}", "Values": [token]},
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        return [i for i in self._describe(filters) if tags_of(i).get(TAG_REQUEST) == token
                and tags_of(i).get(TAG_CLUSTER) == self.cluster_name]

    def _keep(self, spec: LaunchSpec, found: list[dict[str, Any]]) -> list[str]:
        """What the earlier attempts made, as this launch's result: the first spec.count by launch time and id
        (the same ones on every retry); only instances beyond them, which are never returned, are terminated."""
        found = sorted(found, key=lambda i: (launch_time(i), i["InstanceId"]))
        ids = [i["InstanceId"] for i in found][:spec.count]
        extra = [i["InstanceId"] for i in found][spec.count:]
        if extra:
            logger.warning("token %s has %d instances for count %d; terminating %s",
                           spec.request_token, len(found), spec.count, extra)
            self._terminate_ids(extra)
        for inst in found[:spec.count]:
            self._known.add(inst["InstanceId"], tags_of(inst), born=launch_time(inst) or self.clock())
        logger.info("launch token %s already ran: %s", spec.request_token, ",".join(ids))
        return ids

    # ------------------------------------------------------------------ list

    def reservations(self) -> list[Reservation]:
        return list_reservations(self.ec2)

    def _describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": self.settings.aws_describe_page_size})
        for page in pages:
            for r in page.get("Reservations", []):
                out.extend(r.get("Instances", []))
        return out

    def _describe_cluster(self, states: Iterable[str]) -> list[dict[str, Any]]:
        """This cluster's instances in `states` (tag and state filtered by EC2), errors typed."""
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_name]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
        try:
            return self._describe(filters)
        except CALL_ERRORS as e:
            raise api_error("DescribeInstances", e) from e

    def list_machines(self) -> list[Machine]:
        instances = self._describe_cluster(LISTED_STATES)
        machines: list[Machine] = []
        known: dict[str, dict[str, str]] = {}
        born: dict[str, float] = {}
        for inst in instances:
            tags = tags_of(inst)
            if tags.get(TAG_CLUSTER) != self.cluster_name:
                continue            # never trust a server-side filter with what terminate may touch
            iid = inst["InstanceId"]
            state = inst.get("State", {}).get("Name", "")
            known[iid] = tags
            born[iid] = launch_time(inst)
            if state not in LIVE_STATES:
                if iid not in self._warned_stopped:
                    self._warned_stopped.add(iid)
                    logger.warning("instance %s of cluster %s is %s (not by ray_nodeless); it is not a Ray node "
                                   "and still costs EBS storage: terminate it", iid, self.cluster_name, state)
                continue
            machines.append(machine_of(inst))
        self._known.replace(known, born)
        return machines

    def recheck(self, machine_ids: list[str] | None) -> Recheck:
        out = super().recheck(machine_ids)           # listing.py: by id, or by the cluster tag in every state
        for m in out.live:                           # seen carrying the cluster tag: terminate may touch them
            self._known.add(m.id, m.tags, born=m.launched_at or None)
        return out

    # ------------------------------------------------------------------ terminate / tags

    def _ours(self, ids: list[str], refresh: bool = False) -> list[str]:
        """The subset of `ids` that carries this cluster's tag and is not terminated (known, else one describe;
        with `refresh`, a describe of every id but the young ones, which a describe may not show yet)."""
        if refresh:
            self._known.discard([i for i in ids if not self._known.young(i)])
        return self._sort_out(ids).ours

    def _sort_out(self, ids: list[str], wait_unseen: bool = False) -> Sorted:
        """Sort `ids` by what EC2 says of them: ours (known, or described live with the cluster tag: stopped ones
        too), gone (terminated or shutting down), foreign (live without the cluster tag) and unseen (EC2 shows
        nothing: launched moments ago and not visible yet, or ended over an hour ago). The describe filters by id
        only and the tag is checked here, so a foreign id is told apart from a gone one. With `wait_unseen`, unseen
        ids are described again `ttls.NOT_FOUND_RETRIES` times with backoff before they are reported unseen."""
        out = Sorted(ours=[i for i in ids if self._known.has(i)])
        unknown = [i for i in ids if not self._known.has(i)]
        for attempt in range(ttls.NOT_FOUND_RETRIES + 1 if wait_unseen else 1):
            if attempt:
                time.sleep(self._backoff(attempt))
            seen: set[str] = set()
            for chunk in chunks(unknown, FILTER_VALUES_CHUNK):
                try:
                    found = self._describe([{"Name": "instance-id", "Values": chunk}])
                except CALL_ERRORS as e:
                    raise api_error("DescribeInstances", e) from e
                for inst in found:
                    iid = inst["InstanceId"]
                    if iid not in chunk or iid in seen:
                        continue
                    seen.add(iid)
                    tags = tags_of(inst)
                    if inst.get("State", {}).get("Name", "") not in LISTED_STATES:
                        out.gone.append(iid)
                    elif tags.get(TAG_CLUSTER) == self.cluster_name:
                        self._known.add(iid, tags, born=launch_time(inst) or None)
                        out.ours.append(iid)
                    else:
                        out.foreign.append(iid)
            unknown = [i for i in unknown if i not in seen]
            if not unknown:
                break
        out.unseen = unknown
        return out

    def terminate(self, machine_ids: list[str]) -> None:
        ids = list(dict.fromkeys(machine_ids))
        if not ids:
            return
        found = self._sort_out(ids, wait_unseen=True)
        if found.gone:
            logger.info("terminate: already gone %s", found.gone[:20])
        self._terminate_ids(found.ours)
        if found.unseen:
            # Not skipped as "gone": a provider restarted within EC2's listing lag must not report a running
            # machine as terminated. The caller terminates again once the listing shows it.
            raise TransientBackendError(
                f"terminate: EC2 does not show {found.unseen[:20]} (launched moments ago and not visible yet, or "
                f"ended over an hour ago); not touched, retry the terminate"
                + (f"; refused {found.foreign[:20]}, not tagged {TAG_CLUSTER}={self.cluster_name}"
                   if found.foreign else ""), category="NotYetVisible")
        if found.foreign:
            raise ForeignMachineError(f"terminate: {found.foreign[:20]} are not tagged {TAG_CLUSTER}="
                                      f"{self.cluster_name}; not touched", found.foreign)

    def _terminate_ids(self, ids: list[str]) -> None:
        self._tokens.ended(list(ids))      # never a launch's result again, whatever an endpoint replays
        unconfirmed: list[str] = []
        for chunk in chunks(list(ids), TERMINATE_CHUNK):
            young = self._terminate_chunk(chunk)
            unconfirmed += young
            self._known.discard([i for i in chunk if i not in young])
        if unconfirmed:
            # Not skipped as "already gone": the caller keeps them and terminates them again once EC2 shows them.
            raise TransientBackendError(
                f"ec2:TerminateInstances: just-launched instances {unconfirmed} are not visible to EC2 yet "
                f"(InvalidInstanceID.NotFound, eventual consistency); retry the terminate", category="NotYetVisible")

    def _terminate_chunk(self, chunk: list[str]) -> list[str]:
        """Terminate `chunk`; ids EC2 names as gone are dropped, unless launched within the launch grace: those
        are retried after a backoff (`ttls.NOT_FOUND_RETRIES`) and returned if EC2 still does not know them."""
        remaining, deferred = list(chunk), []
        passes = waits = 0
        while remaining and passes < TERMINATE_PASSES:
            try:
                self.ec2.terminate_instances(InstanceIds=remaining)
                logger.info("terminated %s", ",".join(remaining))
                break
            except CALL_ERRORS as e:
                if error_code(e) not in NOT_FOUND_CODES:
                    raise api_error("TerminateInstances", e) from e
                named = set(_INSTANCE_ID.findall(error_message(e))) & set(remaining)
                if not named:
                    # Message not parseable: ask which ones still exist (young ones count as existing) ...
                    named = set(remaining) - set(self._ours(remaining, refresh=True))
                    if not named:      # ... all of them, as far as a describe tells: the young ones are the suspects
                        named = {i for i in remaining if self._known.young(i)}
                    if not named:
                        raise api_error("TerminateInstances", e) from e
                young = {i for i in named if self._known.young(i)}
                if young:
                    waits += 1
                    if waits > ttls.NOT_FOUND_RETRIES:
                        deferred += sorted(young)
                        named -= young     # set aside: terminate the others now
                    else:
                        delay = self._backoff(waits)
                        logger.info("terminate: %s launched moments ago but EC2 does not know them yet; retrying "
                                    "in %.1f s", sorted(young), delay)
                        time.sleep(delay)
                        named -= young
                        passes -= 1        # a wait for a young instance is not a pass over gone ids
                if named:
                    logger.info("terminate: already gone %s", sorted(named))
                remaining = [i for i in remaining if i not in named and i not in deferred]
                passes += 1
        return deferred

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> bool:
        tags = tag_update(self.cluster_name, machine_id, tags)
        if not tags:
            return True
        if not self._known.has(machine_id):
            found = self._sort_out([machine_id], wait_unseen=True)
            if found.gone:
                logger.info("set_tags: %s is gone; not tagging", machine_id)
                return False
            if found.foreign:
                raise ForeignMachineError(f"set_tags: {machine_id} is not tagged {TAG_CLUSTER}={self.cluster_name}; "
                                          f"not tagging", [machine_id])
            if found.unseen:
                raise TransientBackendError(
                    f"set_tags: EC2 does not show {machine_id} (launched moments ago and not visible yet, or ended "
                    f"over an hour ago); retry", category="NotYetVisible")
        for attempt in range(ttls.NOT_FOUND_RETRIES + 1):
            try:
                self.ec2.create_tags(Resources=[machine_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
                break
            except CALL_ERRORS as e:
                if error_code(e) not in NOT_FOUND_CODES:
                    raise api_error("CreateTags", e) from e
                if not self._known.young(machine_id):
                    self._known.discard([machine_id])
                    logger.info("set_tags: %s is gone; not tagging", machine_id)
                    return False
                if attempt == ttls.NOT_FOUND_RETRIES:
                    # Launched moments ago and still unknown to EC2: not gone; the caller writes the tags again.
                    raise TransientBackendError(
                        f"ec2:CreateTags: {machine_id} was just launched and is not visible to EC2 yet "
                        f"(InvalidInstanceID.NotFound, eventual consistency)", category="NotYetVisible") from e
                time.sleep(self._backoff(attempt + 1))
        self._known.merge_tags(machine_id, tags)
        return True

    # ------------------------------------------------------------------ sweep

    def leftovers(self) -> list[dict[str, str]]:
        """Stopping and stopped instances tagged with this cluster: not Ray nodes (not listed), but they keep
        costing EBS storage, so `ray-nodeless sweep` ends them. Listed afresh, by one filtered describe."""
        instances = self._describe_cluster(STOPPED_STATES)
        out = []
        for inst in sorted(instances, key=lambda i: i["InstanceId"]):
            tags = tags_of(inst)
            state = inst.get("State", {}).get("Name", "")
            if tags.get(TAG_CLUSTER) == self.cluster_name and state in STOPPED_STATES:
                out.append({"kind": STOPPED_KIND, "name": inst["InstanceId"], "machine_id": inst["InstanceId"],
                            "node_kind": tags.get(TAG_RAY_NODE_KIND, ""), "state": state})
        return out

    def end_leftovers(self, leftovers: list[dict[str, str]]) -> None:
        """Terminate the stopped instances among `leftovers` (their tags are checked again by `terminate`)."""
        ids = [d["name"] for d in leftovers if d.get("kind") == STOPPED_KIND]
        if ids:
            self.terminate(ids)

    def close(self) -> None:
        self._clients.close()
