"""The smoke test's cloud-side checks, from the cluster YAML's provider block (same credentials and endpoint as the
provider): `cluster-name`, `describe INSTANCE_ID` (instance type, zone, capacity tags of one machine) and
`leftovers` (every instance tagged with the cluster that is not terminated; exit 1 if there is any)."""
from __future__ import annotations

import json
import sys
from typing import Any

import yaml


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def aws_instances(cfg: dict[str, Any], **filters: list[str]) -> list[dict[str, Any]]:
    from ray_nodeless.providers.aws.clients import session

    p = cfg["provider"]
    s = session(p.get("aws_credentials"))
    kw = {"region_name": p["region"]}
    if p.get("endpoint_url"):
        kw["endpoint_url"] = p["endpoint_url"]
    ec2 = s.client("ec2", **kw)
    f = [{"Name": k, "Values": v} for k, v in filters.items()]
    out = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=f):
        for r in page["Reservations"]:
            out.extend(r["Instances"])
    return out


def gcp_instances(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every instance of the project carrying the cluster's label, whatever its status."""
    from google.cloud import compute_v1

    from ray_nodeless.providers.gcp.clients import compute_client_kwargs
    from ray_nodeless.providers.gcp.labels import cluster_label_value

    p = cfg["provider"]
    client = compute_v1.InstancesClient(**compute_client_kwargs(p.get("api_endpoint"), p.get("credentials")))
    label = cluster_label_value(cfg["cluster_name"])
    out = []
    req = compute_v1.AggregatedListInstancesRequest(project=p["project_id"])
    for _zone, scoped in client.aggregated_list(request=req):
        for inst in scoped.instances:
            if any(v == label for k, v in inst.labels.items() if k.startswith("ray-cluster-name")):
                out.append({"id": inst.name, "status": inst.status, "zone": inst.zone.rsplit("/", 1)[-1],
                            "type": inst.machine_type.rsplit("/", 1)[-1], "labels": dict(inst.labels)})
    return out


def main(argv: list[str]) -> int:
    what, path = argv[0], argv[1]
    cfg = load(path)
    cloud = cfg["provider"].get("cloud", "local")
    cluster = cfg["cluster_name"]
    if what == "cluster-name":
        print(cluster)
        return 0
    if what == "describe":
        iid = argv[2]
        if cloud == "aws":
            [inst] = aws_instances(cfg, **{"instance-id": [iid]})
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
            rec = {"instance_type": inst["InstanceType"], "zone": inst["Placement"]["AvailabilityZone"],
                   "capacity": tags.get("nodeless-capacity"), "price": tags.get("nodeless-hourly-price")}
        else:
            [inst] = [i for i in gcp_instances(cfg) if i["id"] == iid]
            rec = {"instance_type": inst["type"], "zone": inst["zone"],
                   "capacity": inst["labels"].get("nodeless-capacity")}
        print(json.dumps(rec))
        return 0
    if what == "leftovers":
        if cloud == "aws":
            left = [(i["InstanceId"], i["State"]["Name"], i["InstanceType"])
                    for i in aws_instances(cfg, **{"tag:ray-cluster-name": [cluster]})
                    if i["State"]["Name"] not in ("terminated", "shutting-down")]
        else:
            # a stopped (TERMINATED) GCE instance still exists and keeps its disks: it counts
            left = [(i["id"], i["status"], i["type"]) for i in gcp_instances(cfg)]
        for iid, state, itype in left:
            print(f"LEFT {iid} {state} {itype}")
        print(f"leftovers: {len(left)} instance(s) tagged ray-cluster-name={cluster}")
        return 1 if left else 0
    print(f"unknown check {what!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
