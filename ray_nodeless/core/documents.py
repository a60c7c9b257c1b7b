"""The one name for an untyped document at the seams of ray_nodeless.

A YAML or JSON document (or a part of one) as `yaml.safe_load` / `json.load` return it, or as we build one for a
`--json` output or a file: a cluster YAML, its provider block, a node_config, a catalog file, a plan record. Its
values are any YAML/JSON node; each is checked where it is read (a pydantic section, or a check raising ConfigError
naming the key), which is what types it. `Any` here, once, because that is what such a value is until read: `object`
would make every reader cast, and a recursive JSON type would not describe a YAML document (keys of any kind,
dates) either. A function that checks what it reads with isinstance takes `object` or `Mapping[str, object]`
instead (the parsers of settings.py, rules.py, prices.py, requirements.py).
"""
from __future__ import annotations

from typing import Any, Mapping

Document = dict[str, Any]           # one we build or may change (Any: each value is checked where it is read)
DocumentView = Mapping[str, Any]    # one we only read (Any: likewise)
