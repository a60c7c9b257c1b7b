"""The smoke test's GPU task, run on the head by `ray exec`: one task that needs {GPU: 1}; prints the node it ran on
(its cloud instance id, and its instance type from the instance metadata service when there is one)."""
import json
import os
import sys
import urllib.request

import ray


def instance_type() -> str:
    """EC2 (IMDSv2) or GCE metadata; "" elsewhere (a machine played locally in the test suite)."""
    try:
        token = urllib.request.urlopen(urllib.request.Request(
            "http://169.254.169.254/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=1).read().decode()
        return urllib.request.urlopen(urllib.request.Request(
            "http://169.254.169.254/latest/meta-data/instance-type",
            headers={"X-aws-ec2-metadata-token": token}), timeout=1).read().decode()
    except Exception:  # noqa: BLE001 - not EC2
        pass
    try:
        return urllib.request.urlopen(urllib.request.Request(
            "http://metadata.google.internal/computeMetadata/v1/instance/machine-type",
            headers={"Metadata-Flavor": "Google"}), timeout=1).read().decode().rsplit("/", 1)[-1]
    except Exception:  # noqa: BLE001 - not GCE
        return ""


@ray.remote(num_gpus=1)
def where() -> dict:
    return {"instance_id": os.environ.get("RAY_CLOUD_INSTANCE_ID", ""), "instance_type": instance_type(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "node_id": ray.get_runtime_context().get_node_id()}


if __name__ == "__main__":
    timeout = float(os.environ.get("SMOKE_TASK_TIMEOUT", "1200"))
    ray.init(address=os.environ.get("SMOKE_RAY_ADDRESS", "auto"), logging_level="ERROR", log_to_driver=False)
    try:
        print("SMOKE_RESULT " + json.dumps(ray.get(where.remote(), timeout=timeout)), flush=True)
    except ray.exceptions.GetTimeoutError:
        print(f"SMOKE_FAILED no node with a GPU ran the task within {timeout:.0f} s", flush=True)
        sys.exit(1)
