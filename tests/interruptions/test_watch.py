"""The watcher's loop without Ray: notices are found through metadata errors, the GCE hanging GET delivers the
notice as soon as it flips, and a drain that cannot happen gives up at the deadline (exit status 1). Draining a
real Ray node is tests/e2e/test_interruptions_e2e.py."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from ray_nodeless.interruptions.drain import RayDrainer
from ray_nodeless.interruptions.notices import SOURCE_GCE, Notice
from ray_nodeless.interruptions.watch import Watcher, notice_source, parse_args
from ray_nodeless.testing.fake_metadata import FakeMetadataServer

NO_GCS = RayDrainer("")       # a drain through it fails with DrainError("no GCS address ...")


def test_imds_notice_is_found_through_metadata_errors():
    with FakeMetadataServer() as fake:
        w = Watcher(notice_source("aws", fake.url), NO_GCS, "i-1", None, poll_s=0.05)
        fake.fail_next(500, 503, 404)      # token refused, token refused, then a 404 on the path
        fake.aws_notice("hibernate")
        notice = w.wait_for_notice()
        assert notice.action == "hibernate"
        assert len(fake.requests_seen()) >= 5


def test_gce_notice_arrives_through_the_hanging_get_at_once():
    with FakeMetadataServer() as fake:
        w = Watcher(notice_source("gcp", fake.url), NO_GCS, "vm-1", None)
        got: list[Notice] = []
        t = threading.Thread(target=lambda: got.append(w.wait_for_notice()), daemon=True)
        t.start()
        time.sleep(1.0)                  # the watcher is now inside a hanging GET (60 s)
        flipped = time.monotonic()
        fake.gce_preempt()
        t.join(timeout=10)
        assert got and got[0].source == SOURCE_GCE
        assert time.monotonic() - flipped < 2
        assert sum(1 for _, p in fake.requests_seen() if "wait_for_change=true" in p) == 1


def test_a_drain_that_cannot_happen_stops_at_the_deadline():
    slept: list[float] = []
    w = Watcher(notice_source("aws", "http://127.0.0.1:9"), NO_GCS, "i-1", None, sleep=slept.append)
    now = time.time()
    assert w.drain(Notice(machine_id=None, deadline=now - 1, source="test")) is False
    assert slept == []                   # past the deadline: no retry at all


def test_cli_arguments():
    args = parse_args(["--cloud", "gcp", "--gcs-address", "10.0.0.1:6379", "--poll-s", "1"])
    assert (args.cloud, args.gcs_address, args.poll_s) == ("gcp", "10.0.0.1:6379", 1.0)
    bad = subprocess.run([sys.executable, "-m", "ray_nodeless.interruptions.watch", "--cloud", "azure",
                          "--gcs-address", "h:1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'azure'" in bad.stderr
    # A backend without an interruption source (BackendConfig's default): refused by name.
    none = subprocess.run([sys.executable, "-m", "ray_nodeless.interruptions.watch", "--cloud", "local",
                           "--gcs-address", "h:1"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "--cloud local: that backend's machines get no interruption notices" in none.stderr


def test_each_cloud_source_reads_its_own_metadata_server(monkeypatch):
    """The backends' hooks pick the client and its default server; the environment variable overrides both."""
    from ray_nodeless.interruptions.metadata import AWS_METADATA_URL, GCE_METADATA_URL

    monkeypatch.delenv("RAY_NODELESS_METADATA_URL", raising=False)
    aws, gcp = notice_source("aws", None), notice_source("gcp", None)
    assert (aws.blocks, aws.client.base_url) == (False, AWS_METADATA_URL)
    assert (gcp.blocks, gcp.client.base_url) == (True, GCE_METADATA_URL)
    monkeypatch.setenv("RAY_NODELESS_METADATA_URL", "http://127.0.0.1:7/")
    assert notice_source("gcp", None).client.base_url == "http://127.0.0.1:7"
    assert notice_source("local", None) is None
