#!/usr/bin/env python3
"""Write the two small cloud schemas the config checks read instead of importing a cloud SDK:

    .venv/bin/python scripts/vendor_cloud_schemas.py            # rewrite both from the installed SDKs
    .venv/bin/python scripts/vendor_cloud_schemas.py --check    # exit 1 if either differs from the installed SDKs

- `ray_nodeless/providers/aws/run_instances_keys.py`: the member names of botocore's EC2 RunInstances input shape
  (what `node_config` may hold, as Ray's AWS provider passes it to RunInstances) and every shape it contains (type,
  members, required members, list member), with the botocore version.
- `ray_nodeless/providers/gcp/instance_schema.py`: every field of google-cloud-compute's `Instance` message and the
  messages it contains (JSON name, proto name, kind, repeated), with the google-cloud-compute version.

At run time each is used only when the installed SDK has the version it was written from; otherwise the checks
read the SDK itself (slower, same answers). tests/providers/test_vendored_schemas.py fails when either file no
longer matches the installed SDKs: rerun this script then. Same input, byte-identical output.
"""
from __future__ import annotations

import argparse
import pprint
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AWS_OUT = ROOT / "ray_nodeless" / "providers" / "aws" / "run_instances_keys.py"
GCP_OUT = ROOT / "ray_nodeless" / "providers" / "gcp" / "instance_schema.py"


def aws_text() -> str:
    import botocore
    import botocore.session

    service = botocore.session.get_session().get_service_model("ec2")
    root = service.operation_model("RunInstances").input_shape
    keys = sorted(root.members)
    body = "\n".join(f"    {k!r}," for k in keys)
    shapes: dict[str, tuple] = {}

    def walk(shape) -> None:
        if shape.name in shapes:
            return
        if shape.type_name == "structure":
            shapes[shape.name] = ("structure", {n: m.name for n, m in sorted(shape.members.items())},
                                  tuple(sorted(shape.required_members)))
            for m in shape.members.values():
                walk(m)
        elif shape.type_name == "list":
            shapes[shape.name] = ("list", shape.member.name, ())
            walk(shape.member)
        elif shape.type_name == "map":
            shapes[shape.name] = ("map", shape.value.name, ())
            walk(shape.value)
        else:
            shapes[shape.name] = (shape.type_name, "", ())

    walk(root)
    return (
        '"""The member names of botocore\'s EC2 RunInstances input shape, written by scripts/vendor_cloud_schemas.py\n'
        'from the botocore version below (do not edit by hand). Read by providers/aws/settings.py so that checking a\n'
        'node_config does not import botocore (about 0.4 s); used only when that botocore version is installed."""\n'
        "\n"
        f"BOTOCORE_VERSION = {botocore.__version__!r}\n"
        "\n"
        "RUN_INSTANCES_MEMBERS = frozenset({\n"
        f"{body}\n"
        "})\n"
        "\n"
        "# shape name -> (type, members {name: shape} | list member shape | '', required members); the request is\n"
        f"# shape {root.name!r}.\n"
        f"RUN_INSTANCES_ROOT = {root.name!r}\n"
        f"RUN_INSTANCES_SHAPES = {pprint.pformat(dict(sorted(shapes.items())), width=116, sort_dicts=True)}\n")


def gcp_schema() -> tuple[str, dict[str, dict[str, tuple[str, bool, str]]]]:
    """(google-cloud-compute version, {message: {field name (JSON and proto): (kind, repeated, message)}})."""
    from google.cloud import compute_v1
    from google.cloud.compute_v1 import gapic_version
    from google.protobuf.descriptor import FieldDescriptor as FD

    kinds = {FD.TYPE_STRING: "string", FD.TYPE_BOOL: "bool", FD.TYPE_INT32: "int32", FD.TYPE_INT64: "int64",
             FD.TYPE_UINT32: "uint32", FD.TYPE_UINT64: "uint64", FD.TYPE_DOUBLE: "double",
             FD.TYPE_FLOAT: "float", FD.TYPE_MESSAGE: "message"}
    root = compute_v1.Instance.pb().DESCRIPTOR
    schema: dict[str, dict[str, tuple[str, bool, str]]] = {}

    def walk(m) -> None:
        if m.name in schema:
            return
        fields: dict[str, tuple[str, bool, str]] = {}
        schema[m.name] = fields
        for f in m.fields:
            if f.containing_oneof is not None and len(f.containing_oneof.fields) > 1:
                kind = "unsupported"          # a real oneof: left to the SDK's own parser
            elif f.type == FD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
                k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
                kind = "map" if (k.type, v.type) == (FD.TYPE_STRING, FD.TYPE_STRING) else "unsupported"
            else:
                kind = kinds.get(f.type, "unsupported")
            target = f.message_type.name if kind == "message" else ""
            spec = (kind, f.is_repeated and kind != "map", target)
            for name in {f.json_name, f.name}:
                fields[name] = spec
            if kind == "message":
                walk(f.message_type)

    walk(root)
    return gapic_version.__version__, {m: dict(sorted(f.items())) for m, f in sorted(schema.items())}


def gcp_text() -> str:
    version, schema = gcp_schema()
    return (
        '"""Every field of google-cloud-compute\'s `Instance` message and of the messages it contains, written by\n'
        "scripts/vendor_cloud_schemas.py from the google-cloud-compute version below (do not edit by hand): message ->\n"
        "{field name, JSON and proto spelling: (kind, repeated, message type)}. Read by providers/gcp/node_config.py\n"
        "so that checking a node_config does not import the Compute client (seconds); used only when that version is\n"
        'installed."""\n'
        "\n"
        f"COMPUTE_VERSION = {version!r}\n"
        "\n"
        f"SCHEMA = {pprint.pformat(schema, width=116, sort_dicts=True)}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a file is stale")
    args = ap.parse_args()
    stale = []
    for path, text in ((AWS_OUT, aws_text()), (GCP_OUT, gcp_text())):
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text)
    verb = "stale" if args.check else "written"
    for p in stale:
        print(f"{verb}: {p}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
