"""The hooks of `BackendConfig` (providers/base.py) that callers outside providers/ use instead of a cloud's name:
each built-in cloud answers its own, and a third-party backend registered without any (the in-memory `fake` of
ray_nodeless/testing/fake_backend.py, through the public registry) gets the documented default, which every caller
handles: it refuses the feature naming the backend, or does without it."""
from __future__ import annotations

import subprocess

import pytest

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.node_resources import GENERIC_FILL, ray_filled_resources
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers import backend_config, backend_names
from ray_nodeless.providers.base import BackendConfig, LaunchSpec
from ray_nodeless.registrations.kubernetes.join import DEFAULT_MACHINE_ID_SNIPPET, user_data
from ray_nodeless.registrations.kubernetes.settings import JoinSettings
from ray_nodeless.registrations.vm import BareVM
from ray_nodeless.registrations.vm_boot import worker_boot_script
from ray_nodeless.testing import fake_backend  # noqa: F401 - registers `cloud: fake` (no BackendConfig of its own)

KUBEADM = {"method": "kubeadm", "endpoint": "https://10.0.0.10:6443", "token": "abcdef.0123456789abcdef",
           "ca_cert_hash": "sha256:" + "0" * 64}


def _spec(cloud: str = "aws", name: str = "m5.xlarge", capacity: str = "spot") -> LaunchSpec:
    rc = embedded().region(cloud, "us-central1" if cloud == "gcp" else "us-east-1")
    o = rc.find(name, sorted(rc.zones)[0], capacity)
    return LaunchSpec(cluster_name="c", node_type="w", offering=o, count=1, tags={}, node_config={},
                      request_token="t", resources={"CPU": 4.0})


def test_a_backend_without_hooks_gets_every_default():
    fake = backend_config("fake")
    assert fake is fake_backend.FakeBackend         # registered without a BackendConfig: the class answers
    assert fake.supports_interruption_queue is False
    assert fake.interruption_source(None) is None
    assert fake.instance_id_snippet("X") is None
    assert fake.fill_rule() is GENERIC_FILL
    assert fake.swapin() is None
    assert fake.plan_notes({"LaunchTemplate": {"LaunchTemplateName": "t"}}) == []
    with pytest.raises(ConfigError, match="provider.interruption_queue_url: backend 'fake' polls no"):
        fake.interruption_queue_client("https://sqs.us-east-1.amazonaws.com/1/q", {})


def test_callers_handle_the_defaults():
    from ray_nodeless.interruptions.watch import notice_source
    from ray_nodeless.swapin import keymap

    queue = {"cloud": "fake", "region": "us-east-1", "interruption_queue_url": "https://sqs.us-east-1.amazonaws.com/1/q"}
    with pytest.raises(ConfigError, match="provider.interruption_queue_url: backend 'fake' polls no queue"):
        load_provider(queue)
    assert notice_source("fake", None) is None                         # the watcher refuses `--cloud fake`
    with pytest.raises(ValueError, match="no boot script for cloud 'fake'"):
        worker_boot_script("fake", _spec(), "10.0.0.1", 6379, None)
    vm = BareVM.from_provider({"cloud": "fake", "region": "us-east-1", "disable_node_updaters": True,
                               "head_ip": "10.0.0.9"}, "c")
    assert vm.boots_itself is False and vm.prepare(_spec()).boot_script == ""   # Ray's updaters start it
    join = JoinSettings.model_validate(KUBEADM)
    assert DEFAULT_MACHINE_ID_SNIPPET in user_data(join, _spec(), "c", "fake")   # the id from the environment
    with pytest.raises(ConfigError, match="provider.type: 'fake': convert reads Ray YAMLs for"):
        keymap.strategy("fake")


@pytest.mark.parametrize("cloud,var_source", [
    ("aws", "http://169.254.169.254/latest/meta-data/instance-id"),
    ("gcp", "http://metadata.google.internal/computeMetadata/v1/instance/name"),
])
def test_each_cloud_snippet_is_the_one_source_of_every_boot_script(cloud, var_source):
    """One hook, two consumers: the VM boot script and the Kubernetes join user data carry the same lines, for
    their own variable."""
    snippet = backend_config(cloud).instance_id_snippet
    assert var_source in snippet("V") and "\nV=$(" in "\n" + snippet("V")
    name = "n1-standard-4" if cloud == "gcp" else "m5.xlarge"
    assert snippet("RAY_CLOUD_INSTANCE_ID") in worker_boot_script(cloud, _spec(cloud, name), "h", 1, None)
    script = user_data(JoinSettings.model_validate(KUBEADM), _spec(cloud, name), "c", cloud)
    assert snippet("MACHINE_ID") in script
    subprocess.run(["bash", "-n"], input=snippet("V") + "\necho $V\n", text=True, check=True)


def test_the_queue_capability_and_its_client_go_together():
    for name in backend_names():
        cfg = backend_config(name)
        has_client = cfg.interruption_queue_client.__func__ is not BackendConfig.interruption_queue_client.__func__
        assert cfg.supports_interruption_queue == has_client, name
    assert [n for n in ("aws", "gcp", "local") if backend_config(n).supports_interruption_queue] == ["aws"]


def test_fill_rules_differ_only_in_the_clouds_part():
    """AWS: EC2's GPU names and Neuron cores; GCP: declared CPU/GPU are kept as Ray's GCP provider keeps them."""
    cat = embedded()
    aws, gcp = backend_config("aws").fill_rule(), backend_config("gcp").fill_rule()
    inf2 = cat.instance_type("aws", "inf2.xlarge")
    assert ray_filled_resources(inf2, {}, is_head=True, rule=aws) == {
        "CPU": 4, "neuron_cores": 2, "accelerator_type:aws-neuron-core": 1}
    assert ray_filled_resources(inf2, {}, is_head=True, rule=GENERIC_FILL) == {"CPU": 4}
    assert not aws.keeps({"CPU": 1}) and gcp.keeps({"CPU": 1}) and not gcp.keeps({"custom": 1})


def test_plan_notes_are_the_backends():
    template = {"LaunchTemplate": {"LaunchTemplateName": "gpu-lt"}}
    [note] = backend_config("aws").plan_notes(template)
    assert note.startswith("note: LaunchTemplate gpu-lt is read by `ray up`")
    assert backend_config("aws").plan_notes(dict(template, InstanceType="m5.large")) == []
    assert backend_config("gcp").plan_notes(template) == []
