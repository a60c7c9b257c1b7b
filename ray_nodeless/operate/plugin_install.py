"""How ray_nodeless gets onto the head of a cloud cluster, and the check that `ray up` can carry it there.

ray-nodeless is not published on any package index, so a head cannot `pip install ray-nodeless`. Instead (the way
Ray's own configs ship a wheel of Ray): `make wheel` builds a wheel from the checkout into `dist/ray_nodeless_wheel/`
(only that one wheel), the cluster YAML carries the directory to the head with `file_mounts` and installs the wheel
with `head_setup_commands`, together with Ray pinned to the version of the client (the wheel itself allows 2.60.*;
the head must run the client's exact version):

    file_mounts: {~/ray_nodeless_wheel: ./dist/ray_nodeless_wheel}
    head_setup_commands:
      - pip install -q "ray[default]==2.60.0" ~/ray_nodeless_wheel/ray_nodeless-0.1.0-py3-none-any.whl

The wheel's own dependencies bring the cloud SDKs the head's provider needs (boto3, google-cloud-compute,
kubernetes). Only the head needs the plugin: workers run `ray start --address=...`; those that boot themselves
(`disable_node_updaters: true`) get no file_mounts at all (nothing syncs to them), so their interruption watcher
runs only when their image has ray_nodeless (registrations/vm_boot.py).

`check_file_mounts` (run by `bootstrap_config`, before anything launches) turns the late failures Ray would give
into errors naming the key: Ray reads a missing file_mounts path only after the head exists (`hash_runtime_conf`, a
FileNotFoundError traceback), and a missing wheel shows only as a failed setup command on the head.
"""
from __future__ import annotations

import glob
import os
import shlex
from importlib import metadata
from pathlib import Path
from typing import Mapping

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.errors import ConfigError

DIST_NAME = "ray-nodeless"
WHEEL_MOUNT = "~/ray_nodeless_wheel"      # on the head (and every node Ray's updater syncs file_mounts to)
WHEEL_DIR = "dist/ray_nodeless_wheel"     # where `make wheel` writes it, in the checkout
MAKE_WHEEL = "run `make wheel` in the ray_nodeless checkout (it writes dist/ray_nodeless_wheel/)"
# The command lists Ray runs, with who runs them. Ray's prepare_config prepends setup_commands to the other two
# before the provider's bootstrap_config sees the YAML; the prefix is skipped there so each error names its list.
COMMAND_KEYS = ("setup_commands", "head_setup_commands", "worker_setup_commands")


def plugin_version() -> str:
    """The version of the ray_nodeless this process runs (what `make wheel` builds from the same checkout)."""
    return metadata.version(DIST_NAME)


def wheel_filename(version: str | None = None) -> str:
    """The file `make wheel` writes: a pure-Python wheel (setuptools normalises the name's dash)."""
    return f"ray_nodeless-{version or plugin_version()}-py3-none-any.whl"


def head_install_command(ray_version: str, version: str | None = None) -> str:
    """The head's setup command: Ray pinned to `ray_version` and the mounted wheel, in one pip resolution."""
    return f'pip install -q "ray[default]=={ray_version}" {WHEEL_MOUNT}/{wheel_filename(version)}'


def checkout_root() -> Path | None:
    """The source checkout this ray_nodeless is imported from (an editable install), else None (a wheel)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if f'name = "{DIST_NAME}"' in text else None


def local_wheel_dir() -> tuple[str, bool]:
    """Where the wheel of this checkout is on the client for file_mounts: the checkout's dist/ray_nodeless_wheel as
    an absolute path (a converted YAML may be run from anywhere), and True; without a checkout the relative
    `./dist/ray_nodeless_wheel` of a checkout's root, and False."""
    root = checkout_root()
    if root is None:
        return f"./{WHEEL_DIR}", False
    return str(root / WHEEL_DIR), True


def install_on_head(config: Document, ray_version: str) -> dict[str, str]:
    """Add the wheel's mount and the head's install command to a cluster YAML (what `ray-nodeless convert` writes).
    The command goes after the user's own head_setup_commands, so that nothing they install downgrades what the
    plugin needs. Returns a note per top-level key changed."""
    local, from_checkout = local_wheel_dir()
    mounts = config.get("file_mounts")
    config["file_mounts"] = dict(mounts) if isinstance(mounts, Mapping) else {}
    config["file_mounts"][WHEEL_MOUNT] = local
    command = head_install_command(ray_version)
    head = [str(c) for c in config.get("head_setup_commands") or []]
    config["head_setup_commands"] = head + ([] if command in head else [command])
    where = ("this checkout's" if from_checkout else
             "a checkout's (a relative path: run `ray up` from the checkout's root, or point it at the directory "
             f"holding {wheel_filename()})")
    return {"file_mounts": f"{WHEEL_MOUNT}: {local}, {where} wheel of ray_nodeless for the head (no package index "
                           f"has it); {MAKE_WHEEL} before `ray up`",
            "head_setup_commands": f"the last command installs that wheel with Ray pinned to the client's "
                                   f"{ray_version} (only the head runs the plugin)"}


# --------------------------------------------------------------------------------------------- the check


def _commands(config: DocumentView) -> list[tuple[str, str]]:
    """(key, command) for every setup command, `setup_commands` first, each under the list the user wrote it in."""
    raw = {k: config.get(k) for k in COMMAND_KEYS}
    lists = {k: [str(c) for c in v] if isinstance(v, list) else [] for k, v in raw.items()}
    common = lists["setup_commands"]
    out: list[tuple[str, str]] = []
    for k in COMMAND_KEYS:
        cmds = lists[k]
        start = len(common) if k != "setup_commands" and common and cmds[:len(common)] == common else 0
        out += [(f"{k}[{i}]", c) for i, c in enumerate(cmds) if i >= start]
    return out


def _mounted_paths(command: str, remote: str) -> list[str]:
    """The words of `command` that name a path under the mount `remote` (e.g. `~/ray_nodeless_wheel/x.whl`)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:          # unbalanced quotes: the shell will say so on the node; nothing to map here
        return []
    prefix = remote.rstrip("/") + "/"
    return [w for w in words if w.startswith(prefix) or w == remote.rstrip("/")]


def _hint(remote: str, local: str) -> str:
    is_wheel = remote.rstrip("/") == WHEEL_MOUNT or local.rstrip("/").endswith(WHEEL_DIR)
    return f"; {MAKE_WHEEL}" if is_wheel else ""


def check_file_mounts(config: DocumentView, workers_boot_themselves: bool = False) -> None:
    """Every `file_mounts` source exists on this machine, every setup command's path under a mount exists in its
    source, and no command a self-booting worker runs needs a mount. Raises ConfigError naming the key.

    Paths are read as Ray reads them: `~` expanded, a relative path from the directory `ray up` runs in."""
    mounts = config.get("file_mounts")
    if not isinstance(mounts, Mapping):
        return                  # Ray's own schema names a file_mounts that is not a mapping
    cwd = os.getcwd()
    sources: dict[str, str] = {}
    for remote, local in sorted((str(r), str(v)) for r, v in mounts.items()):
        path = os.path.expanduser(local)
        if not os.path.exists(path):
            where = ("" if os.path.isabs(path) else
                     f" (a relative path is read from the directory `ray up` runs in, {cwd})")
            raise ConfigError(f"file_mounts.{remote}", f"{local} does not exist{where}; Ray would fail on it only "
                                                       f"after launching the head{_hint(remote, local)}")
        sources[remote] = path
    for key, command in _commands(config):
        for remote, path in sources.items():
            for word in _mounted_paths(command, remote):
                if workers_boot_themselves and not key.startswith("head_setup_commands"):
                    raise ConfigError(key, f"uses {word} from file_mounts.{remote}, which no worker gets: with "
                                           "disable_node_updaters: true workers boot themselves and run "
                                           "setup_commands and worker_setup_commands from their boot script, and "
                                           "nothing syncs file_mounts to them; move the command to "
                                           "head_setup_commands (the head gets file_mounts)")
                _check_mounted(key, word, remote, mounts[remote], path)


def _check_mounted(key: str, word: str, remote: str, local: str, path: str) -> None:
    rest = word[len(remote.rstrip("/")):].lstrip("/")
    if not rest or not os.path.isdir(path):
        return                  # the mount itself (checked above), or a file mounted under a name
    want = os.path.join(path, rest)
    if glob.glob(want) if glob.has_magic(rest) else os.path.exists(want):
        return
    there = sorted(n for n in os.listdir(path) if not n.startswith("."))
    found = f" ({local} holds: {', '.join(there[:5])})" if there else f" ({local} is empty)"
    raise ConfigError(key, f"uses {word}, which file_mounts.{remote} takes from {os.path.join(local, rest)}: no such "
                           f"file{found}{_hint(remote, local)}")
