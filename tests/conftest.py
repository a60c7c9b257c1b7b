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


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `pytest -n 2` (what `make test` runs): each test module goes to one worker whole (its module fixtures,
    a moto server or a Kubernetes control plane, start once), and every module of tests/e2e goes to the same worker,
    one after another, as without xdist: two `ray up`s at once on 2 cores only slow each other down. (xdist's own
    `--dist loadgroup` does not group under pytest 9.2, which no longer reads the node id it rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RayClustersInTurn(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            # The longest unit (about 2/3 of the suite's time) first, so the other worker fills in beside it.
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
