"""kuberay/ending.py's SIGTERM path, in this process: a real SIGTERM during Ray's monitor (here a function that
sends it to itself, as the kubelet does when the head pod is deleted). The bridge is the Protocol `ending.Ending`
states: a RayCluster read, the sweep, the teardown (which calls ending's own `end_machines`)."""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable

import pytest

from ray_nodeless.kuberay import ending


class Clusters:
    namespace, name = "ray", "rc"

    def __init__(self, ray_cr: dict[str, Any]):
        self.ray_cr = ray_cr

    def get(self) -> dict[str, Any]:
        return self.ray_cr


class Bridge:
    """What ending.Ending asks of the bridge, with the sweep's calls recorded."""

    def __init__(self, ray_cr: dict[str, Any]):
        self.rayclusters = Clusters(ray_cr)
        self.last: dict[str, Any] | None = {"cluster_name": "rc", "provider": {"cloud": "local", "kuberay": {}}}
        self.swept: list[dict[str, Any]] = []
        self.sweep: Callable[[dict[str, Any]], bool] = lambda cfg: self.swept.append(cfg) is None

    def config(self, ray_cr: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("the last config handed to Ray is what gets swept")

    def teardown(self, ray_cr: dict[str, Any] | None) -> bool:
        return ending.end_machines(self, ray_cr, why="being deleted")


def sigterm_then_wait() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    raise AssertionError("SIGTERM did not end the monitor")


@pytest.fixture(autouse=True)
def _sigterm_restored():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("meta, spec", [({"deletionTimestamp": "2026-12-03T00:00:00Z"}, {}), ({}, {"suspend": True})],
                         ids=["deleted", "suspended"])
def test_sigterm_of_a_going_cluster_ends_its_machines_and_exits_0(meta, spec):
    bridge = Bridge({"metadata": {"name": "rc", **meta}, "spec": spec})
    with pytest.raises(SystemExit) as ei:
        ending.run_until_terminated(bridge, sigterm_then_wait)
    assert ei.value.code == 0
    assert [c["cluster_name"] for c in bridge.swept] == ["rc"] and "kuberay" not in bridge.swept[0]["provider"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN   # a second SIGTERM while exiting changes nothing


def test_sigterm_of_a_plain_restart_ends_nothing_and_exits_143():
    bridge = Bridge({"metadata": {"name": "rc"}, "spec": {}})
    with pytest.raises(SystemExit) as ei:
        ending.run_until_terminated(bridge, sigterm_then_wait)
    assert ei.value.code == 143 and bridge.swept == []


def test_a_finished_teardown_exit_ignores_the_kubelets_sigterm():
    """The bridge's own loop ended the machines and exits 0 (the RayCluster's deletion then deletes the head pod,
    whose SIGTERM can come while Python finalizes, when it would restore the default action: killed, -15)."""
    def done() -> None:
        raise SystemExit(0)

    with pytest.raises(SystemExit) as ei:
        ending.run_until_terminated(Bridge({"metadata": {"name": "rc"}}), done)
    assert ei.value.code == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGTERM)       # ignored: this test process goes on
