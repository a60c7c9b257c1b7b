"""Hypothesis profiles: CI replays a fixed set of examples (a red CI must mean a change broke something, not that
a new random example was drawn); developers explore with fresh random examples. HYPOTHESIS_PROFILE overrides."""
import os
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import settings

from ray_nodeless.testing.moto_server import REGION, MotoServer, start_moto_server

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.register_profile("explore", max_examples=2000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# The Ray-cluster modules the second worker takes once it has run every other module: a moto or fake-GCE cluster
# each, no Kubernetes control plane, about 6 of the e2e's 22 minutes. Without them the e2e worker alone set the
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
    )
)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `pytest -n 2` (what `make test` runs): each test module goes to one worker whole (its module fixtures,
    a moto server or a Kubernetes control plane, start once), and the modules of tests/e2e go as two units, each
    run one module after another as without xdist: "tests/e2e" first, on the first worker, and "tests/e2e:tail"
    (E2E_TAIL) last in the queue, so whichever worker is free first, after every other module, runs it. Two
    `ray up`s at once on 2 cores only slow each other down, so they overlap only at the end. (xdist's own
    `--dist loadgroup` does not group under pytest 9.2, which no longer reads the node id it rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RayClustersInTurn(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in E2E_TAIL:
                return "tests/e2e:tail"
            return "tests/e2e" if module.startswith("tests/e2e/") else module

        def _assign_work_unit(self, node) -> None:
            # The longest unit first, so the other worker fills in beside it; the tail unit last.
            if "tests/e2e:tail" in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end("tests/e2e:tail", last=True)
            if "tests/e2e" in self.workqueue:
                self.workqueue.move_to_end("tests/e2e", last=False)
            super()._assign_work_unit(node)

    return RayClustersInTurn(config, log)


@pytest.fixture(autouse=True, scope="session")
def _events_out_of_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The provider's event logs and cost state (ray_nodeless/metrics/events.py) go to a temp dir, not
    ~/.ray-nodeless/events: a provider built as the monitor in-process, and every head an e2e test starts (they
    inherit the environment), write there."""
    from ray_nodeless.metrics.events import EVENTS_DIR_ENV

    before = os.environ.get(EVENTS_DIR_ENV)
    os.environ[EVENTS_DIR_ENV] = str(tmp_path_factory.mktemp("ray-nodeless-events"))
    yield
    if before is None:
        os.environ.pop(EVENTS_DIR_ENV, None)
    else:
        os.environ[EVENTS_DIR_ENV] = before


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    srv = start_moto_server()
    try:
        yield srv
    finally:
        srv.server.stop()


@pytest.fixture
def moto(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    """A clean moto (reset before the test) and an environment that can never reach real AWS credentials."""
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    # Ray's AWS bootstrap attaches AWS managed policies to the head's role; moto loads them only when asked, and
    # loading them costs seconds per test: only the tests that run Ray's IAM step ask (see `moto_iam`).
    monkeypatch.delenv("MOTO_IAM_LOAD_MANAGED_POLICIES", raising=False)
    moto_server.reset()
    yield moto_server


@pytest.fixture
def moto_iam(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """`moto` with AWS managed policies, which Ray's IAM bootstrap step attaches to the head's role. moto reads the
    switch when it rebuilds the IAM backend on the test's first IAM call (seconds of its time: ask only if needed)."""
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    return moto


@pytest.fixture(scope="session")
def plugin_wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the wheel `make wheel` builds from this checkout (what the cloud configs mount on the
    head), built once per test session: xdist workers share one build (under a lock) through the session's base
    temp directory."""
    from filelock import FileLock

    from tests.packaging.wheel import build_wheel

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "ray_nodeless_wheel"
    with FileLock(str(shared / "ray_nodeless_wheel.lock")):
        if not list(out.glob("ray_nodeless-*.whl")):
            build_wheel(out)
    return out
