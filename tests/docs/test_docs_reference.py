"""docs/reference/provider-keys.md is what scripts/docs_reference.py writes from the settings' models: a provider key
added, renamed or given another default without rerunning the script fails here, so the reference cannot drift."""
from __future__ import annotations

import importlib.util

from tests import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "docs_reference.py"


def _script():
    spec = importlib.util.spec_from_file_location("docs_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_is_what_the_script_writes():
    script = _script()
    assert script.OUT.read_text() == script.render(), "stale: run python scripts/docs_reference.py"


def test_the_reference_names_every_declared_key_of_every_section():
    from ray_nodeless.core.settings import CoreSettings
    from ray_nodeless.providers.aws.settings import AwsSettings
    from ray_nodeless.providers.gcp.settings import GcpSettings
    from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings

    text = _script().render()
    for model in (CoreSettings, AwsSettings, GcpSettings, KubernetesSettings):
        for name in model.model_fields:
            assert f"| `{name}` |" in text, (model.__name__, name)
    assert "| `reversion.max_in_flight` | integer | `1` | >= 1 |" in text      # nested groups, with their bounds
    assert "| `kubernetes.join.method` | \"eks\" \\| \"kubeadm\" \\| \"k3s\" | **required** |" in text


def test_every_built_in_backend_is_in_the_reference():
    backends = {d.name for d in (REPO_ROOT / "ray_nodeless" / "providers").iterdir() if (d / "backend.py").exists()}
    assert set(_script().BACKENDS) == backends
