"""Ray's command runner for a node that is this host: `ray up` runs `head_start_ray_commands` on the local head
through it, exactly as it would over SSH on a VM."""
from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from ray.autoscaler.command_runner import CommandRunnerInterface

from ray_nodeless.providers.local.ray_start import MARKER_ENV
from ray_nodeless.ray_compat.command_runner import (
    ProcessRunnerError, allows_interactive, cli_verbosity, output_redirected, with_environment_variables,
)

logger = logging.getLogger(__name__)


def runner_marker(home: Path | str) -> str:
    """The marker of processes started through the LocalCommandRunner of the cluster whose home is `home`."""
    return f"runner@{Path(home)}"


# Prepended to every command: `ray stop` -> scoped stop (see LocalCommandRunner); any other `ray ...` unchanged.
_SCOPED_RAY_STOP = (
    'ray() {{ if [ "${{1:-}}" = stop ]; then shift; '
    '"{python}" -m ray_nodeless.providers.local.scoped_stop stop-marked "${marker_env}" "$@"; '
    'else command ray "$@"; fi; }}\n'
)


class LocalCommandRunner(CommandRunnerInterface):
    """Ray's command runner for a node that is this host: commands run under bash with HOME = the cluster's home
    directory, so everything Ray puts in `~` (ray_bootstrap_config.yaml, ray_bootstrap_key.pem, `~/...` file mounts)
    lands there and not in the user's home. Absolute remote paths are used as they are (like on a VM).

    Every process started through it carries `NODELESS_LOCAL_NODE=runner@<home>` (`self.marker`), and inside its
    commands `ray stop` is a shell function that stops only those processes: `ray down` runs a literal `ray stop`
    on the head, which on a shared host would otherwise kill every Ray cluster of the user. Worker nodes started
    by the backend carry their own marker, so (as on VMs) the head's `ray stop` leaves them to `terminate`.
    """

    def __init__(self, log_prefix: str, node_id: str, home: Path | str, process_runner: Any = subprocess):
        self.log_prefix = log_prefix
        self.node_id = node_id
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.process_runner = process_runner if process_runner is not None else subprocess
        self.marker = runner_marker(self.home)

    # What a fresh SSH session would not have: the CLI's own Ray address must not leak into commands on the node.
    _SCRUBBED_ENV = ("RAY_ADDRESS",)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in self._SCRUBBED_ENV}
        env["HOME"] = str(self.home)
        env[MARKER_ENV] = self.marker
        # The venv's bin first, so `ray` (and `python`) resolve to the interpreter running the autoscaler.
        venv_bin = str(Path(sys.executable).parent)
        path = env.get("PATH", "")
        if venv_bin not in path.split(os.pathsep):
            env["PATH"] = venv_bin + (os.pathsep + path if path else "")
        return env

    def remote_path(self, path: str) -> str:
        """Where a path on 'the node' is on this host: `~` is the cluster home, relative paths are under it."""
        if path == "~" or path.startswith("~/"):
            return str(self.home) + path[1:]
        if not os.path.isabs(path):
            return os.path.join(str(self.home), path)
        return path

    def run(self, cmd: str | None = None, timeout: int = 120, exit_on_fail: bool = False,
            port_forward: Any = None, with_output: bool = False,
            environment_variables: dict[str, object] | None = None, run_env: str = "auto",
            ssh_options_override_ssh_key: str = "", shutdown_after_run: bool = False,
            silent: bool = False) -> Any:
        # `timeout` is SSH's connect timeout in Ray's runner, not a command time limit: nothing to connect to here.
        if port_forward:
            logger.info("%slocal node: port forwarding %s is a no-op (same host)", self.log_prefix, port_forward)
        if shutdown_after_run:
            # On a VM this appends `sudo shutdown -h now`; here that would be the developer's machine.
            logger.warning("%sshutdown_after_run ignored for a local node", self.log_prefix)
        if not cmd:
            return b"" if with_output else ""
        if environment_variables:
            # Same encoding as Ray's SSH runner (JSON values, shell-quoted): RAY_OVERRIDE_RESOURCES etc.
            cmd = with_environment_variables(cmd, environment_variables)
        # A login shell would source /etc/profile, which on Debian resets PATH and loses the venv: use a plain one.
        script = 'cd "$HOME" || exit 1\n' + _SCOPED_RAY_STOP.format(python=sys.executable, marker_env=MARKER_ENV) + cmd
        final = ["bash", "-c", script]
        logger.debug("%srunning locally: %s", self.log_prefix, cmd)
        env = self._env()
        interactive = sys.stdin is not None and sys.stdin.isatty()
        stdin = (None if interactive and allows_interactive()
                 and not output_redirected() else subprocess.DEVNULL)
        # Without a terminal, give the command its own session: what it daemonises (the head's Ray processes) must
        # not live in the caller's process group (pytest's, the CLI's), where signals meant for the caller land.
        # With a terminal (`ray attach`, `ray exec` by hand) keep the foreground job so the shell is usable.
        kw: dict[str, Any] = dict(env=env, stdin=stdin, start_new_session=not interactive)
        try:
            if with_output:
                return self.process_runner.check_output(final, **kw)
            if silent and cli_verbosity() < 1:
                self.process_runner.check_call(final, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
            elif output_redirected():
                out_path = os.path.join(tempfile.gettempdir(), f"ray-up-local-{time.time()}.txt")
                with open(out_path, "w") as out:
                    self.process_runner.check_call(final, stdout=out, stderr=out, **kw)
            else:
                # Inherit our stdout/stderr (`ray up` shows the output), as Ray's runner does with sys.stdout.
                self.process_runner.check_call(final, **kw)
        except subprocess.CalledProcessError as e:
            if exit_on_fail:
                raise click.ClickException(f"Command failed:\n\n  {cmd}\n") from None
            # What the updater catches to say "Setup command failed" (Ray's non-login-shell path raises the same).
            raise ProcessRunnerError("Command failed", "ssh_command_failed", code=e.returncode,
                                     command=cmd) from None
        return ""

    def _copy(self, source: str, target: str, options: dict[str, Any] | None) -> None:
        options = options or {}
        excludes = list(options.get("rsync_exclude") or [])
        filters = list(options.get("rsync_filter") or [])
        Path(target.rstrip("/") or "/").parent.mkdir(parents=True, exist_ok=True)
        rsync = shutil.which("rsync")
        if rsync:
            cmd = [rsync, "-a"]
            for e in excludes:
                cmd += ["--exclude", e]
            for f in filters:
                cmd += ["--filter", f"dir-merge,- {f}"]
            subprocess.run(cmd + [source, target], check=True, stdout=subprocess.DEVNULL)
            return
        if filters:
            logger.debug("rsync not installed: rsync_filter %s not applied to %s", filters, source)
        src = source.rstrip("/") or "/"
        if os.path.isdir(src):
            # rsync "a/" "b/" semantics (what Ray's updater passes for directories): contents of a into b.
            dst = target if source.endswith("/") else os.path.join(target, os.path.basename(src))
            shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True,
                            ignore=(lambda d, names: [n for n in names if any(fnmatch.fnmatch(n, e) for e in excludes)])
                            if excludes else None)
        else:
            dst = os.path.join(target, os.path.basename(src)) if target.endswith("/") or os.path.isdir(target) \
                else target
            shutil.copy2(src, dst)

    def run_rsync_up(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        self._copy(source, self.remote_path(target), options)

    def run_rsync_down(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        self._copy(self.remote_path(source), target, options)

    def remote_shell_command_str(self) -> str:
        home = str(self.home)
        venv_bin = str(Path(sys.executable).parent)
        return f'cd {home!r} && HOME={home!r} PATH={venv_bin!r}:"$PATH" exec bash'

    def run_init(self, *, as_head: bool, file_mounts: dict[str, str], sync_run_yet: bool) -> bool | None:
        # Nothing to initialise (no container). Must not return True: the updater would then invalidate the runtime
        # hash and redo all setup on every `ray up`.
        return None
