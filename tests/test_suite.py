"""How the suite runs (tests/suite.py, tests/k8s_plane.py): the markers each test gets, the durations file's format
and when a run rewrites or merges it, the scheduler's units and their order, and a shared plane's per-module views."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from tests import REPO_ROOT, suite
from tests.k8s_plane import PlaneView


class Item:
    """What apply_markers reads of a pytest item."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()):
        self.nodeid = nodeid
        self.fixturenames = list(fixtures)
        self.marks = [getattr(pytest.mark, m).mark for m in marks]

    def iter_markers(self):
        return iter(self.marks)

    def add_marker(self, marker) -> None:
        self.marks.append(marker.mark)

    def names(self) -> set[str]:
        return {m.name for m in self.marks}


def test_markers_by_directory_fixture_module_and_recorded_duration() -> None:
    items = {
        "e2e": Item("tests/e2e/test_smoke.py::test_up"),
        "e2e_k8s": Item("tests/e2e/test_k8s_e2e.py::test_x", fixtures=("cp", "k8s_plane")),
        "own_plane": Item("tests/e2e/test_real_kubelet.py::test_join"),
        "k8s": Item("tests/registrations/kubernetes/test_k8s_faults.py::test_a", fixtures=("k8s_plane",)),
        "corpus": Item("tests/config/test_bad_configs.py::test_case[local-x]"),
        "slow": Item("tests/core/test_planner.py::test_big"),
        "quick": Item("tests/core/test_planner.py::test_small"),
        "by_hand": Item("tests/providers/local/test_local_backend.py::test_ray", marks=("e2e",)),
    }
    durations = {"tests/core/test_planner.py::test_big": 12.0, "tests/core/test_planner.py::test_small": 0.2,
                 "tests/config/test_bad_configs.py::test_case[local-x]": 30.0,        # corpus already says so
                 "tests/providers/local/test_local_backend.py::test_ray": 40.0}       # e2e already says so
    suite.apply_markers(list(items.values()), durations)
    got = {k: i.names() for k, i in items.items()}
    assert got == {"e2e": {"e2e"}, "e2e_k8s": {"e2e", "k8s"}, "own_plane": {"e2e", "k8s"}, "k8s": {"k8s"},
                   "corpus": {"corpus"}, "slow": {"slow"}, "quick": set(), "by_hand": {"e2e"}}


def test_a_module_using_the_plane_outside_the_k8s_unit_is_named() -> None:
    with pytest.raises(pytest.UsageError, match="tests/core/test_x.py .*K8S_MODULES"):
        suite.apply_markers([Item("tests/core/test_x.py::test_a", fixtures=("k8s_plane",))], {})


def test_every_listed_module_exists() -> None:
    for module in suite.K8S_MODULES | suite.K8S_OWN_PLANE | suite.CORPUS_MODULES | suite.E2E_TAIL:
        assert (REPO_ROOT / module).is_file(), module


def test_the_durations_file_is_sorted_one_test_a_line_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    suite.write_durations(path, {"tests/b.py::t": 1.0, "tests/a.py::t[x y]": 0.123456, 'tests/a.py::t["q"]': 2})
    text = path.read_text()
    assert text == '{\n"tests/a.py::t[\\"q\\"]": 2.00,\n"tests/a.py::t[x y]": 0.12,\n"tests/b.py::t": 1.00\n}\n'
    assert json.loads(text) == suite.load_durations(path) == {
        'tests/a.py::t["q"]': 2.0, "tests/a.py::t[x y]": 0.12, "tests/b.py::t": 1.0}
    assert suite.load_durations(tmp_path / "none.json") == {}


def _config(args_source, keyword: str = "", markexpr: str = ""):
    option = types.SimpleNamespace(keyword=keyword, markexpr=markexpr, deselect=None, lf=False)
    return types.SimpleNamespace(args_source=args_source, option=option)


def _report(nodeid: str, seconds: float):
    return types.SimpleNamespace(nodeid=nodeid, duration=seconds)


@pytest.mark.parametrize("how,full", [("testpaths", True), ("paths", False), ("keyword", False), ("mark", False)])
def test_a_full_run_rewrites_the_file_a_partial_one_merges_into_it(tmp_path: Path, how: str, full: bool) -> None:
    path = tmp_path / "d.json"
    suite.write_durations(path, {"tests/gone.py::t": 5.0, "tests/a.py::t": 9.0})
    source = pytest.Config.ArgsSource.ARGS if how == "paths" else pytest.Config.ArgsSource.TESTPATHS
    rec = suite.DurationsRecorder(_config(source, keyword="x" if how == "keyword" else "",
                                          markexpr="not e2e" if how == "mark" else ""), path)
    for phase_s in (0.5, 1.25, 0.25):          # setup, call, teardown of one test
        rec.pytest_runtest_logreport(_report("tests/a.py::t", phase_s))
    rec.pytest_sessionfinish(None, pytest.ExitCode.OK)
    expect = {"tests/a.py::t": 2.0} if full else {"tests/a.py::t": 2.0, "tests/gone.py::t": 5.0}
    assert suite.load_durations(path) == expect


def test_an_interrupted_full_run_only_merges(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    suite.write_durations(path, {"tests/b.py::t": 5.0})
    rec = suite.DurationsRecorder(_config(pytest.Config.ArgsSource.TESTPATHS), path)
    rec.pytest_runtest_logreport(_report("tests/a.py::t", 1.0))
    rec.pytest_sessionfinish(None, pytest.ExitCode.INTERRUPTED)
    assert suite.load_durations(path) == {"tests/a.py::t": 1.0, "tests/b.py::t": 5.0}


def test_units_and_their_costs() -> None:
    assert suite.unit_of("tests/e2e/test_smoke.py::t") == "tests/e2e:tail"
    assert suite.unit_of("tests/e2e/test_k8s_e2e.py::t") == "tests/e2e"
    assert suite.unit_of("tests/kuberay/test_kuberay_rbac.py::t") == "tests:k8s"
    assert suite.unit_of("tests/core/test_planner.py::t[1]") == "tests/core/test_planner.py"
    durations = {"a::1": 1.0, "a::2": 3.0, "b::1": 2.0}
    # b::2 is new since the file was written: counted as the median recorded test (2 s)
    assert suite.unit_costs({"a": ["a::1", "a::2"], "b": ["b::1", "b::2"]}, durations) == {"a": 4.0, "b": 4.0}


class Node:
    """An xdist worker as the scheduler drives it: what it was sent, in order."""

    def __init__(self, name: str):
        self.name, self.sent, self.collection = name, [], []
        self.gateway = types.SimpleNamespace(id=name)
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(sorted({suite.unit_of(self.collection[i]) for i in indexes}))

    def shutdown(self) -> None:
        pass


def test_the_scheduler_sends_e2e_first_then_longest_first_and_the_tail_last() -> None:
    collection = ["tests/a.py::t1", "tests/a.py::t2", "tests/a.py::t3", "tests/b.py::t", "tests/c.py::t",
                  "tests/e2e/test_smoke.py::t", "tests/e2e/test_k8s_e2e.py::t",
                  "tests/kuberay/test_kuberay_rbac.py::t", "tests/registrations/kubernetes/test_k8s_faults.py::t"]
    durations = {"tests/a.py::t1": 1.0, "tests/a.py::t2": 1.0, "tests/a.py::t3": 1.0, "tests/b.py::t": 50.0,
                 "tests/c.py::t": 20.0, "tests/e2e/test_smoke.py::t": 99.0, "tests/e2e/test_k8s_e2e.py::t": 9.0,
                 "tests/kuberay/test_kuberay_rbac.py::t": 5.0,
                 "tests/registrations/kubernetes/test_k8s_faults.py::t": 30.0}
    config = types.SimpleNamespace(getvalue=lambda k: {"tx": ["2*popen"]}[k],
                                   option=types.SimpleNamespace(loadscopereorder=True))
    sched = suite.make_scheduler(config, None, durations)
    one, two = Node("gw0"), Node("gw1")
    for n in (one, two):
        n.collection = collection
        sched.add_node(n)
        sched.add_node_collection(n, collection)
    sched.schedule()
    # each worker holds two units; then each finished unit makes room for the next in the queue
    order = [one.sent[0], two.sent[0], one.sent[1], two.sent[1]]
    assert order == [["tests/e2e"], ["tests/b.py"], ["tests:k8s"], ["tests/c.py"]]
    assert list(sched.workqueue) == ["tests/a.py", "tests/e2e:tail"]


def test_a_plane_view_adds_a_modules_own_attributes_and_shares_the_rest() -> None:
    plane = types.SimpleNamespace(server="https://127.0.0.1:6443", restarts=[])
    plane.restart = lambda: plane.restarts.append(1)
    a, b = PlaneView(plane, sa_kubeconfig="a.kc"), PlaneView(plane, sa_kubeconfig="b.kc")
    a.extra = 1
    assert (a.sa_kubeconfig, b.sa_kubeconfig, a.server) == ("a.kc", "b.kc", plane.server)
    assert not hasattr(b, "extra") and not hasattr(plane, "extra") and not hasattr(plane, "sa_kubeconfig")
    b.restart()
    assert plane.restarts == [1]

