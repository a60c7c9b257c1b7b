"""The metrics decorators are the classes they wrap (metrics/decorator.py): a metered launcher is a Launcher, a
metered backend a MachineBackend; the metered calls keep their signatures; every other member, attribute writes
included, reaches the wrapped object, so a backend's own override of a contract default is the one that runs."""
from __future__ import annotations

import inspect

from ray_nodeless.launch.catalog import PlanningCatalog
from ray_nodeless.launch.launcher import Launcher
from ray_nodeless.launch.machine_view import MachineView
from ray_nodeless.metrics.instrument import (
    MeteredBackend, MeteredLauncher, MeteredPlanning, MeteredView, Recorder,
)
from ray_nodeless.metrics.registry import Metrics
from ray_nodeless.providers.base import MachineBackend
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend
from tests.ray_adapter.test_provider import PROVIDER


def _provider() -> NodelessProvider:
    fake_backend.reset()
    return NodelessProvider(dict(PROVIDER), "c1")


def test_each_part_is_an_instance_of_what_it_wraps():
    p = _provider()
    assert isinstance(p.launcher, MeteredLauncher) and isinstance(p.launcher, Launcher)
    assert isinstance(p.view, MeteredView) and isinstance(p.view, MachineView)
    assert isinstance(p.launcher.backend, MeteredBackend) and isinstance(p.launcher.backend, MachineBackend)
    assert isinstance(p._catalog, MeteredPlanning) and isinstance(p._catalog, PlanningCatalog)
    assert type(p.launcher.wrapped) is Launcher and type(p.view.wrapped) is MachineView


def test_the_metered_calls_keep_the_wrapped_signatures():
    for metered, wrapped, name in [(MeteredLauncher, Launcher, "launch"), (MeteredView, MachineView, "refresh"),
                                   (MeteredBackend, MachineBackend, "launch"),
                                   (MeteredBackend, MachineBackend, "list_machines")]:
        assert (inspect.signature(getattr(metered, name), eval_str=True)
                == inspect.signature(getattr(wrapped, name), eval_str=True)), name


def test_attribute_reads_and_writes_reach_the_wrapped_object():
    p = _provider()
    inner = p.launcher.wrapped
    p.launcher.prefer_on_demand = lambda node_type: True
    assert inner.prefer_on_demand("x") is True and p.launcher.settings is inner.settings
    p.view.clock = clock = (lambda: 5.0)
    assert p.view.wrapped.clock is clock and "clock" not in vars(p.view)


class _OwnRecheck(fake_backend.FakeBackend):
    """A backend that overrides a contract default the decorator does not meter."""

    def recheck(self, machine_ids):
        return {"asked": list(machine_ids or [])}

    def leftovers(self):
        return [{"kind": "disk", "name": "d-1", "machine_id": "", "node_kind": "", "state": "available"}]


def test_the_wrapped_backends_own_methods_run_not_the_contracts_defaults():
    p = _provider()
    inner = _OwnRecheck(p.backend.settings, "c1")
    metered = MeteredBackend(inner, Recorder(Metrics()))
    assert metered.recheck(["i-1"]) == {"asked": ["i-1"]}
    assert metered.leftovers()[0]["name"] == "d-1"
    assert metered.settings is inner.settings and metered.cluster_name == "c1"
    assert metered.fill_rule() is inner.fill_rule()
