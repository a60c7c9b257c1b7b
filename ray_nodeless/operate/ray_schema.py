"""Ray's own cluster-YAML schema (`ray/autoscaler/ray-schema.json`, what `ray up`'s `validate_config` checks with
jsonschema), applied by `ray-nodeless plan` without importing Ray or jsonschema, so that `plan` refuses what `ray up`
refuses, naming the key the same way (`setup_commands[0]`, `max_worker`).

The installed Ray's schema file is read as JSON (a cold `plan` stays fast: jsonschema's import alone costs more
than planning). The keywords the schema uses are honoured: `type` (with `nullable`), `properties`,
`patternProperties`, `additionalProperties: false` (with a did-you-mean), `items`, `minimum`, `enum` and `$ref`
into its `definitions`. Not applied: `required` (Ray checks it after its own defaults and our
`fillout_available_node_types_resources` have filled keys, so the raw YAML may lack them) and the `allOf`/`if`
conditions of `auth` (Ray names those itself). As in Ray's `prepare_config`, empty legacy `head_node` /
`worker_nodes` keys are dropped first.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Mapping

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core.schema import suggest_key
from ray_nodeless.errors import ConfigError

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,), "number": (int, float),
    "boolean": (bool,), "null": (type(None),),
}
LEGACY_KEYS = ("head_node", "worker_nodes")


@functools.cache
def ray_schema() -> Document | None:
    """The installed Ray's ray-schema.json, or None when Ray is not installed (then `ray up` cannot run either)."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.origin:
        return None
    try:
        schema: Document = json.loads(
            (Path(spec.origin).parent / "autoscaler" / "ray-schema.json").read_text(encoding="utf-8"))
        return schema
    except (OSError, ValueError):
        return None


def _type_ok(value: object, kind: Any, nullable: bool) -> bool:
    kinds = kind if isinstance(kind, list) else [kind]
    if nullable and value is None:
        return True
    for k in kinds:
        allowed = _TYPES.get(k)
        if allowed is None:
            return True          # a type this reader does not know: Ray judges it
        if isinstance(value, bool) and bool not in allowed:
            continue
        if isinstance(value, allowed):
            return True
    return False


def _check(schema: DocumentView, root: DocumentView, value: object, key: str) -> None:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/definitions/"):
        target = root.get("definitions", {}).get(ref.rsplit("/", 1)[1])
        if isinstance(target, Mapping):
            _check(target, root, value, key)
    kind = schema.get("type")
    if kind is not None and not _type_ok(value, kind, bool(schema.get("nullable"))):
        wanted = " or ".join(kind) if isinstance(kind, list) else kind
        raise ConfigError(key or "cluster", f"must be {'an' if wanted[0] in 'aeiou' else 'a'} {wanted} (Ray's "
                                            f"cluster schema), got {type(value).__name__} {value!r}"[:400])
    if "enum" in schema and value not in schema["enum"]:
        raise ConfigError(key, f"{value!r} is not one of {schema['enum']} (Ray's cluster schema)")
    minimum = schema.get("minimum")
    if minimum is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value < minimum:
        raise ConfigError(key, f"must be >= {minimum} (Ray's cluster schema), got {value!r}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        patterns = schema.get("patternProperties") or {}
        for k in sorted(value, key=str):
            sub = f"{key}.{k}" if key else str(k)
            if k in props:
                _check(props[k], root, value[k], sub)
                continue
            matched = [p for p in patterns if re.search(p, str(k))]
            for p in matched:
                _check(patterns[p], root, value[k], sub)
            if not matched and schema.get("additionalProperties") is False:
                raise _unknown(sub, str(k), props)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, v in enumerate(value):
            _check(schema["items"], root, v, f"{key}[{i}]")


RAY_LEGACY_KEYS = frozenset({"head_node", "worker_nodes"})


def unknown_top_level_keys(cluster_config: Mapping[str, Any]) -> list[ConfigError]:
    """A ConfigError for each top-level key Ray's cluster schema does not allow (`max_worker`: did you mean
    `max_workers`?), found before the missing keys they may stand for are reported."""
    schema = ray_schema()
    if schema is None or schema.get("additionalProperties") is not False:
        return []
    props = schema.get("properties") or {}
    patterns = schema.get("patternProperties") or {}
    # Ray's legacy `head_node` / `worker_nodes` keys: its config preparation merges them away before the schema
    # check, so a YAML holding them is valid for `ray up`.
    return [_unknown(str(k), str(k), props) for k in sorted(cluster_config, key=str)
            if k not in props and k not in RAY_LEGACY_KEYS and not any(re.search(p, str(k)) for p in patterns)]


def _unknown(key: str, name: str, props: Mapping[str, Any]) -> ConfigError:
    close = suggest_key(name, props)
    if close:
        return ConfigError(key, f"unknown key {name!r} (Ray's cluster schema allows no other); did you mean "
                                f"{close!r}?")
    return ConfigError(key, f"unknown key {name!r} (Ray's cluster schema allows no other); Ray's keys here: "
                            f"{', '.join(sorted(props))}")


def check_ray_schema(cluster_config: DocumentView) -> None:
    """ConfigError naming the key where `cluster_config` breaks Ray's cluster schema (see the module docstring)."""
    schema = ray_schema()
    if schema is None:
        return
    config = {k: v for k, v in cluster_config.items() if not (k in LEGACY_KEYS and not v)}
    _check(schema, schema, config, "")
