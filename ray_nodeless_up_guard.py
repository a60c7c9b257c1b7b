"""The `ray up` start-up guard: names the key for the cluster-YAML shapes Ray 2.60's own `ray up` code crashes on
(a traceback) before it imports any node provider, so that no plugin code could name them.

`ray_nodeless_up_guard.pth` (installed at the root of site-packages by the wheel and by `pip install -e .`) runs
`main()` at interpreter start-up when "up" is among the arguments; main() goes on only for the `ray` console script.
`main()` then parses the command line as Ray's click command would (`ray [group options] up [options] FILE`), loads
the file as Ray does (`yaml.safe_load`) and replays the steps `create_or_update_cluster` takes before the provider's
import: `config["provider"]["type"]`, `config["cluster_name"]`, then `prepare_config` (`fillout_defaults` with
Ray's MINIMAL_EXTERNAL_CONFIG, `merge_setup_commands`, `validate_docker_config`, `fill_node_type_min_max_workers`)
and the config cache's `json.dumps(config, sort_keys=True)`. Where one of those would raise, it prints
`ray-nodeless: <file>: <key>: <what is wrong>` and exits 1 before Ray runs.

It never changes what happens otherwise: any doubt (another command, `--help`, an option it does not know, a
URL, a file Ray cannot read or parse, a provider type other than `external`, Ray's legacy head_node/worker_nodes
merge) means it returns and Ray runs as if it were not there. It imports neither Ray nor ray_nodeless (the check
must cost nothing for every other Python process), patches nothing, and `ray-nodeless plan` runs the same
`refusal()` (cli/plan.py) so that both name the same key. tests/config/test_up_guard.py holds its argument cases
and checks the flag tables against the installed Ray's click command.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

# `ray` group options before the subcommand, and `ray up`'s own (ray/scripts/scripts.py, with cli_logger's
# logging options): those that take a value, the flags, and the ones whose value must parse for click to proceed.
GROUP_VALUE_OPTIONS = frozenset({"--logging-level", "--logging-format"})
UP_VALUE_OPTIONS = {"--min-workers": "min_workers", "--max-workers": "max_workers", "--cluster-name": "cluster_name",
                    "-n": "cluster_name", "--log-style": None, "--log-color": None}
UP_FLAGS = frozenset({"--no-restart", "--restart-only", "--yes", "-y", "--no-config-cache",
                      "--redirect-command-output", "--use-login-shells", "--use-normal-shells",
                      "--disable-usage-stats", "--verbose", "-v"})
UP_SHORT_FLAGS = frozenset("yv")
INT_OPTIONS = frozenset({"min_workers", "max_workers"})
# ray/autoscaler/_private/providers.py MINIMAL_EXTERNAL_CONFIG: what fillout_defaults merges under an external
# provider's config.
EXTERNAL_DEFAULTS = {"available_node_types": {"ray.head.default": {}, "ray.worker.default": {}},
                     "head_node_type": "ray.head.default", "head_node": {}, "worker_nodes": {}}
SETUP_KEYS = ("setup_commands", "head_setup_commands", "worker_setup_commands")
JSON_SCALARS = (str, int, float, bool, type(None))


class RayUpRefused(Exception):
    """A shape Ray's `ray up` would crash on: the key (dotted path) and what is wrong with it."""

    def __init__(self, path: str, key: str, what: str) -> None:
        super().__init__(f"{path}: {key}: {what}")
        self.path, self.key, self.what = path, key, what


def parse_up_args(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(config file, the overrides create_or_update_cluster applies) when `argv` is `ray ... up ...` as click would
    run it, else None (including every case click would refuse or answer itself: --help, --version, an unknown
    option, a missing value, a value click cannot convert, two files, --restart-only with --no-restart)."""
    if len(argv) < 2 or os.path.basename(argv[0]) not in ("ray", "ray.exe"):
        return None
    i = 1
    while i < len(argv) and argv[i].startswith("-"):        # the group's options
        opt, eq, _ = argv[i].partition("=")
        if opt not in GROUP_VALUE_OPTIONS:
            return None
        i += 1 if eq else 2
    if i >= len(argv) or argv[i] != "up":
        return None
    files: list[str] = []
    overrides: dict[str, Any] = {}
    flags: set[str] = set()
    rest = argv[i + 1:]
    j = 0
    while j < len(rest):
        arg = rest[j]
        j += 1
        if arg == "--":
            files.extend(rest[j:])
            break
        if arg.startswith("--"):
            opt, eq, value = arg.partition("=")
            if opt in UP_FLAGS and not eq:
                flags.add(opt)
                continue
            if opt not in UP_VALUE_OPTIONS:
                return None
            if not eq:
                if j >= len(rest):
                    return None
                value, j = rest[j], j + 1
        elif arg.startswith("-") and len(arg) > 1:
            # click's short options: clustered flags (-yv), then -n with its value attached or next.
            k = 1
            while k < len(arg) and arg[k] in UP_SHORT_FLAGS:
                k += 1
            if k == len(arg):
                continue
            if arg[k] != "n":
                return None
            opt, value = "-n", arg[k + 1:]
            if not value:
                if j >= len(rest):
                    return None
                value, j = rest[j], j + 1
        else:
            files.append(arg)
            continue
        name = UP_VALUE_OPTIONS[opt]
        if name in INT_OPTIONS:
            try:
                overrides[name] = int(value)
            except ValueError:
                return None
        elif name is not None:
            overrides[name] = value
        elif value.lower() not in {"--log-style": ("auto", "record", "pretty"),
                                   "--log-color": ("auto", "false", "true")}[opt]:
            return None
    if len(files) != 1 or ({"--restart-only", "--no-restart"} <= flags):
        return None
    if files[0].split(":", 1)[0].lower() in ("http", "https"):
        return None                                          # Ray downloads it first
    return files[0], overrides


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "null"}.get(type(value),
                                                                                        type(value).__name__)


def _json_fault(value: Any, key: str, depth: int = 0) -> tuple[str, str] | None:
    """Where json.dumps(..., sort_keys=True) fails in `value`: (key, what), or None when nothing is found."""
    if depth > 200:
        return None
    if isinstance(value, dict):
        odd = sorted((k for k in value if not isinstance(k, str)), key=repr)
        if odd:
            try:
                sorted(value)
            except TypeError:
                return (f"{key}.{odd[0]}" if key else str(odd[0]),
                        f"a key must be a string, got {type(odd[0]).__name__} {odd[0]!r} (Ray's `ray up` sorts the "
                        f"keys of every mapping to hash the config; quote it)")
            bad = [k for k in odd if not isinstance(k, JSON_SCALARS)]
            if bad:
                return f"{key}.{bad[0]}" if key else str(bad[0]), f"a key must be a string, got {bad[0]!r}"
        for k in sorted(value, key=repr):
            found = _json_fault(value[k], f"{key}.{k}" if key else str(k), depth + 1)
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for n, v in enumerate(value):
            found = _json_fault(v, f"{key}[{n}]", depth + 1)
            if found:
                return found
        return None
    if not isinstance(value, JSON_SCALARS):
        return key, (f"{type(value).__name__} {value!r} cannot be written as JSON, which Ray's `ray up` does with "
                     f"the whole config (quote it to make it a string)")
    return None


def ray_crash(config: Any, overrides: dict[str, Any] | None = None) -> tuple[str, str] | None:
    """(key, what is wrong) for the first step of Ray 2.60's `ray up` before the provider import that would raise on
    `config` (see the module docstring), or None: Ray's steps get through, or they are not the ones modelled here."""
    overrides = overrides or {}
    if not isinstance(config, dict):
        return "cluster", f"the file must hold a mapping of cluster keys, got {_kind(config)}"
    if "provider" not in config:
        return "provider", "missing (e.g. `provider: {type: external, module: ray_nodeless.NodelessProvider, ...}`)"
    provider = config["provider"]
    if not isinstance(provider, dict):
        return "provider", f"must be a mapping, got {_kind(provider)}"
    if "type" not in provider:
        return "provider.type", "missing (`type: external` with `module: ray_nodeless.NodelessProvider`)"
    try:
        hash(provider["type"])
    except TypeError:
        return "provider.type", f"must be a string, got {_kind(provider['type'])}"
    config = {**config, **{k: v for k, v in overrides.items() if v is not None}}
    if "cluster_name" not in config:
        return "cluster_name", "missing (Ray's `ray up` needs a cluster name, or `--cluster-name`)"
    if provider["type"] != "external":
        return None
    if "available_node_types" not in config and ("head_node" in config or "worker_nodes" in config):
        return None                                        # Ray's legacy merge: not modelled
    merged = {**EXTERNAL_DEFAULTS, **config}
    merged.pop("min_workers", None)
    for k in ("head_node", "worker_nodes"):
        if k in merged and not merged[k]:
            del merged[k]
    for k in SETUP_KEYS:
        if k not in merged:
            return k, "missing: Ray's `ray up` needs setup_commands, head_setup_commands and worker_setup_commands " \
                      "(`[]` for none)"
    for k in SETUP_KEYS[1:]:
        try:
            merged[k] = merged["setup_commands"] + merged[k]
        except TypeError:
            bad = "setup_commands" if not isinstance(merged["setup_commands"], list) else k
            return bad, f"must be a list of commands, got {_kind(merged[bad])} {merged[bad]!r}"[:300]
    if "docker" in merged:
        mounts = merged.get("file_mounts", {})
        if not isinstance(mounts, dict):
            return "file_mounts", f"must be a mapping of remote path to local path, got {_kind(mounts)}"
        for remote in mounts:
            if not isinstance(mounts[remote], str):
                return f"file_mounts.{remote}", f"must be a local path (a string), got {_kind(mounts[remote])}"
        docker = merged["docker"]
        if not isinstance(docker, dict):
            return "docker", f"must be a mapping (image, container_name, ...), got {_kind(docker)}"
        image = docker.get("image")
        cname = docker.get("container_name")
        present = image or (docker.get("head_image", image) and docker.get("worker_image", image))
        if (cname or present) and not (cname and present):
            return (("docker.container_name", "missing: Ray needs a container name with a docker image") if not cname
                    else ("docker.image", "missing: Ray needs an image (or head_image and worker_image) with "
                                          "container_name"))
    if "max_workers" not in merged:
        return "max_workers", "missing: Ray's `ray up` needs the cluster's max_workers (or `--max-workers`)"
    types = merged["available_node_types"]
    if isinstance(types, dict):
        filled = {}
        for name in types:
            if not isinstance(types[name], dict):
                return f"available_node_types.{name}", f"must be a mapping (node_config, resources, ...), got " \
                                                       f"{_kind(types[name])}"
            filled[name] = {"min_workers": 0, "max_workers": 0, **types[name]}
        merged["available_node_types"] = filled
    elif not (isinstance(types, (list, str)) and not types):
        return "available_node_types", f"must be a mapping of node type name to node type, got {_kind(types)}"
    try:
        json.dumps([merged], sort_keys=True)
    except (TypeError, ValueError):
        return _json_fault(merged, "")
    except RecursionError:
        return None
    return None


def refusal(argv: list[str]) -> RayUpRefused | None:
    """What main() would stop `argv` with, or None (Ray runs)."""
    parsed = parse_up_args(argv)
    if parsed is None:
        return None
    path, overrides = parsed
    try:
        import yaml
        with open(path) as f:              # as Ray reads it (create_or_update_cluster)
            config = yaml.safe_load(f.read())
    except Exception:                      # noqa: BLE001 - Ray reports (or trips on) its own reading of the file
        return None
    try:
        found = ray_crash(config, overrides)
    except RecursionError:
        return None
    return RayUpRefused(path, *found) if found else None


def main(argv: list[str] | None = None) -> None:
    """The .pth hook: exit 1 with the key named when `ray up` would crash, else return (never raises)."""
    try:
        refused = refusal(list(sys.argv if argv is None else argv))
    except Exception:                      # noqa: BLE001 - the hook must never stop a process that would run
        return
    if refused is None:
        return
    sys.stderr.write(f"ray-nodeless: {refused}\n")
    sys.stderr.flush()
    os._exit(1)                            # SystemExit would surface from site.py as an error processing the .pth
