"""Clouds only through the registry: no module outside `providers/` (and `testing/`) switches on a built-in backend's
name or imports `ray_nodeless.providers.<cloud>`; what differs per cloud is a hook of its `BackendConfig`
(providers/base.py), asked through `ray_nodeless.providers.backend_config(cloud)`.

Read from the source (ast), so that imports inside functions and under TYPE_CHECKING count too. A "switch" is any
place where the code itself names a built-in backend: a comparison with the name (`cloud == "aws"`,
`cloud in ("aws", "gcp")`), a literal collection holding it (a table of clouds, `click.Choice(["aws", "gcp"])`,
`Literal["aws", "gcp"]`), a dict keyed by it, or a `match` case on it. A name inside a message, and a default value
(`provider.get("cloud", "local")`, the core's default backend), are not switches.

Issue 15 moved the last switches behind hooks (the price clouds: `BackendConfig.catalog_cloud`; Ray's provider
type a cloud stands for: `BackendConfig.ray_provider_type`): no module is exempt any more, and a test keeps it so.
"""
from __future__ import annotations

import ast
from pathlib import Path

import ray_nodeless

PACKAGE = Path(ray_nodeless.__file__).parent
BUILT_IN = frozenset({"aws", "gcp", "local"})
EXEMPT_DIRS = ("providers", "testing")       # where backends, and the fakes of their clouds, live

# module (relative to ray_nodeless/) -> why it may still switch. Empty, and it stays so (the last test).
ALLOWED: dict[str, str] = {}


def _cloud_name(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in BUILT_IN else None


def _collection_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for n in (_cloud_name(e) for e in node.elts) if n]
    return []


def switches(path: Path) -> list[str]:
    """Each place in `path` that names a built-in backend (see the module docstring), as 'line: what'."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            out += [f"{line}: import {a.name}" for a in node.names
                    if a.name.split(".")[:3] in (["ray_nodeless", "providers", c] for c in BUILT_IN)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[:2] == ["ray_nodeless", "providers"] and (
                    (len(parts) > 2 and parts[2] in BUILT_IN)
                    or (len(parts) == 2 and any(a.name in BUILT_IN for a in node.names))):
                out.append(f"{line}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                name = _cloud_name(side)
                if name:
                    out.append(f"{line}: compares with {name!r}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = _collection_names(node)
            if names:
                out.append(f"{line}: a collection of clouds {names}")
        elif isinstance(node, ast.Dict):
            out += [f"{line}: a dict keyed by {k.value!r}" for k in node.keys if k is not None and _cloud_name(k)]
        elif isinstance(node, ast.MatchValue) and _cloud_name(node.value):
            out.append(f"{line}: a match case on {node.value.value!r}")
    return sorted(out, key=lambda f: (int(f.split(":")[0]), f))


def _modules() -> dict[str, Path]:
    return {str(p.relative_to(PACKAGE)): p for p in sorted(PACKAGE.rglob("*.py"))
            if p.relative_to(PACKAGE).parts[0] not in EXEMPT_DIRS}


def test_the_check_sees_each_kind_of_switch(tmp_path: Path) -> None:
    # Guards the test itself: a check that found nothing would pass vacuously.
    src = tmp_path / "m.py"
    src.write_text('from ray_nodeless.providers.aws.settings import X\n'
                   'import ray_nodeless.providers.gcp.node_config\n'
                   'from ray_nodeless.providers import local, backend_config\n'
                   'def f(cloud, p):\n'
                   '    import ray_nodeless.providers.local.slots\n'
                   '    if cloud == "aws": pass\n'
                   '    if cloud in ("aws", "gcp"): pass\n'
                   '    t = {"gcp": 1}\n'
                   '    match cloud:\n'
                   '        case "local": pass\n'
                   '    return p.get("cloud", "local"), "only applies to cloud aws"\n')
    found = switches(src)
    assert [f.split(":")[0] for f in found] == ["1", "2", "3", "5", "6", "7", "8", "10"], found


def test_no_module_outside_providers_switches_on_a_cloud_name() -> None:
    found = {name: hits for name, path in _modules().items()
             if name not in ALLOWED and (hits := switches(path))}
    assert found == {}, ("ask the backend's config (providers.backend_config(cloud)) for a hook instead of naming "
                         "the cloud; a new hook goes on BackendConfig in providers/base.py with a default")


def test_the_hooks_issue_15_moved_stay_moved() -> None:
    """The modules helper 'hooks' cleaned (swap-in, interruption sources, boot-script instance ids, plan's display,
    the node-resource fill rule, the interruption-queue check) are clean and never on the allow-list."""
    cleaned = ["swapin/keymap.py", "swapin/convert.py", "interruptions/watch.py", "interruptions/queue.py",
               "registrations/vm_boot.py", "registrations/vm.py", "registrations/kubernetes/join.py", "cli/plan.py",
               "core/node_resources.py", "ray_adapter/provider.py"]
    modules = _modules()
    assert {m: switches(modules[m]) for m in cleaned if switches(modules[m])} == {}
    assert not set(cleaned) & set(ALLOWED)


def test_the_allow_list_is_empty() -> None:
    """No module outside providers/ is exempt: a new per-cloud difference is a BackendConfig hook, not an entry."""
    assert ALLOWED == {}


def test_the_last_switches_moved_stay_moved() -> None:
    """The price clouds (core settings, the `--cloud` choices) and Ray's provider types (the defaults.yaml fill-in of
    bootstrap_config, convert's defaults lookup) are the registry's answers now."""
    modules = _modules()
    moved = ["core/settings.py", "ray_adapter/ray_defaults.py", "swapin/ray_defaults.py", "cli/catalog.py"]
    assert {m: switches(modules[m]) for m in moved if switches(modules[m])} == {}
