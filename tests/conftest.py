"""The suite's shared set-up: Hypothesis profiles, the markers and the xdist scheduler (tests/suite.py), the per-test
durations file, and the servers tests share (moto, the Kubernetes control plane, the wheel).

Hypothesis profiles: CI replays a fixed set of examples (a red CI must mean a change broke something, not that
a new random example was drawn); developers explore with fresh random examples. HYPOTHESIS_PROFILE overrides."""
import logging
import os
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import settings

from ray_nodeless.testing.moto_server import REGION, MotoServer, start_moto_server
from tests import suite

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.register_profile("explore", max_examples=2000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write every test's duration (setup + call + teardown, s) to PATH at the session's end: "
                          "the whole file on a full run, the tests run merged into it otherwise (`make test` "
                          f"records {suite.DURATIONS_FILE.relative_to(suite.REPO_ROOT)})")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    # The controller under xdist (it receives every worker's reports), or the only process without it.
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(suite.DurationsRecorder(config, Path(path)), "ray-nodeless-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite.apply_markers(items, suite.load_durations())


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return suite.make_scheduler(config, log)


@pytest.fixture(scope="session")
def k8s_plane(tmp_path_factory: pytest.TempPathFactory):
    """The process's one Kubernetes control plane (one per xdist worker; tests/k8s_plane.py): started the first time
    a test asks, stopped at the session's end. Modules take a view of it (`.nodeless()`, `.kuberay()`)."""
    from tests.k8s_plane import SharedPlane

    shared = SharedPlane(tmp_path_factory.mktemp("k8s-shared")).start()
    try:
        yield shared
    finally:
        shared.stop()


# Loggers whose level a test (or a command it runs in-process: `kuberay-autoscaler` sets ray_nodeless to INFO, as
# the bridge's process wants; tests/swapin quiets ray.autoscaler) may change: each test starts with their level as
# the session had it, so what one test captures does not depend on which tests ran before it in the worker. Not
# Ray's own `ray` logger: Ray configures it once at import, and undoing that would change Ray's logging.
_KEPT_LOGGERS = ("ray_nodeless", "ray.autoscaler")


@pytest.fixture(autouse=True)
def _logger_levels() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in _KEPT_LOGGERS]
    saved = [(lg.level, lg.disabled) for lg in loggers]
    yield
    for lg, (level, disabled) in zip(loggers, saved):
        lg.setLevel(level)
        lg.disabled = disabled


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


@pytest.fixture(autouse=True)
def _no_ledger_of_an_earlier_test() -> None:
    """The cost cap's ledger (launch/shared_holds.py) lives beside the event logs, per cluster name: a test's
    fresh cloud must not inherit an earlier test's launches of a cluster of the same name (in a real cluster those
    machines exist; here their cloud is gone)."""
    from ray_nodeless.metrics.events import events_dir

    for p in Path(os.path.expanduser(events_dir())).glob("*.holds.json*"):
        p.unlink(missing_ok=True)


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
