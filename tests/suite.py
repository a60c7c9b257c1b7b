"""How the suite runs (used by tests/conftest.py): its markers, the per-test durations file, and the xdist scheduler.

Markers (registered in pyproject.toml; `make test-fast` deselects all four, `make test` runs everything):
- `e2e`: starts Ray clusters: every test of tests/e2e, and the few elsewhere marked by hand;
- `k8s`: needs a Kubernetes control plane or a kubelet (the `k8s_plane` fixture, or a module in K8S_OWN_PLANE):
  needs `make k8s`'s build;
- `corpus`: the big bad-config corpora (CORPUS_MODULES, about 1,500 cases);
- `slow`: any other test that took over SLOW_S in the recorded durations (DURATIONS_FILE), or marked by hand.

Durations: `make test` passes `--record-durations tests/durations.json`; the controller (under xdist it receives
every worker's reports) writes each test's setup + call + teardown time there at the session's end: JSON, one
`"node id": seconds` per line, sorted by node id, seconds to 0.01. A full run rewrites the file (tests gone leave
it); a partial run (paths, -k, -m) merges what it ran into it. The file is committed: the `slow` marker and the
scheduler's order read it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import REPO_ROOT

DURATIONS_FILE = REPO_ROOT / "tests" / "durations.json"
SLOW_S = 10.0
# Modules that start a control plane of their own instead of sharing `k8s_plane` (tests/k8s_plane.py says why).
K8S_OWN_PLANE = frozenset({"tests/e2e/test_real_kubelet.py"})
# The modules outside tests/e2e that use `k8s_plane`: the scheduler sends them to one worker as one unit, so that
# worker starts the plane once (the e2e worker starts its own for the e2e modules that use one). A module that
# uses the fixture and is not listed fails the collection (see apply_markers).
K8S_MODULES = frozenset({
    "tests/registrations/kubernetes/test_k8s_control_plane.py",
    "tests/registrations/kubernetes/test_k8s_faults.py",
    "tests/kuberay/test_kuberay_rbac.py",
    "tests/kuberay/test_kuberay_open.py",
})
CORPUS_MODULES = frozenset({"tests/config/test_bad_configs.py", "tests/config/test_ray_up_path.py"})
MARKERS = ("e2e", "k8s", "corpus", "slow")

# The Ray-cluster modules the second worker takes once it has run every other module: a moto, fake-GCE or local
# cluster each, no Kubernetes control plane, about 6 of the e2e's 25 minutes. Without them the e2e worker alone set the
# suite's wall time (about 22 minutes) while the other worker sat idle for the last 8 or so; with them the two
# finish within a minute or two of each other, and two Ray clusters overlap only for those last minutes.
E2E_TAIL = frozenset(
    "tests/e2e/" + name
    for name in (
        "test_smoke.py",
        "test_aws_e2e.py",
        "test_gcp_e2e.py",
        "test_swapin_request_resources.py",
        "test_trace_record.py",
        "test_reversion_drain.py",
        "test_interruptions_e2e.py",
        "test_learned_idle.py",
    )
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


# ----------------------------------------------------------------------------------------------- markers


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def apply_markers(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Mark each item e2e / k8s / corpus / slow (see the module docstring). Marks given by hand stay."""
    stray = sorted({m for i in items if "k8s_plane" in i.fixturenames
                    and (m := module_of(i.nodeid)) not in K8S_MODULES and not m.startswith("tests/e2e/")})
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)} use(s) the k8s_plane fixture: add it to K8S_MODULES in "
                                "tests/suite.py (the scheduler keeps those modules on one worker)")
    for item in items:
        module = module_of(item.nodeid)
        have = {m.name for m in item.iter_markers() if m.name in MARKERS}
        want = set()
        if module.startswith("tests/e2e/"):
            want.add("e2e")
        if "k8s_plane" in item.fixturenames or module in K8S_OWN_PLANE:
            want.add("k8s")
        if module in CORPUS_MODULES:
            want.add("corpus")
        if not (have | want) - {"slow"} and durations.get(item.nodeid, 0.0) > SLOW_S:
            want.add("slow")
        for name in sorted(want - have):
            item.add_marker(getattr(pytest.mark, name))


# ----------------------------------------------------------------------------------------------- durations


class DurationsRecorder:
    """Sums each test's phases from the reports and writes DURATIONS_FILE's format at the session's end."""

    def __init__(self, config: pytest.Config, path: Path):
        self.config = config
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def _full_run(self, exitstatus: int) -> bool:
        """Every test of testpaths ran: no paths given, no -k / -m / --deselect / --lf, not interrupted."""
        o = self.config.option
        return (self.config.args_source == pytest.Config.ArgsSource.TESTPATHS and not o.keyword
                and not o.markexpr and not getattr(o, "deselect", None) and not getattr(o, "lf", False)
                and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.seconds:
            return
        merged = {} if self._full_run(exitstatus) else load_durations(self.path)
        merged.update(self.seconds)
        write_durations(self.path, merged)


def write_durations(path: Path, seconds: dict[str, float]) -> None:
    body = ",\n".join(f"{json.dumps(k)}: {v:.2f}" for k, v in sorted(seconds.items()))
    path.write_text("{\n" + body + "\n}\n")


# ----------------------------------------------------------------------------------------------- scheduler


def unit_of(nodeid: str) -> str:
    """The work unit a test goes to a worker in: its module, except the e2e modules (two units, run one module
    after another) and the K8S_MODULES (one unit: one control-plane start)."""
    module = module_of(nodeid)
    if module in E2E_TAIL:
        return "tests/e2e:tail"
    if module.startswith("tests/e2e/"):
        return "tests/e2e"
    if module in K8S_MODULES:
        return "tests:k8s"
    return module


def unit_costs(units: dict[str, list[str]], durations: dict[str, float]) -> dict[str, float]:
    """Each unit's expected seconds: its tests' recorded durations, a test not recorded yet (new since the file was
    written) counted as the median recorded test."""
    recorded = sorted(durations.values())
    median = recorded[len(recorded) // 2] if recorded else 0.0
    return {u: sum(durations.get(n, median) for n in nodeids) for u, nodeids in units.items()}


def make_scheduler(config: pytest.Config, log: Any, durations: dict[str, float] | None = None) -> Any:
    """Under `pytest -n 2` (what `make test` runs): each work unit (unit_of) goes to one worker whole (its module
    fixtures, a moto server or a Kubernetes control plane, start once), "tests/e2e" first, on the first worker, and
    "tests/e2e:tail" (E2E_TAIL) last in the queue, so whichever worker is free first, after every other unit, runs
    it: two `ray up`s at once on 2 cores only slow each other down, so they overlap only at the end. Between them
    the units go longest first by the recorded durations (xdist's own order, most tests first, where none are
    recorded), so the short ones even the two workers out at the end. (xdist's own `--dist loadgroup` does not
    group under pytest 9.2, which no longer reads the node id it rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    durations = load_durations() if durations is None else durations

    class RayClustersInTurn(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _order_by_durations(self) -> None:
            if not durations:
                return
            cost = unit_costs({u: list(nodeids) for u, nodeids in self.workqueue.items()}, durations)
            for unit in sorted(self.workqueue, key=lambda u: -cost[u]):   # stable: ties keep xdist's order
                self.workqueue.move_to_end(unit)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                self._order_by_durations()
                self._ordered = True
            # The e2e unit first, so the other worker fills in beside it; the tail unit last.
            if "tests/e2e:tail" in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end("tests/e2e:tail", last=True)
            if "tests/e2e" in self.workqueue:
                self.workqueue.move_to_end("tests/e2e", last=False)
            super()._assign_work_unit(node)

    return RayClustersInTurn(config, log)
