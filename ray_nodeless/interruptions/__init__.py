"""Spot interruption notices: a machine that is about to be reclaimed is drained out of Ray first.

- `notices.py`: pure parsing of what each cloud sends (EC2 IMDS instance-action, GCE `preempted`, the EventBridge
  spot interruption warning delivered to SQS) into one `Notice`.
- `metadata.py`: the machine's own metadata server (IMDSv2, GCE), standard library HTTP only.
- `drain.py`: finding a Ray node in the GCS node table and draining it with Ray's drain API (reason PREEMPTION).
- `watch.py`: the node-side watcher (`python -m ray_nodeless.interruptions.watch`), started by the boot script.
- `queue.py`: the provider-side poller of an SQS queue of EventBridge warnings (`provider.interruption_queue_url`).
"""
