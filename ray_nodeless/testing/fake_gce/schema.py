"""Request bodies checked against the real Compute API schema: the discovery document shipped with
google-api-python-client (`compute.v1.json`). Unknown fields and wrong JSON types answer HTTP 400 with a GCE-style
error body, so a body the fake accepts is one GCE would parse.
"""
from __future__ import annotations

import json
import os
import re
import threading
from typing import Any


def _discovery_path() -> str:
    import googleapiclient  # test extra; ships the Compute discovery document

    return os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "compute.v1.json")


_DISCOVERY: dict | None = None
_DISCOVERY_LOCK = threading.Lock()


def discovery() -> dict:
    """The Compute v1 discovery document, parsed once per process (5 MB, ~0.1 s)."""
    global _DISCOVERY
    with _DISCOVERY_LOCK:
        if _DISCOVERY is None:
            with open(_discovery_path(), encoding="utf-8") as f:
                _DISCOVERY = json.load(f)
        return _DISCOVERY


class ApiError(Exception):
    """An error the fake answers with a GCE-style JSON body."""

    def __init__(self, status: int, message: str, reason: str = "invalid", domain: str = "global"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.domain = domain

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}]}}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_INT_RE = re.compile(r"-?\d+")


def validate(value: Any, schema: dict, path: str) -> None:
    """Check `value` against a discovery-document schema; raise ApiError(400) the way GCE's JSON parser does.

    Follows `$ref`s into `schemas`, inline `properties`/`items`/`additionalProperties`, and the JSON mapping of
    proto3 scalar types: int64/uint64 are strings (numbers accepted too), int32 numbers (numeric strings
    accepted), booleans strict, enums checked against the listed values.
    """
    schemas = discovery()["schemas"]
    while "$ref" in schema:
        schema = schemas[schema["$ref"]]
    typ = schema.get("type")
    if typ == "object" or "properties" in schema:
        if not isinstance(value, dict):
            raise ApiError(400, f"Invalid value at '{path}', expected an object: {json.dumps(value)}")
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if props is not None and k in props:
                validate(v, props[k], f"{path}.{_snake(k)}")
            elif extra is not None:
                validate(v, extra, f"{path}[{k}]")
            else:
                raise ApiError(400, f"Invalid JSON payload received. Unknown name \"{k}\" at '{path}': "
                                    "Cannot find field.")
        return
    if typ == "array":
        if not isinstance(value, list):
            raise ApiError(400, f"Invalid value at '{path}', expected a list: {json.dumps(value)}")
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{path}[{i}]")
        return
    if typ == "boolean":
        if not isinstance(value, bool):
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_BOOL), {json.dumps(value)}")
        return
    if typ == "integer" or (typ == "string" and schema.get("format") in ("int64", "uint64")):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and _INT_RE.fullmatch(value) is not None)
        if not ok:
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_INT64), {json.dumps(value)}")
        return
    if typ == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_DOUBLE), {json.dumps(value)}")
        return
    if typ == "string":
        if not isinstance(value, str):
            raise ApiError(400, f"Invalid value at '{path}' (TYPE_STRING), {json.dumps(value)}")
        enum = schema.get("enum")
        if enum is not None and value not in enum:
            raise ApiError(400, f"Invalid value at '{path}' (type.googleapis.com/enum), \"{value}\"")
        return
    if typ == "any" or typ is None:
        return
    raise ApiError(500, f"fake_gce: unsupported schema type {typ!r} at {path}")


def validate_body(body: Any, schema_name: str, path: str) -> None:
    validate(body, {"$ref": schema_name}, path)
