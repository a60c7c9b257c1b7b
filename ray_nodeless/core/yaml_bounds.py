"""YAML read with bounds checked before anything expands it: every YAML we parse (a cluster YAML for `plan` and
`convert`, a KubeRay manifest, the RayCluster annotation the bridge reads from the API server) goes through here.

Why: YAML aliases share one node many times, so a 1 KB "billion laughs" text stands for billions of values. PyYAML
builds it with shared Python objects (cheap), but every walk of the result (our nesting check, Ray's schema check,
a `json.dumps`) visits the expanded tree: `plan` spun for minutes on one. Here the text is composed into PyYAML's
node graph, where an alias is the same node object again; its expanded size and depth are computed over that graph
with one visit per distinct node (memoised), so a bomb is refused in milliseconds, naming what it is. A recursive
alias (a node inside itself) is refused too: nothing downstream can walk it. Only then is the document constructed.
"""
from __future__ import annotations

from typing import Iterator

import yaml

# Values (scalars and collections) a document may stand for once its aliases are expanded. A large real cluster
# YAML (a thousand node types) is well under 100,000.
MAX_YAML_VALUES = 1_000_000
# Nesting depth (the same bound as core/cluster_plan.MAX_YAML_DEPTH, which checks the constructed document).
MAX_YAML_DEPTH = 100

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlBoundsError(ValueError):
    """The text stands for more than the bounds allow (the message says which bound and by how much)."""


def _measure(root: yaml.Node) -> tuple[int, int]:
    """(expanded values, depth) of `root`, each distinct node visited once."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = list(_children(node))
            size[key] = min(1 + sum(size[id(c)] for c in children), MAX_YAML_VALUES + 1)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_YAML_VALUES:
                raise YamlBoundsError(f"its aliases expand to more than {MAX_YAML_VALUES:,} values (a YAML alias "
                                      "bomb?): write the values out, or use fewer nested aliases")
            if depth[key] > MAX_YAML_DEPTH + 1:
                raise YamlBoundsError(f"nested more than {MAX_YAML_DEPTH} levels deep")
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlBoundsError("an alias refers to a mapping or list it is inside of (a recursive YAML alias)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return size[id(root)], depth[id(root)]


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            yield k
            yield v
    elif isinstance(node, yaml.SequenceNode):
        yield from node.value


def load_bounded_all(text: str) -> list[object]:
    """Every document of `text`, after each passed the bounds. Raises yaml.YAMLError (not YAML) or YamlBoundsError."""
    # One parse: each document's node graph is measured, then constructed from that same graph.
    loader = _LOADER(text)
    try:
        docs: list[object] = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                docs.append(None)
                continue
            _measure(node)
            docs.append(loader.construct_document(node))
        return docs
    except RecursionError:       # the pure-Python composer (PyYAML without libyaml) on a deep text
        raise YamlBoundsError(f"nested more than {MAX_YAML_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def load_bounded(text: str) -> object:
    """The one document of `text` (None when empty), as `yaml.safe_load`, after it passed the bounds."""
    docs = load_bounded_all(text)
    if len(docs) > 1:
        raise yaml.YAMLError("expected a single document in the stream, found more")
    return docs[0] if docs else None
