"""The local backend's and the local player's provider-block keys: errors name the key, before anything starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.local.backend import LocalBackend
from ray_nodeless.providers.local.players import RayNodePlayer
from ray_nodeless.providers.local.settings import (
    DEFAULT_GCS_ADDRESS, DEFAULT_OBJECT_STORE_MEMORY, LocalPlayerSettings, LocalSettings,
)
from ray_nodeless.core.schema import parse_section


def parse(**provider) -> LocalSettings:
    return parse_section(LocalSettings, provider, "provider")


def test_defaults() -> None:
    s = parse()
    assert s.gcs_address is None and s.local_gcs_address() == DEFAULT_GCS_ADDRESS
    assert s.local_object_store_memory == DEFAULT_OBJECT_STORE_MEMORY
    assert s.state_dir is None and s.local_faults == [] and s.local_prewarm is True


@pytest.mark.parametrize("provider, key, words", [
    ({"gcs_address": "localhost"}, "provider.gcs_address", "host:port"),
    ({"gcs_address": ":6379"}, "provider.gcs_address", "host:port"),
    ({"gcs_address": "127.0.0.1:70000"}, "provider.gcs_address", "host:port"),
    ({"gcs_address": 6379}, "provider.gcs_address", "must be a string"),
    ({"local_object_store_memory": 1024}, "provider.local_object_store_memory", "must be >="),
    ({"local_port_base": 80}, "provider.local_port_base", "must be >= 1024"),
    ({"local_port_base": 60000}, "provider.local_port_base", "must be <="),
    ({"local_start_timeout_s": 0}, "provider.local_start_timeout_s", "must be > 0"),
    ({"local_min_free_memory_mb": "800"}, "provider.local_min_free_memory_mb", "must be an integer"),
    ({"local_ray_start_args": "--foo"}, "provider.local_ray_start_args", "must be a list"),
    ({"local_prewarm": "yes"}, "provider.local_prewarm", "true or false"),
    ({"local_faults": [{"zone": "a", "times": -1}]}, "provider.local_faults.0.times", "must be >= 0"),
    ({"local_faults": [{"capacity": "ondemand"}]}, "provider.local_faults.0.capacity", "one of"),
    ({"local_faults": [{"zon": "us-west-2a"}]}, "provider.local_faults.0.zon", ""),
])
def test_errors_name_the_key(provider: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse(**provider)
    assert ei.value.key == key and words in str(ei.value)


def test_backend_and_player_parse_once_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        LocalBackend.from_provider({"state_dir": str(tmp_path / "s"), "gcs_address": "localhost"}, "c")
    assert ei.value.key == "provider.gcs_address"
    with pytest.raises(ConfigError) as ei:
        RayNodePlayer.from_provider({"player_state_dir": str(tmp_path / "p"), "local_port_base": "20000"}, "c")
    assert ei.value.key == "provider.local_port_base"
    be = LocalBackend.from_provider({"state_dir": str(tmp_path / "s"), "head_ip": "10.1.2.3", "local_port_base": 30000,
                       "local_prewarm": False}, "c")
    assert be.head_ip == "10.1.2.3" and be.nodes.port_base == 30000 and be.nodes.starter is None
    assert be.state_dir == tmp_path / "s"


def test_declared_keys_reach_the_provider_key_check() -> None:
    base = {"region": "us-west-2", "simulate_cloud": "aws"}
    load_provider({**base, "cloud": "local", "state_dir": "/tmp/x", "local_faults": [], "local_prewarm": False})
    with pytest.raises(ConfigError, match="did you mean 'local_prewarm'") as ei:
        load_provider({**base, "cloud": "local", "local_prewarn": False})
    assert ei.value.key == "provider.local_prewarn"
    # The player's keys are known with registration: local-player on a cloud, and only there.
    cloud = {"cloud": "aws", "region": "us-east-1", "registration": "local-player"}
    load_provider({**cloud, "player_state_dir": "/tmp/p", "gcs_address": "127.0.0.1:6379", "local_port_base": 30000})
    with pytest.raises(ConfigError) as ei:
        load_provider({**base, "cloud": "local", "player_state_dir": "/tmp/p"})
    assert ei.value.key == "provider.player_state_dir"
    assert set(LocalPlayerSettings.model_fields) - set(LocalSettings.model_fields) == {"player_state_dir"}


def test_played_kubelets_take_the_node_process_keys_only_when_played() -> None:
    join = {"method": "kubeadm", "endpoint": "https://127.0.0.1:6443", "token": "abcdef.0123456789abcdef",
            "ca_cert_hash": "sha256:" + "0" * 64}
    # cloud: local has local_* keys itself
    base = {"cloud": "aws", "region": "us-west-2", "registration": "kubernetes"}
    load_provider({**base, "kubernetes": {"join": join, "played": True}, "local_port_base": 30000})
    with pytest.raises(ConfigError) as ei:      # real machines: no local Ray process to size
        load_provider({**base, "kubernetes": {"join": join}, "local_port_base": 30000})
    assert ei.value.key == "provider.local_port_base"
    with pytest.raises(ConfigError) as ei:      # the player's own checks, naming the key
        load_provider({**base, "kubernetes": {"join": join, "played": True}, "local_start_timeout_s": 0})
    assert ei.value.key == "provider.local_start_timeout_s"


def test_the_default_state_dirs_do_not_shadow_the_package_for_a_script_run_from_the_temp_dir(tmp_path) -> None:
    """The default state dir and the machine-wide start lock live under the temp dir. Named `ray_nodeless` (as
    before), that directory was a namespace package that shadowed the installed one for any script run from /tmp
    (a script's directory comes first on sys.path): `import ray_nodeless.core...` then failed to find the catalog."""
    import subprocess
    import sys

    from ray_nodeless.providers.local import processes
    from ray_nodeless.providers.local.settings import default_state_dir

    # The directories the local backend makes under the temp dir, made under this test's own one.
    for d in (default_state_dir("c").parent.name, Path(processes._START_LOCK.lock_file).parent.name):
        (tmp_path / d / "c").mkdir(parents=True, exist_ok=True)
    script = tmp_path / "uses_the_package.py"
    script.write_text("from ray_nodeless.core.catalog import store\nprint(store.embedded().catalog_id)\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()
