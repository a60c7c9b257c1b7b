"""What the wheel installs covers what the plugin imports: every third-party module a product module (anything outside
ray_nodeless/testing/) imports, lazily or not, comes from a distribution that pyproject's dependencies bring in,
directly or through theirs. A head (or a client) installed from the wheel must never meet a ModuleNotFoundError."""
from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import REPO_ROOT

PACKAGE = REPO_ROOT / "ray_nodeless"
# Optional features behind an extra of pyproject, with the module that needs it.
OPTIONAL = {"matplotlib": "plot"}


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module (namespace packages by their second part: google.cloud) -> importing files."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] in sys.stdlib_module_names or parts[0] in ("ray_nodeless", "__future__"):
                    continue
                key = ".".join(parts[:2]) if parts[0] == "google" and len(parts) > 1 else parts[0]
                out.setdefault(key, set()).add(str(path.relative_to(REPO_ROOT)))
    return out


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements bring in, extras and markers evaluated."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        key = name + "".join(f"[{e}]" for e in sorted(req.extras))
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        for sub in metadata.requires(req.name) or []:
            r = Requirement(sub)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append((r, ""))
            else:
                todo += [(r, e) for e in req.extras if r.marker.evaluate({"extra": e})]
    return {s for s in seen if "[" not in s}


def _file_index() -> dict[str, set[str]]:
    """`top` and `top/sub` directory (and `top.py` module) -> the installed distributions with files there."""
    index: dict[str, set[str]] = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for f in dist.files or []:
            parts = f.parts
            if len(parts) == 1 and parts[0].endswith(".py"):
                index.setdefault(parts[0][:-3], set()).add(name)
            elif len(parts) > 1:
                index.setdefault(parts[0], set()).add(name)
                if len(parts) > 2:
                    index.setdefault(f"{parts[0]}.{parts[1]}", set()).add(name)
    return index


def test_every_imported_third_party_module_is_installed_by_the_dependencies() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    base = _closure(project["dependencies"])
    index = _file_index()
    missing = {}
    for module, files in sorted(_imports().items()):
        extra = OPTIONAL.get(module)
        have = _closure(project["dependencies"] + project["optional-dependencies"][extra]) if extra else base
        dists = index.get(module, set())
        assert dists, f"{module} (imported by {sorted(files)}) is not installed here at all"
        if not dists & have:
            missing[module] = (sorted(dists), sorted(files))
    assert missing == {}, f"imported by product code, installed by no dependency of pyproject: {missing}"


def test_the_check_sees_the_imports_it_must() -> None:
    """The scan finds the lazy imports inside functions too (boto3, googleapiclient are imported lazily)."""
    found = _imports()
    assert {"boto3", "googleapiclient", "google.cloud", "kubernetes", "ray", "yaml"} <= set(found)
    assert not any("testing" in f for files in found.values() for f in files)
