"""The CLI sits on top: nothing in the package imports it, and the modules import each other without a cycle.

Read from the source (ast), not from a running interpreter, so that imports inside functions count too: a
function-level import is how the old cycle (simulate -> cli -> simulate) hid.
"""
from __future__ import annotations

import ast
from pathlib import Path

import ray_nodeless

PACKAGE = Path(ray_nodeless.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the ray_nodeless modules it imports. A package's `__init__` counts only where a name it defines is
    imported, not as the implicit parent of every submodule (Python runs it first, but that is no cycle)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    # `from pkg import mod` imports the module; `from pkg import name` what pkg/__init__ defines.
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


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


def test_no_import_cycle_through_cli_simulate_or_trace():
    mine = ("ray_nodeless.cli", "ray_nodeless.simulate", "ray_nodeless.trace")
    cycles = [c for c in _cycles(_graph()) if any(m.startswith(mine) for m in c)]
    assert cycles == []
