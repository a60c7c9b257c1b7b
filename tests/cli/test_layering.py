"""The layering rules of ray_nodeless (docs/development.md, "Layout"), read from the source.

Read with ast, not from a running interpreter, so that imports inside functions and under `if TYPE_CHECKING:`
count too: a function-level import is how the old cycle (simulate -> cli -> simulate) hid.

Rules whose remaining violations another change is removing list them in an explicit allow-list (each entry says
who removes it); an entry that is no longer a violation fails the test too, so the lists only shrink.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import ray_nodeless

PACKAGE = Path(ray_nodeless.__file__).parent
P = "ray_nodeless."
COMPAT = P + "ray_compat"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _files() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, files: dict[str, Path]) -> set[str]:
    """Every module `name` imports (absolute names, ray_nodeless's and others'), wherever the import statement is.
    `from pkg import x` is the module pkg.x where that is one of ours, else pkg (x is a name pkg defines)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
    return out


@functools.cache
def _all_imports() -> dict[str, frozenset[str]]:
    files = _files()
    return {name: frozenset(_imports(name, path, files)) for name, path in files.items()}


def _graph() -> dict[str, set[str]]:
    """Module -> the ray_nodeless modules it imports. A package's `__init__` counts only where a name it defines is
    imported, not as the implicit parent of every submodule (Python runs it first, but that is no cycle)."""
    files = _files()
    return {name: {d for d in deps if d in files and d != name} for name, deps in _all_imports().items()}


def _external() -> dict[str, set[str]]:
    """Module -> the modules outside ray_nodeless it imports."""
    return {name: {d for d in deps if d != "ray_nodeless" and not d.startswith(P)}
            for name, deps in _all_imports().items()}


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_the_command_modules():
    # Guards the test itself: if the walk found nothing, the assertions below would pass vacuously.
    g = _graph()
    assert {"ray_nodeless.cli.simulate", "ray_nodeless.cli.trace"} <= g["ray_nodeless.cli.main"]
    assert "ray_nodeless.simulate.engine" in g["ray_nodeless.cli.simulate"]
    assert "ray_nodeless.trace.record" in g["ray_nodeless.cli.trace"]


def test_only_the_cli_imports_the_cli():
    offenders = {m: sorted(d for d in deps if d.startswith("ray_nodeless.cli"))
                 for m, deps in _graph().items() if not m.startswith("ray_nodeless.cli")}
    assert {m: d for m, d in offenders.items() if d} == {}


def _pairs(modules: dict[str, set[str]], importer, imported) -> set[tuple[str, str]]:
    """(module, what it imports) for every import where importer(module) and imported(module, target) hold."""
    return {(m, d) for m, deps in modules.items() if importer(m) for d in deps if imported(m, d)}


def _check(found: set[tuple[str, str]], allowed: frozenset[tuple[str, str]]) -> None:
    assert sorted(found - allowed) == [], "imports breaking the rule"
    assert sorted(allowed - found) == [], "no longer violations: delete these entries from the allow-list"


def test_graph_sees_lazy_and_type_checking_imports():
    # Guards the rules below: imports inside functions and under TYPE_CHECKING must be in the graph.
    g, ext = _graph(), _external()
    assert P + "providers.aws.bootstrap" in g[P + "providers.aws.backend"]       # inside a classmethod
    assert P + "core.plan" in g[P + "core.planner"]
    assert "ray._raylet" in ext[COMPAT + ".gcs"]                                 # inside a function
    assert "ray.autoscaler._private.aws" in ext[COMPAT + ".aws_bootstrap"]       # `from ... import config as rc`
    assert "numpy" in ext[P + "core.plan"]                                       # under `if TYPE_CHECKING:`


def test_no_import_cycle_at_all():
    """Module level and lazy imports alike: a cycle is a layer reaching back up."""
    assert _cycles(_graph()) == []


# core/ is pure: it imports nothing of ray_nodeless above it, and neither Ray nor a cloud SDK.
CORE_ALLOWED: frozenset[tuple[str, str]] = frozenset()
NOT_IN_CORE = ("ray", "boto3", "botocore", "google", "googleapiclient", "kubernetes")


def test_core_imports_nothing_above_it():
    found = _pairs(_graph(), lambda m: _under(m, P + "core"),
                   lambda m, d: not _under(d, P + "core", P + "errors"))
    found |= _pairs(_external(), lambda m: _under(m, P + "core"), lambda m, d: _under(d, *NOT_IN_CORE))
    _check(found, CORE_ALLOWED)


# Product code never depends on the test fakes.
TESTING_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def test_no_product_module_imports_testing():
    _check(_pairs(_graph(), lambda m: not _under(m, P + "testing"), lambda m, d: _under(d, P + "testing")),
           TESTING_ALLOWED)


# The launch and operate layers and the adapter reach backends only through the registry (providers/__init__) and
# the contract (providers/base): never a providers.<cloud> module.
CLOUD_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def test_launch_operate_and_adapter_import_no_cloud_backend():
    _check(_pairs(_graph(), lambda m: _under(m, P + "launch", P + "operate", P + "ray_adapter"),
                  lambda m, d: _under(d, P + "providers") and d not in (P + "providers", P + "providers.base")),
           CLOUD_ALLOWED)


# operate/ (the provider-block loader, the cluster-YAML checks, status, sweep) sits above launch/ (what launches):
# operate imports launch, launch never imports operate, so the launch path carries no config-time code.
def _launch_imports_of_operate(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return _pairs(graph, lambda m: _under(m, P + "launch"), lambda m, d: _under(d, P + "operate"))


def test_launch_imports_nothing_of_operate():
    _check(_launch_imports_of_operate(_graph()), frozenset())


def test_the_launch_rule_sees_lazy_and_type_checking_imports(tmp_path):
    # Guards the rule above: a launch module's imports of operate under TYPE_CHECKING, inside a function and
    # relative ones all count as violations.
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from ray_nodeless.operate.config import ProviderBundle\n"
                   "def f():\n    from ..operate import sweep\n")
    name = P + "launch.m"
    files = dict(_files(), **{name: src})
    graph = {name: {d for d in _imports(name, src, files) if d in files}}
    assert _launch_imports_of_operate(graph) == {(name, P + "operate.config"), (name, P + "operate.sweep")}


# What loads a cluster through operate/ (the adapter, `simulate`, the swap-in tool and KubeRay's package) sits above
# it: operate imports none of them.
def test_operate_imports_none_of_its_users():
    _check(_pairs(_graph(), lambda m: _under(m, P + "operate"),
                  lambda m, d: _under(d, P + "ray_adapter", P + "simulate", P + "swapin", P + "kuberay")),
           frozenset())


def _ray_private(module: str) -> bool:
    """Ray's modules that are not its API: any `_`-prefixed part (ray._private, ray._raylet,
    ray.autoscaler._private), the generated protobufs and autoscaler v2's internals."""
    parts = module.split(".")
    return parts[0] == "ray" and (any(p.startswith("_") for p in parts[1:])
                                  or _under(module, "ray.core.generated", "ray.autoscaler.v2"))


def test_ray_private_imports_only_in_compat():
    _check(_pairs(_external(), lambda m: not _under(m, COMPAT), lambda m, d: _ray_private(d)), frozenset())


def test_compat_is_a_leaf():
    """ray_compat imports nothing of ray_nodeless but errors, so any layer may use it without a cycle."""
    _check(_pairs(_graph(), lambda m: _under(m, COMPAT), lambda m, d: not _under(d, COMPAT, P + "errors")),
           frozenset())


# registrations/ (how a machine joins Ray) sees backends only through the contract: providers/base, and the registry
# (providers/__init__) for a backend's config hooks by cloud name (the boot scripts' instance-id snippet).
REGISTRATIONS_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def test_registrations_import_only_the_contract_core_and_compat():
    _check(_pairs(_graph(), lambda m: _under(m, P + "registrations"),
                  lambda m, d: d != P + "providers" and not _under(d, P + "registrations", P + "core", P + "errors",
                                                                    P + "providers.base", COMPAT)),
           REGISTRATIONS_ALLOWED)


# providers/ (machine backends, and the played-machines decorator around them) never import registrations/: data
# flows core -> providers -> registrations. What both sides of a join read (the Kubernetes join formats) is in core
# (core/kube_join.py); what a decorator needs of a registration (the API server its `kubernetes` block names) is
# handed to it by the loader as the registration's parsed section, not imported.
PROVIDERS_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def test_providers_never_import_registrations():
    _check(_pairs(_graph(), lambda m: _under(m, P + "providers"), lambda m, d: _under(d, P + "registrations")),
           PROVIDERS_ALLOWED)


def test_the_providers_rule_sees_lazy_imports(tmp_path):
    # Guards the rule above: the played kubelet's old imports (module level, and one inside a method) would count.
    src = tmp_path / "m.py"
    src.write_text("from ray_nodeless.registrations.kubernetes import labels as L\n"
                   "def f():\n    from ray_nodeless.registrations.kubernetes.join import parse_user_data\n")
    files = dict(_files(), **{P + "providers.local.m": src})
    deps = _imports(P + "providers.local.m", src, files)
    assert {P + "registrations.kubernetes.labels", P + "registrations.kubernetes.join"} <= deps


# The adapter (Ray's calls -> the launch layer) knows neither the swap-in tool nor KubeRay: the KubeRay bridge sits
# above it (ray_nodeless/kuberay/ runs a NodelessProvider), `convert` above both.
def test_ray_adapter_imports_neither_swapin_nor_kuberay():
    _check(_pairs(_graph(), lambda m: _under(m, P + "ray_adapter"),
                  lambda m, d: _under(d, P + "swapin", P + "kuberay")), frozenset())


# swapin/ (the generic Ray-YAML converter) does not import KubeRay's package: KubeRay's convert reuses swapin, not
# the other way round.
def test_swapin_does_not_import_kuberay():
    _check(_pairs(_graph(), lambda m: _under(m, P + "swapin"), lambda m, d: _under(d, P + "kuberay")), frozenset())


# Only the CLI, the shipped fakes and KubeRay's own package import ray_nodeless.kuberay.
def test_only_cli_and_testing_import_kuberay():
    _check(_pairs(_graph(), lambda m: not _under(m, P + "kuberay", P + "cli", P + "testing"),
                  lambda m, d: _under(d, P + "kuberay")), frozenset())


# Small modules (the project brief: none over 500 lines), so each one can be read whole. A module another change is
# splitting is listed with who splits it; an entry that is no longer over fails the test, so the list only shrinks.
MAX_LINES = 500
LONG_ALLOWED: dict[str, str] = {}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_500_lines():
    long = {m: _lines(p) for m, p in _files().items() if _lines(p) > MAX_LINES}
    assert sorted(set(long) - set(LONG_ALLOWED)) == [], f"modules over {MAX_LINES} lines: {long}"
    assert sorted(set(LONG_ALLOWED) - set(long)) == [], "no longer over: delete these entries from LONG_ALLOWED"


def test_the_length_rule_counts_lines(tmp_path):
    # Guards the rule above: the count is the file's lines (a 501-line module is over, a 500-line one is not).
    over, at = tmp_path / "over.py", tmp_path / "at.py"
    over.write_text("x = 1\n" * (MAX_LINES + 1))
    at.write_text("x = 1\n" * MAX_LINES)
    assert _lines(over) > MAX_LINES >= _lines(at)
