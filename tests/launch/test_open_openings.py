"""A machine on its way for a shape-open demand is said in the event stream (launch/open_types.py `Opening`,
ray_adapter/open_driver.py, metrics/wiring.py): Ray warns "No available node types can fulfill" for every such
demand before its generated type is written; the "opening" event tells that transient warning apart from a real
refusal ("cannot serve ..."). Through OpenTypes on a config dict, and through NodelessProvider built as Ray's
monitor on the in-memory backend, its GCS a stand-in that answers with Ray's own cluster-status proto."""
from __future__ import annotations


import logging
import yaml

from ray_nodeless.core.demand import parse_demand
from ray_nodeless.launch.open_types import Snapshot
from ray_nodeless.metrics.events import EVENTS_DIR_ENV, events_path, read_log
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.launch.test_open_types import _config, _machine, _open_types
from tests.ray_adapter.test_provider import PROVIDER


def test_each_pass_that_opens_machines_says_which_for_what():
    ot, store, *_ = _open_types(_config())
    gpu = parse_demand('{"GPU": 1}')
    first = ot.step(Snapshot([gpu, parse_demand('{"CPU": 1000}')], []), {})
    [opening] = first.opened
    [name] = first.packing.new
    o = first.packing.types[name].offering
    assert (opening.node_type, opening.offering, opening.count) == (name, o, 1)
    assert opening.demand == "{GPU: 1}"
    msg = opening.message()
    assert msg.startswith(f"shape-open: 1 x {name} on its way ({o.instance_type.name} in {o.zone}, {o.capacity}, $")
    assert "No available node types can fulfill" in msg and "transient" in msg
    # The real refusal is the other message.
    assert [r for r in first.reports if r.startswith("cannot serve {CPU: 1000}")]
    # The machine launched, not joined yet: nothing more on its way.
    assert ot.step(Snapshot([gpu], []), {"m1": _machine("m1", name)}).opened == []
    # Two more of the same shape: the quota grows by what this pass planned.
    more = ot.step(Snapshot([gpu, gpu, gpu], []), {"m1": _machine("m1", name)})
    assert [(x.node_type, x.count) for x in more.opened] == [(name, 2)]
    assert store.config["available_node_types"][name]["max_workers"] == 3


class ClusterStatus:
    """Ray's GCS client as the shape-open driver reads it: `get_cluster_status` with one pending request."""

    def __init__(self, resources: dict[str, float]):
        from ray.core.generated import autoscaler_pb2

        reply = autoscaler_pb2.GetClusterStatusReply()
        r = reply.cluster_resource_state.pending_resource_requests.add(count=1)
        for k, v in resources.items():
            r.request.resources_bundle[k] = v
        self.raw = reply.SerializeToString()

    def get_cluster_status(self, timeout_s: float) -> bytes:
        return self.raw


def test_the_monitor_records_an_opening_event_in_the_log_and_rays_channel(monkeypatch, tmp_path, caplog):
    cfg = _config()
    config_file = tmp_path / "ray_bootstrap_config.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv(EVENTS_DIR_ENV, str(tmp_path / "events"))
    # Ray's monitor logger logs warnings in the monitor; an earlier test in the worker may have disabled it.
    monitor_logger = logging.getLogger("ray.autoscaler._private.monitor")
    monkeypatch.setattr(monitor_logger, "disabled", False)
    monkeypatch.setattr(monitor_logger, "level", logging.INFO)   # its own, not a parent's (quiet_ray: ERROR)
    fake_backend.reset()
    from ray_nodeless.ray_adapter.context import MonitorContext
    p = NodelessProvider(dict(PROVIDER, metrics_port=None), "c1",
                         context=MonitorContext(gcs_address="127.0.0.1:1", config_path=str(config_file),
                                                acts_on_cluster=True))
    assert p.open is not None
    p.open._client = ClusterStatus({"CPU": 8})
    p.loop.run_once("listing")
    [event] = [e for e in read_log(events_path("c1")) if e.kind == "opening"]
    generated = [n for n in yaml.safe_load(config_file.read_text())["available_node_types"] if n.startswith("nl-")]
    assert [event.fields["node_type"]] == generated and event.fields["count"] == 1
    assert event.fields["demand"] == "{CPU: 8}" and "on its way" in event.message
    # Ray's autoscaler event channel (what drivers print as `(autoscaler +Ns)`): the monitor log's summary line.
    assert any(r.name == "ray.autoscaler._private.monitor" and "ray_nodeless: shape-open: 1 x " in r.getMessage()
               for r in caplog.records)
