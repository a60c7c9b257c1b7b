"""GCE labels for Ray tags: a reversible mapping, and a metadata manifest for what labels cannot hold.

Tags and labels
---------------
Ray tags are stored as GCE labels set in the insert body, so no instance ever exists untagged. GCE labels allow
only lowercase `[a-z0-9_-]`, keys starting with a letter, at most 63 characters. The mapping is reversible:

- `encode_label_text`: `[a-z0-9-]` stay as they are; every other character (including `_` itself, upper case,
  `.`, `/`, non-ASCII) becomes `_` + two lowercase hex digits per UTF-8 byte. `Head.Node` -> `_48ead_2e_4eode`.
  Decoding is unambiguous because `_` never appears unescaped.
- a tag whose encoded key is not a valid label key, or whose encoded value is longer than 63 characters, is not a
  label: it is kept exactly in the instance metadata item `nodeless-tags` (JSON), with the list of the tag keys
  that *are* labels. Listing reads both back, so `list_machines` returns exactly the tags that were given, and
  labels the user set through `node_config.labels` are not mistaken for tags.
- `ray-cluster-name` is always a label (the listing filters on it). If the encoded cluster name is too long the
  label holds a truncated encoding plus a hash, and the exact name lives in the metadata item; the listing checks
  the exact name client-side.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable

from ray_nodeless.providers.base import TAG_CLUSTER

logger = logging.getLogger(__name__)

METADATA_TAGS_KEY = "nodeless-tags"
# GCE's limit on a label key or value (and on an instance name).
MAX_LABEL_LEN = 63
# Hex digits of sha256 in a hashed cluster label: 48 bits tell clusters apart; the listing checks the exact name.
CLUSTER_HASH_LEN = 12
_HASHED_MARK = "-h-"

# ----------------------------------------------------------------------------------------- label mapping

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
LABEL_KEY_RE = re.compile(r"[a-z][-_a-z0-9]{0,62}")
LABEL_VALUE_RE = re.compile(r"[-_a-z0-9]{0,63}")


def encode_label_text(text: str) -> str:
    """Reversible escape of any string into the GCE label alphabet (see module docstring)."""
    out: list[str] = []
    for ch in text:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def decode_label_text(text: str) -> str:
    """Inverse of `encode_label_text`; raises ValueError for text it could not have produced."""
    buf = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "_":
            hx = text[i + 1:i + 3]
            if len(hx) != 2 or any(c not in "0123456789abcdef" for c in hx):
                raise ValueError(f"bad escape in label text {text!r}")
            buf.append(int(hx, 16))
            i += 3
        elif ch in _PLAIN:
            buf.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"character {ch!r} cannot appear in encoded label text {text!r}")
    return buf.decode("utf-8", "surrogatepass")


def label_pair(key: str, value: str) -> tuple[str, str] | None:
    """The (label key, label value) storing this tag losslessly, or None if it has to go to metadata."""
    k = encode_label_text(key)
    v = encode_label_text(value)
    if not LABEL_KEY_RE.fullmatch(k) or len(v) > MAX_LABEL_LEN:
        return None
    return k, v


def cluster_label_value(cluster_name: str) -> str:
    """The `ray-cluster-name` label value the listing filters on (lossless when it fits, hashed otherwise)."""
    enc = encode_label_text(cluster_name)
    if len(enc) <= MAX_LABEL_LEN:
        return enc
    digest = hashlib.sha256(cluster_name.encode("utf-8", "surrogatepass")).hexdigest()[:CLUSTER_HASH_LEN]
    # cut before a partial escape so the label stays in the alphabet; `-h-` marks it as hashed
    head = enc[:MAX_LABEL_LEN - len(_HASHED_MARK) - CLUSTER_HASH_LEN]
    cut = head.rfind("_")
    if cut >= 0 and cut > len(head) - 3:
        head = head[:cut]
    return f"{head}{_HASHED_MARK}{digest}"


@dataclass
class TagStorage:
    """How one set of tags is stored on an instance: labels plus the metadata manifest."""

    labels: dict[str, str]
    manifest: dict[str, Any]

    def metadata_value(self) -> str:
        return json.dumps(self.manifest, sort_keys=True, separators=(",", ":"))


def tags_to_storage(tags: dict[str, str], request_id: str | None = None) -> TagStorage:
    labels: dict[str, str] = {}
    label_keys: list[str] = []
    extra: dict[str, str] = {}
    for k, v in tags.items():
        pair = label_pair(k, v)
        if pair is None:
            extra[k] = v
        else:
            labels[pair[0]] = pair[1]
            label_keys.append(k)
    cluster = tags.get(TAG_CLUSTER)
    if cluster is not None and TAG_CLUSTER in extra:
        labels[TAG_CLUSTER] = cluster_label_value(cluster)   # filterable stand-in; the exact name is in `extra`
    manifest: dict[str, Any] = {"v": 1, "label_keys": sorted(label_keys), "tags": extra}
    if request_id is not None:
        manifest["request_id"] = request_id
    return TagStorage(labels, manifest)


def manifest_from_items(items: Iterable[Any]) -> dict[str, Any] | None:
    for item in items:
        key = item.get("key") if isinstance(item, dict) else getattr(item, "key", None)
        if key == METADATA_TAGS_KEY:
            raw = item.get("value") if isinstance(item, dict) else getattr(item, "value", "")
            try:
                doc = json.loads(raw or "")
            except ValueError:
                logger.warning("instance metadata %s is not JSON; ignoring it", METADATA_TAGS_KEY)
                return None
            return doc if isinstance(doc, dict) else None
    return None


def tags_from_storage(labels: dict[str, str], manifest: dict[str, Any] | None) -> dict[str, str]:
    """Tags of an instance from its labels and metadata manifest (inverse of `tags_to_storage`)."""
    decoded: dict[str, str] = {}
    for k, v in labels.items():
        try:
            decoded[decode_label_text(k)] = decode_label_text(v)
        except (ValueError, UnicodeDecodeError):
            continue  # a label we did not write (e.g. hand-set with a bare `_`)
    if manifest is None:
        # Not written by this backend (e.g. Ray's own GCP provider): every decodable label counts as a tag.
        return decoded
    tags = {k: decoded[k] for k in manifest.get("label_keys", []) if k in decoded}
    tags.update({str(k): str(v) for k, v in (manifest.get("tags") or {}).items()})
    return tags
