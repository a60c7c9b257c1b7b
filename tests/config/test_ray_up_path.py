"""The bad-config corpora through Ray's own `ray up` code: `ray.autoscaler._private.commands.
create_or_update_cluster` (what `ray up -y --no-config-cache` runs) on a YAML file, against moto (AWS) and the fake
GCE server (GCP), and for `registration: kubernetes` on the local backend. Every case must stop with an error naming the
key before the head exists, and no instance may
exist afterwards.

Ray's head step (`get_or_create_head_node`, where the head would be created and then reached over SSH) is replaced
by a stub that records the attempt: a config that gets that far was not refused, which is a failure of the case
(and the instance listing proves nothing launched either way). Errors Ray raises itself before our
`bootstrap_config` runs (its JSON-schema check names the key as a path) count when they name the key; a crash in
Ray's code that names nothing fails the case. `test_rates` prints named/total per corpus.

The shapes Ray's own code crashes on before any plugin code runs (RAY_CRASHES) stay Ray's traceback under `ray up`:
no code of ours runs before Ray's `prepare_config` (the package installs no start-up hook), and `ray-nodeless plan`
names each (tests/config/test_ray_preparation.py). `test_ray_crashes_where_documented` checks each against the
installed Ray in-process, `test_the_ray_cli_shows_rays_own_traceback` through the real `ray up` CLI; the corpus cases
of those names are left out of the named/total figures.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from ray_nodeless.testing.fake_gce import FakeGce
from ray_nodeless.testing.moto_server import MotoServer
from tests.config.corpus import COMMON, PER_BACKEND, base
from tests.config.corpus_values import LIVE_K8S, RAY_SHAPES, VALUES_COMMON, VALUES_PER_BACKEND
from tests.providers.aws.helpers import all_instances

GCP_PROJECT = "corpus-project"
# Exceptions that are a crash in Ray's code (a traceback under `ray up`), never a clear error, whatever they say.
CRASHES = (TypeError, KeyError, AttributeError, IndexError, AssertionError, RecursionError)
CASES = [(b, corpus, name, mutate, key) for b in ("aws", "gcp")
         for corpus, cases in (("first", COMMON + PER_BACKEND[b]), ("values", VALUES_COMMON + VALUES_PER_BACKEND[b]),
                               ("ray", RAY_SHAPES))
         for name, mutate, key in cases]
# registration: kubernetes on the local backend (cluster-configs/local-k8s-cpu-head.yaml): its static checks and
# the live ones (kubeconfig file, API server) that only `ray up` runs.
CASES += [("k8s", "kubernetes", name, mutate, key) for name, mutate, key in VALUES_PER_BACKEND["k8s"] + LIVE_K8S]
RESULTS: dict[tuple[str, str], list[bool]] = {}
# Shapes Ray's own `ray up` code crashes on before any code of ours runs, so no plugin can name them (`ray-nodeless
# plan` does: test_bad_configs.py). What runs first in `create_or_update_cluster(config_file)`: yaml.safe_load, the
# `up_started` event callbacks (only those registered in-process: none of ours, the plugin is not imported yet),
# `config["provider"]["type"]`, then `_bootstrap_config`: `prepare_config` (fillout_defaults, merge_setup_commands,
# validate_docker_config, fill_node_type_min_max_workers), the config cache's hash of the prepared config, and only
# then the provider class's import (`_NODE_PROVIDERS["external"]` -> `provider.module`) and its bootstrap_config.
# name -> (the Ray function whose line raises, the exception, why). test_ray_crashes_where_documented checks each
# against the installed Ray's traceback; `plan` names each (operate/ray_prepare.py).
RAY_CRASHES: dict[str, tuple[str, type[BaseException], str]] = {
    "provider-missing": ("create_or_update_cluster", KeyError,
                         "reads config['provider']['type'] to pick the provider, before _bootstrap_config"),
    "provider-list": ("create_or_update_cluster", TypeError,
                      "reads config['provider']['type'] of a list, before _bootstrap_config"),
    "setup-commands-string": ("merge_setup_commands", TypeError,
                              "prepare_config concatenates setup_commands (a str) with the head/worker lists"),
    "docker-list": ("validate_docker_config", AttributeError,
                    "prepare_config calls config['docker'].get('image') on a list"),
    "types-list": ("fill_node_type_min_max_workers", TypeError,
                   "prepare_config indexes available_node_types (a list) by node type name"),
    "node-type-string": ("fill_node_type_min_max_workers", AttributeError,
                         "prepare_config calls setdefault('min_workers', 0) on a node type that is a str"),
    "node-type-name-number": ("_bootstrap_config", TypeError,
                              "the config cache key is json.dumps(config, sort_keys=True): an int node type name "
                              "cannot be sorted among str names"),
}

def _param(b: str, corpus: str, name: str, mutate: Callable, key: str) -> Any:
    return pytest.param(b, corpus, name, mutate, key, id=f"{b}-{name}")


class HeadWouldLaunch(Exception):
    """Ray reached its head-creation step: the config was accepted."""


def _message(e: BaseException) -> str:
    """What `ray up` shows for `e`, with a JSON-schema error's path in dotted form too."""
    text = f"{type(e).__name__}: {e}"
    path = getattr(e, "absolute_path", None)
    if path is not None:
        text += "\npath: " + ".".join(str(p) for p in path)
    return text


def ray_up(path: Path, monkeypatch: pytest.MonkeyPatch) -> BaseException | None:
    """Ray's `ray up -y --no-config-cache path` in-process, its head step stubbed (see the module docstring): what
    the `ray up` process runs, since nothing of ours runs before it."""
    from ray.autoscaler._private import commands

    def head_step(*args: Any, **kwargs: Any) -> None:
        raise HeadWouldLaunch()

    monkeypatch.setattr(commands, "get_or_create_head_node", head_step)
    try:
        commands.create_or_update_cluster(str(path), None, None, no_restart=True, restart_only=False, yes=True,
                                          no_config_cache=True)
    except HeadWouldLaunch:
        return None
    except BaseException as e:    # noqa: BLE001 - every outcome is judged, SystemExit included
        return e
    return None


@pytest.fixture(scope="module")
def gce() -> Any:
    with FakeGce(project=GCP_PROJECT) as fake:
        yield fake


def _aws_target(moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict], None]:
    monkeypatch.setenv("HOME", str(tmp_path))
    iam = moto.client("iam")
    iam.create_role(RoleName="ray-autoscaler-v1", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="ray-autoscaler-v1")
    iam.add_role_to_instance_profile(InstanceProfileName="ray-autoscaler-v1", RoleName="ray-autoscaler-v1")

    def point(c: dict) -> None:
        c["provider"].update(endpoint_url=moto.url,
                             aws_credentials={"aws_access_key_id": "testing", "aws_secret_access_key": "testing"})
    return point


def _gcp_target(gce: Any) -> Callable[[dict], None]:
    def point(c: dict) -> None:
        c["provider"].update(api_endpoint=gce.url, project_id=GCP_PROJECT, credentials="anonymous")
    return point


def _target(b: str, request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[dict], None], Callable[[], list]]:
    """What a case's config is pointed at (moto, the fake GCE; nothing for the local backend) and how to list the
    machines that exist there afterwards."""
    if b == "aws":
        moto = request.getfixturevalue("moto")
        return _aws_target(moto, tmp_path, monkeypatch), lambda: all_instances(moto)
    if b == "k8s":
        monkeypatch.setenv("HOME", str(tmp_path))
        # The local backend launches only through Ray's head step (stubbed, recorded as acceptance) and the
        # provider objects Ray builds after it: nothing to list before that step.
        return lambda c: None, lambda: []
    gce = request.getfixturevalue("gce")
    gce.instances.clear()
    return _gcp_target(gce), lambda: list(gce.instances)


def _case_file(b: str, mutate: Callable[[dict], None], tmp_path: Path,
               point: Callable[[dict], None] | None = None) -> Path:
    """The case's cluster YAML: the backend's base config, pointed (before the mutation: a case may change or remove
    those keys too), then mutated."""
    cfg = copy.deepcopy(base(b))
    if point is not None:
        point(cfg)
    mutate(cfg)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


@pytest.mark.parametrize("b,corpus,name,mutate,key", [_param(*c) for c in CASES if c[2] not in RAY_CRASHES])
def test_ray_up_names_the_key_and_launches_nothing(b, corpus, name, mutate, key, request, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    point, instances = _target(b, request, tmp_path, monkeypatch)
    e = ray_up(_case_file(b, mutate, tmp_path, point), monkeypatch)
    named = e is not None and not isinstance(e, CRASHES) and key in _message(e)
    RESULTS.setdefault((b, corpus), []).append(named)
    assert instances() == [], f"{name}: a machine exists after `ray up`"
    assert e is not None, f"{name}: `ray up` accepted the config (it would create the head)"
    assert named, f"{name}: {_message(e)[:2000]}"


@pytest.mark.parametrize("b", ["aws", "gcp"])
@pytest.mark.parametrize("name", sorted(RAY_CRASHES))
def test_ray_crashes_where_documented(b, name, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each RAY_CRASHES shape, through the installed Ray's `create_or_update_cluster`: the crash is the documented
    exception, raised in the documented Ray function, with no frame of ray_nodeless anywhere in the traceback (so no
    hook of ours ran before it), and it never reaches the head step."""
    import traceback

    function, exc_type, _why = RAY_CRASHES[name]
    [(mutate, key)] = [(m, k) for c, _corpus, n, m, k in CASES if c == b and n == name]
    e = ray_up(_case_file(b, mutate, tmp_path), monkeypatch)
    assert isinstance(e, exc_type), f"{name}: {e!r}"
    frames = traceback.extract_tb(e.__traceback__)
    assert not [f for f in frames if "/ray_nodeless/" in f.filename], f"{name}: our code ran: {frames}"
    ray_frames = [f for f in frames if f"{Path('ray', 'autoscaler')}" in f.filename]
    assert ray_frames and ray_frames[-1].name == function, f"{name}: {[f.name for f in ray_frames]}"


RAY_BIN = Path(sys.executable).with_name("ray")


@pytest.mark.parametrize("name", sorted(RAY_CRASHES))
def test_the_ray_cli_shows_rays_own_traceback(name, moto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The installed `ray` CLI itself (`.venv/bin/ray up -y --no-config-cache file.yaml`, a subprocess) on each
    RAY_CRASHES shape, pointed at moto: Ray's traceback ending in the documented exception, raised in Ray's code with
    no frame of ours, and no instance afterwards (`plan` names the key: test_ray_preparation.py). One backend: the
    crash comes before Ray imports any provider, so the backend does not change it."""
    from tests.config.test_ray_up_inputs import stale_start_up_hook

    assert stale_start_up_hook() is None, stale_start_up_hook()
    function, exc_type, _why = RAY_CRASHES[name]
    [mutate] = [m for c, _corpus, n, m, _k in CASES if c == "aws" and n == name]
    point = _aws_target(moto, tmp_path, monkeypatch)
    path = _case_file("aws", mutate, tmp_path, point)
    r = subprocess.run([str(RAY_BIN), "up", "-y", "--no-config-cache", str(path)], capture_output=True, text=True,
                       env={**os.environ, "HOME": str(tmp_path)}, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr, out
    assert r.stderr.rstrip().splitlines()[-1].startswith(f"{exc_type.__name__}: "), r.stderr
    assert f", in {function}\n" in r.stderr, r.stderr
    assert "/ray_nodeless/" not in r.stderr and "ray-nodeless:" not in out, r.stderr
    assert all_instances(moto) == []


def test_rates(capsys):
    """named/total per cloud and corpus (of the cases run in this session; see the module docstring)."""
    if not RESULTS:
        pytest.skip("run with the corpus cases")
    with capsys.disabled():
        for (b, corpus), got in sorted(RESULTS.items()):
            print(f"\nray up path, {b}, corpus {corpus}: {sum(got)}/{len(got)} named "
                  f"({100 * sum(got) / len(got):.1f} %)")
