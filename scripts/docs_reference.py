"""Writes docs/reference/provider-keys.md, the provider-block reference, from the settings' pydantic models.

Why generated: every provider key is declared once, as a field of a `Section` model (the core's in core/settings.py,
each backend's and registration's in its own settings.py), and that model is what parses the block. A reference
written by hand would drift from it; this one is the models' own fields, types, defaults and bounds, with the
comment the source puts beside each field. tests/docs/test_docs_reference.py fails when the committed page differs
from what this script writes, so a new or changed key needs `python scripts/docs_reference.py` in the same commit.

    python scripts/docs_reference.py            # rewrites docs/reference/provider-keys.md
    python scripts/docs_reference.py --check    # exit 1 if the committed page is stale
"""
from __future__ import annotations

import argparse
import ast
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference" / "provider-keys.md"
# The built-in backends, by name: not `providers.backend_names()`, which lists third-party backends registered at
# run time too (the tests register fakes); tests/docs/test_docs_reference.py checks this against providers/.
BACKENDS = ("aws", "gcp", "local")


def _sections() -> list[tuple[str, str, type]]:
    """(title, when it applies, model) for every section the loader (operate/config.py) parses a block with."""
    from ray_nodeless import providers, registrations
    from ray_nodeless.core.settings import CoreSettings
    from ray_nodeless.providers.local.settings import KubeletPlayerSettings, LocalPlayerSettings

    out: list[tuple[str, str, type]] = [("Core", "every provider block", CoreSettings)]
    for cloud in BACKENDS:
        out.append((f"Backend `{cloud}`", f"`cloud: {cloud}`", providers.backend_config(cloud).settings_model))
    for name in registrations.REGISTRATIONS:
        out.append((f"Registration `{name}`", f"`registration: {name}`",
                    registrations.registration_class(name).settings_model))
    out.append(("Played machines: Ray-node player", "`registration: local-player`", LocalPlayerSettings))
    out.append(("Played machines: kubelet player", "`registration: kubernetes` with `kubernetes.played: true`",
                KubeletPlayerSettings))
    return out


def _comments(cls: type) -> dict[str, str]:
    """A field's trailing `# comment` in the class's source (the lines of its declaration), by field name."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    (node,) = ast.parse(src).body
    assert isinstance(node, ast.ClassDef)
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            end = stmt.end_lineno or stmt.lineno
            text = " ".join(by_line[n] for n in range(stmt.lineno, end + 1) if n in by_line)
            if text:
                out[stmt.target.id] = text
    return out


def _field_comments(model: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):          # a subclass's comment wins over its base's
        if cls.__module__.startswith("ray_nodeless"):
            out.update(_comments(cls))
    return out


def _type(ann: object) -> str:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) if not isinstance(a, str) else f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin in (dict, list, tuple, frozenset, set):
        inner = ", ".join("..." if a is Ellipsis else _type(a) for a in args)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if isinstance(ann, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                "object": "any"}.get(ann.__name__, ann.__name__)
    return "any" if ann is typing.Any else str(ann).replace("typing.", "")


def _constraints(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        for kind, attr, sign in ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<")):
            if isinstance(m, kind):
                parts.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, MinLen) and m.min_length:
            parts.append("non-empty" if m.min_length == 1 else f"length >= {m.min_length}")
        if isinstance(m, MaxLen):
            parts.append(f"length <= {m.max_length}")
        pattern = getattr(m, "pattern", None)
        if pattern:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        if isinstance(value, (dict, list, tuple)) and not value:
            return f"`{value!r}`".replace("()", "[]")
        return f"(a default `{type(value).__name__}`)"
    if info.default is PydanticUndefined:
        return "**required**"
    if info.default is None:
        return "`null`"
    if isinstance(info.default, bool):
        return f"`{str(info.default).lower()}`"
    return f"`{info.default!r}`" if not isinstance(info.default, str) else f'`"{info.default}"`'


def _nested_model(ann: object) -> tuple[type | None, bool]:
    """The Section a field holds (`X`, `X | None`, or a list / tuple of `X`), whose keys are listed under the
    field's dotted name, and whether it is a list of them."""
    from ray_nodeless.core.schema import Section

    def section(a: object) -> bool:
        return isinstance(a, type) and issubclass(a, Section)

    for a in (ann, *typing.get_args(ann)):
        if section(a):
            return a, False
        if typing.get_origin(a) in (list, tuple):
            inner = [x for x in typing.get_args(a) if section(x)]
            if inner:
                return inner[0], True
    return None, False


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(model: type, prefix: str, seen: set[type]) -> list[str]:
    comments = _field_comments(model)
    rows, nested = [], []
    for name, info in model.model_fields.items():
        key = f"{prefix}{info.alias or name}"
        sub, many = _nested_model(info.annotation)
        if sub is None:
            kind = _type(info.annotation)
        else:
            kind = f"list of mappings ({sub.__name__})" if many else f"mapping ({sub.__name__})"
        rows.append(f"| `{key}` | {kind} | {_default(info)} | {_cell(_constraints(info))} | "
                    f"{_cell(comments.get(name, ''))} |")
        if sub is not None and sub not in seen:
            nested.append((key + ("[]" if many else ""), sub))
    for key, sub in nested:
        rows += _rows(sub, key + ".", seen | {sub})
    return rows


def render() -> str:
    out = ["# Provider keys (generated)", "",
           "<!-- Written by scripts/docs_reference.py from the settings' models; do not edit by hand. -->", "",
           "Every key of a cluster YAML's `provider:` block, as the models that parse it declare it: its type, its "
           "default, its bounds, and the comment beside it in the source. A section applies when its condition "
           "holds; keys of a section that does not apply are unknown keys (an error, with a did-you-mean). What "
           "the keys mean in context: [Configuration](../configuration.md), [Rules and exclusions](../rules.md) "
           "(the constraint keys of `rules` and `exclude`), [Capacity](../capacity.md) (`reversion`). The groups "
           "(`open`, `metrics`, `idle`) are also read in their flat spellings of before (`open_shapes`, "
           "`metrics_port`, ...: [Configuration](../configuration.md), Groups).", ""]
    from ray_nodeless.core.schema import Section

    for title, when, model in _sections():
        doc = inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        if model is Section:             # a registration that declares no key of its own
            out += [f"## {title}", "", f"Applies with {when}. No keys of its own.", ""]
            continue
        out += [f"## {title}", "", f"Applies with {when}. Model: `{model.__module__}.{model.__qualname__}`."
                + (f" {doc}" if doc else ""), "",
                "| key | type | default | bounds | note |", "|---|---|---|---|---|", *_rows(model, "", {model}), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed page differs")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/docs_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
