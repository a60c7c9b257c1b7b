"""What the EC2 backend answers when the launch layer doubts a listing: a second query, and why a machine went.

A DescribeInstances page can be short or empty while the instances run (eventual consistency, a glitching
endpoint or proxy). The view (launch/machine_view.py) believes a machine gone only after a second look, and a
fresh provider object (`ray down`, `ray-nodeless sweep`) checks its first listing the same way. Here that look is
a different query from the listing's (which filters by the cluster tag and the live states):

- by id (`instance-id` filter, every state): each id is live, gone (terminated, shutting down, stopped) or not
  shown at all; EC2 keeps a terminated instance listed for about an hour, so "not shown" is no proof of "gone";
- by the cluster tag alone, in every state (a fresh object's first listing has nothing to ask about by id); when
  that answer is empty too (two empty DescribeInstances pages in a row: `ray down` and `sweep` would say "nothing
  to end"), a third query of another API, `DescribeTags` (which instances carry the cluster tag), and a lookup of
  those by id. Instances it names that DescribeInstances shows nothing of (other than ones this object launched
  moments ago: the read lag) make the look fail
  (`TransientBackendError`, category ListingsDisagree): the view then refuses to answer rather than call the
  cluster empty. An empty answer is believed only when DescribeTags agrees.

Why a machine went is EC2's `StateReason` and the machine's own tags, never one object's memory: a
`nodeless-terminating` tag (set by any provider object or sweep of the cluster before it terminates) or a
`Client.*` reason (`Client.UserInitiatedShutdown`: a TerminateInstances call, from any object, a laptop's
`ray down --workers-only` included; `Client.InstanceInitiatedShutdown`: the machine shut itself down) is
"terminated"; a `Server.*` reason (`Server.SpotInstanceTermination`, `Server.SpotInstanceShutdown`: the spot
capacity was reclaimed; `Server.InternalError`, `Server.InsufficientInstanceCapacity`) is "interrupted", the
offering's fault; no reason is "" (the view then judges by the tags it saw).
"""
from __future__ import annotations

from typing import Any, Callable

from ray_nodeless.errors import TransientBackendError
from ray_nodeless.providers.aws.errors import CALL_ERRORS, api_error
from ray_nodeless.providers.aws.known import chunks, launch_time, tags_of
from ray_nodeless.providers.base import (
    MACHINE_PENDING, MACHINE_RUNNING, TAG_CLUSTER, TAG_TERMINATING, Machine, Recheck,
)

LIVE_STATES = ("pending", "running")
# Ids per DescribeInstances `instance-id` filter: stays under EC2's limit on values per filter.
FILTER_VALUES_CHUNK = 200


def machine_of(inst: dict[str, Any]) -> Machine:
    state = inst.get("State", {}).get("Name", "")
    return Machine(id=inst["InstanceId"], tags=tags_of(inst),
                   state=MACHINE_PENDING if state == "pending" else MACHINE_RUNNING,
                   internal_ip=inst.get("PrivateIpAddress"), external_ip=inst.get("PublicIpAddress"),
                   launched_at=launch_time(inst))


def reason_of(inst: dict[str, Any]) -> str:
    """Why an instance that is not live any more went: "terminated", "interrupted" or "" (see the docstring)."""
    if TAG_TERMINATING in tags_of(inst):
        return "terminated"
    code = str((inst.get("StateReason") or {}).get("Code", ""))
    if code.startswith("Client."):
        return "terminated"
    if code.startswith("Server."):
        return "interrupted"
    return ""


class AwsListing:
    """The second look and the reasons; mixed into AwsBackend (uses its `_describe` and `cluster_name`)."""

    cluster_name: str
    ec2: Any                                                                # the backend's EC2 client
    _known: Any                                                             # the backend's Known (known.py)
    _describe: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]     # the backend's paginated describe

    def _describe_typed(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return self._describe(filters)
        except CALL_ERRORS as e:
            raise api_error("DescribeInstances", e) from e

    def _by_id(self, machine_ids: list[str]) -> dict[str, dict[str, Any]]:
        """This cluster's instances among `machine_ids`, in any state EC2 still shows (foreign ones left out)."""
        out: dict[str, dict[str, Any]] = {}
        for chunk in chunks(sorted(set(machine_ids)), FILTER_VALUES_CHUNK):
            for inst in self._describe_typed([{"Name": "instance-id", "Values": chunk}]):
                if inst["InstanceId"] in chunk and tags_of(inst).get(TAG_CLUSTER) == self.cluster_name:
                    out[inst["InstanceId"]] = inst
        return out

    def _tagged_ids(self) -> list[str]:
        """Instances EC2's tag store says carry this cluster's tag (DescribeTags: not DescribeInstances)."""
        ids: set[str] = set()
        try:
            pages = self.ec2.get_paginator("describe_tags").paginate(Filters=[
                {"Name": "resource-type", "Values": ["instance"]}, {"Name": "key", "Values": [TAG_CLUSTER]},
                {"Name": "value", "Values": [self.cluster_name]}])
            for page in pages:
                ids |= {t["ResourceId"] for t in page.get("Tags", []) if t.get("Value") == self.cluster_name}
        except CALL_ERRORS as e:
            raise api_error("DescribeTags", e) from e
        return sorted(ids)

    def _confirm_empty(self) -> list[dict[str, Any]]:
        """Two DescribeInstances answers showed nothing of the cluster: what DescribeTags names, by id (see the
        module docstring). [] only when the tag store names nothing either (or only instances that are gone)."""
        tagged = self._tagged_ids()
        if not tagged:
            return []
        seen = self._by_id(tagged)
        # An instance this object launched moments ago is not shown by DescribeInstances yet (EC2's reads lag
        # RunInstances): that is the lag, not a disagreement (the view keeps it for the launch grace).
        unseen = [i for i in tagged if i not in seen and not self._known.young(i)]
        if unseen:
            raise TransientBackendError(
                f"DescribeInstances shows nothing of cluster {self.cluster_name!r}, but DescribeTags names "
                f"{len(unseen)} instance(s) carrying its tag ({', '.join(unseen[:10])}): not believed empty",
                category="ListingsDisagree")
        return list(seen.values())

    def recheck(self, machine_ids: list[str] | None) -> Recheck:
        if machine_ids is None:
            found = [i for i in self._describe_typed([{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_name]}])
                     if tags_of(i).get(TAG_CLUSTER) == self.cluster_name]
            if not found:
                found = self._confirm_empty()
            live = {i["InstanceId"]: i for i in found if i.get("State", {}).get("Name", "") in LIVE_STATES}
            return Recheck(live=[machine_of(live[i]) for i in sorted(live)])
        seen = self._by_id(machine_ids)
        out = Recheck()
        for mid in machine_ids:
            inst = seen.get(mid)
            if inst is None:
                continue                    # EC2 shows nothing of it: not told
            if inst.get("State", {}).get("Name", "") in LIVE_STATES:
                out.live.append(machine_of(inst))
            else:
                out.gone[mid] = reason_of(inst)
        return out

    def vanished_reasons(self, machine_ids: list[str]) -> dict[str, str]:
        """EC2's StateReason and tags of these instances (see the docstring); live or unseen ones left out."""
        return {mid: r for mid, r in self.recheck(list(machine_ids)).gone.items() if r}
