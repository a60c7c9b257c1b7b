"""Hypothesis profiles: CI replays a fixed set of examples (a red CI must mean a change broke something, not that
a new random example was drawn); developers explore with fresh random examples. HYPOTHESIS_PROFILE overrides."""
import os
from typing import Iterator

import pytest
from hypothesis import settings

from ray_nodeless.testing.moto_server import REGION, MotoServer, start_moto_server

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.register_profile("explore", max_examples=2000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


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
    # Ray's AWS bootstrap attaches AWS managed policies to the head's role; moto loads them only when asked.
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    moto_server.reset()
    yield moto_server
