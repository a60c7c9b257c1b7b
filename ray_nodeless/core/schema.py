"""Declared settings: pydantic v2 models turned into errors that name the key.

Every part of the provider block (the core keys, each backend's keys, each registration's keys) is declared once as
a pydantic model deriving from `Section`. `parse_section` validates a mapping against one and raises `ConfigError`
with the dotted key at fault (`provider.aws_max_attempts: must be an integer, got 'five'`); an unknown key that is
close to a declared one is an error with a did-you-mean suggestion (`suggest_key`).
"""
from __future__ import annotations

import difflib
from typing import Iterable, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from ray_nodeless.errors import ConfigError, ConfigErrors

S = TypeVar("S", bound="Section")


class Section(BaseModel):
    """A declared settings section. Strict types (no "5" for 5, no 1 for True), finite numbers only, immutable.
    Keys the section does not declare are ignored here: the caller decides what an unknown key means (the provider
    block holds Ray's keys and other sections' keys too)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", allow_inf_nan=False,
                              arbitrary_types_allowed=True)


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_MESSAGES = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "list_type": "must be a list",
    "finite_number": "must be a finite number",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "literal_error": "must be one of {expected}",
    "string_too_short": "must not be empty",
    "missing": "is required",
    "extra_forbidden": "unknown key",
}


def _message(err: ErrorDetails) -> str:
    ctx: dict[str, object] = err.get("ctx") or {}
    template = _MESSAGES.get(err["type"])
    if template is None:
        return err["msg"][0].lower() + err["msg"][1:]
    try:
        return template.format(**ctx)
    except (KeyError, IndexError):
        return err["msg"]


def _model_at(model: type[BaseModel] | None, loc: list[str]) -> type[BaseModel] | None:
    """The (nested) model that holds the last key of `loc`: `reversion.max_inflight` -> ReversionSettings."""
    for name in loc[:-1]:
        field = model.model_fields.get(name) if model is not None else None
        annotation = getattr(field, "annotation", None)
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


def config_error(exc: ValidationError, prefix: str, model: type[BaseModel] | None = None) -> ConfigError:
    """A pydantic ValidationError as a ConfigError naming `prefix.<path>`: the first error, except that every
    missing required key is named in one error (a user fixes them in one edit, not one run each). `model`: the
    model validated, whose declared keys an unknown nested key is compared with for a did-you-mean."""
    errors = sorted(exc.errors(include_url=False), key=lambda e: [str(p) for p in e["loc"]])
    missing = [e for e in errors if e["type"] == "missing"]
    err = errors[0] if len(missing) < 2 else missing[0]
    cause = (err.get("ctx") or {}).get("error")
    if err["type"] == "value_error" and isinstance(cause, ConfigError):
        return cause     # a field parsed by our own parser (rules, exclude): its error names the nested key already
    loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
    key = ".".join([prefix, *loc]) if loc else prefix
    if err["type"] == "extra_forbidden" and loc:
        holder = _model_at(model, loc)
        return unknown_key(key, loc[-1], declared_keys(holder) if holder is not None else ())
    if len(missing) > 1:
        return ConfigErrors([ConfigError(".".join([prefix, *[str(p) for p in e["loc"]]]), "is required")
                             for e in missing])
    msg = _message(err)
    if err["type"] != "missing":
        msg += f", got {_describe(err.get('input'))}"
    return ConfigError(key, msg)


def parse_section(model: type[S], data: object, prefix: str) -> S:
    """Validate `data` against `model`; any failure is a ConfigError naming the key."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, f"must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise config_error(e, prefix, model) from None


def missing_keys(model: type[BaseModel], data: Mapping[str, object], prefix: str) -> list[ConfigError]:
    """A ConfigError for each key `model` requires that `data` lacks (checked before the values are, so that every
    missing key of a block is named at once)."""
    return [ConfigError(f"{prefix}.{field.alias or name}", "is required")
            for name, field in model.model_fields.items() if field.is_required() and (field.alias or name) not in data]


def unknown_key(key: str, name: str, known: Iterable[str], what: str = "key") -> ConfigError:
    """The error for a key no schema declares: `<key>: unknown key 'regoin'; did you mean 'region'?`, else the
    known keys (when there are few enough to read)."""
    known = sorted(set(known))
    close = suggest_key(str(name), known)
    if close:
        return ConfigError(key, f"unknown {what} {name!r}; did you mean {close!r}?")
    listing = f"; known keys: {', '.join(known)}" if 0 < len(known) <= 40 else ""
    return ConfigError(key, f"unknown {what} {name!r}{listing}")


def declared_keys(*models: type[BaseModel]) -> frozenset[str]:
    """The keys (field names and aliases) these models declare."""
    keys: set[str] = set()
    for m in models:
        for name, field in m.model_fields.items():
            keys.add(field.alias or name)
    return frozenset(keys)


def suggest_key(key: str, known: Iterable[str], cutoff: float = 0.75) -> str | None:
    """The known key `key` is probably a misspelling of, or None: a case slip first, then difflib's closest match
    (as typed, then ignoring case: `instancetyp` -> `InstanceType`), then a known key `key` is the start of
    (`min_memory` -> `min_memory_gib`, `max_worker` -> `max_workers`) when only one is."""
    known = sorted(set(known))
    lowered = {k.lower(): k for k in known}
    if key.lower() in lowered and lowered[key.lower()] != key:
        return lowered[key.lower()]          # a case slip: `GPUS` for `GPU`, `Endpoint_url` for `endpoint_url`
    close = difflib.get_close_matches(key, known, n=1, cutoff=cutoff)
    if close:
        return close[0]
    close = difflib.get_close_matches(key.lower(), sorted(lowered), n=1, cutoff=cutoff)
    if close:
        return lowered[close[0]]
    starts = [k for k in known if len(key) >= 3 and k.lower().startswith(key.lower())]
    return starts[0] if len(starts) == 1 else None
