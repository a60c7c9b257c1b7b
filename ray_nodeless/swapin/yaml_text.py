"""Writing a converted cluster YAML with the user's comments, using PyYAML only (ruamel.yaml is not a dependency).

PyYAML drops comments when it loads a document, but its node tree knows where every key and value sits in the
text. So the writer copies text instead of re-dumping it wherever it can: a key whose value did not change is
copied verbatim with the comment lines above it (and its inline comments); a block mapping whose value changed is
written key by key the same way; only a changed value that is not a block mapping (a flow mapping, a list, a
scalar) and a new key are dumped fresh, at the indentation of their siblings. Top-level keys the YAML lacked are
copied, comments included, from a second source (Ray's defaults.yaml, where they came from) when their value is
the same. Notes (`# ...` lines) can be placed before any key, also before a key that was removed.

The result is checked: it must load to exactly the converted document. If it does not (anchors, merge keys or
any layout this writer does not handle), the whole document is dumped fresh and `comments_kept` is False.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

STR_TAG = "tag:yaml.org,2002:str"
NOTE_WIDTH = 112


class _Unsupported(Exception):
    """A layout this writer does not copy; the caller falls back to a fresh dump."""


@dataclass
class _Source:
    lines: list[str]
    root: yaml.MappingNode
    value: dict

    @classmethod
    def parse(cls, text: str) -> "_Source":
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        value = yaml.safe_load(text)
        if not isinstance(root, yaml.MappingNode) or root.flow_style or not isinstance(value, dict):
            raise _Unsupported("the document is not a block mapping")
        if not _plain_keys(root):
            raise _Unsupported("top-level keys that are not plain strings")
        return cls(lines, root, value)

    def last_line(self, node: yaml.Node) -> int:
        """The last line holding content of `node` (trailing blank and comment lines excluded)."""
        if isinstance(node, yaml.ScalarNode):
            line = node.end_mark.line if node.end_mark.column > 0 else node.end_mark.line - 1
            if node.style in ("|", ">"):
                while line > node.start_mark.line and not self.lines[line].strip():
                    line -= 1
            return max(line, node.start_mark.line)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            if node.flow_style or not node.value:
                return node.end_mark.line if node.end_mark.column > 0 else node.end_mark.line - 1
            last = node.value[-1]
            return self.last_line(last[1] if isinstance(node, yaml.MappingNode) else last)
        raise _Unsupported(f"node {node!r}")


@dataclass
class _Child:
    key: str
    knode: yaml.Node
    vnode: yaml.Node
    lead: list[str]          # comment / blank lines between the previous sibling and this key
    first: int               # the key's line
    last: int                # the value's last content line


def _plain_keys(node: yaml.MappingNode) -> bool:
    return all(isinstance(k, yaml.ScalarNode) and k.tag == STR_TAG for k, _ in node.value)


def _children(src: _Source, node: yaml.MappingNode, start_line: int) -> tuple[list[_Child], int]:
    out = []
    prev = start_line - 1
    for k, v in node.value:
        first = k.start_mark.line
        last = src.last_line(v)
        out.append(_Child(k.value, k, v, src.lines[prev + 1:first], first, last))
        prev = last
    return out, prev


def _note_lines(notes: Iterable[str], col: int) -> list[str]:
    out = []
    for note in notes:
        for line in textwrap.wrap(note, NOTE_WIDTH - col - 2) or [""]:
            out.append(" " * col + "# " + line + "\n")
    return out


def _fresh(key: str, value: Any, col: int) -> list[str]:
    text = yaml.safe_dump({key: value}, default_flow_style=False, sort_keys=False, width=4096, allow_unicode=True)
    return [(" " * col + line) if line.strip() else line for line in text.splitlines(keepends=True)]


class _Writer:
    def __init__(self, notes: Mapping[tuple[str, ...], list[str]]):
        self.notes = notes

    def mapping(self, sources: list[tuple[_Source, yaml.MappingNode, dict, int]], new: dict,
                path: tuple[str, ...], col: int | None) -> list[str]:
        """The lines of mapping `new` at `path`; `sources` are (source, node, old value, first line) where its
        keys can be copied from, in order of preference."""
        known: dict[str, tuple[_Source, _Child, Any]] = {}
        order: list[str] = []
        for src, node, old, start in sources:
            children, _ = _children(src, node, start)
            for c in children:
                if c.key not in known:
                    known[c.key] = (src, c, old.get(c.key))
                    order.append(c.key)
                    if col is None:
                        col = c.knode.start_mark.column
        col = col or 0
        out: list[str] = []
        # notes of keys that were removed go where the key was
        removed = [k for k in order if k not in new]
        for key in new:
            if key in known:
                for gone in [k for k in removed if order.index(k) < order.index(key)]:
                    out += _note_lines(self.notes.get(path + (gone,), []), col)
                    removed.remove(gone)
            if key not in known:
                out += _note_lines(self.notes.get(path + (key,), []), col)
                out += _fresh(key, new[key], col)
                continue
            src, c, old = known[key]
            out += c.lead
            out += _note_lines(self.notes.get(path + (key,), []), col)
            if old == new[key] and type(old) is type(new[key]):
                out += src.lines[c.first:c.last + 1]
            elif (isinstance(c.vnode, yaml.MappingNode) and not c.vnode.flow_style and c.vnode.value
                  and _plain_keys(c.vnode) and isinstance(new[key], dict) and new[key]
                  and c.vnode.start_mark.line > c.first and isinstance(old, dict)):
                out.append(src.lines[c.first])
                out += self.mapping([(src, c.vnode, old, c.first + 1)], new[key], path + (key,), None)
            else:
                out += _fresh(key, new[key], col)
        for gone in removed:
            out += _note_lines(self.notes.get(path + (gone,), []), col)
        return out


def render(new: Mapping[str, Any], text: str | None, defaults_text: str | None = None,
           notes: Mapping[tuple[str, ...], list[str]] | None = None, header: Iterable[str] = ()) -> tuple[str, bool]:
    """The YAML text of `new`, copying from `text` (the user's file) and `defaults_text` (where keys the file
    lacks came from) what still applies. Returns (text, comments_kept)."""
    new = dict(new)
    head = _note_lines(header, 0)
    try:
        if text is None:
            raise _Unsupported("no source text")
        sources = [_Source.parse(text)]
        if defaults_text is not None:
            sources.append(_Source.parse(defaults_text))
        writer = _Writer(notes or {})
        user = sources[0]
        body = writer.mapping([(s, s.root, s.value, 0) for s in sources], new, (), 0)
        _, last = _children(user, user.root, 0)
        tail = user.lines[last + 1:]
        out = "".join(head + body + tail)
        if yaml.safe_load(out) != new:
            raise _Unsupported("the copied text does not load to the converted document")
        return out, True
    except (_Unsupported, yaml.YAMLError):
        fresh = yaml.safe_dump(new, default_flow_style=False, sort_keys=False, width=4096, allow_unicode=True)
        return "".join(head) + fresh, False
