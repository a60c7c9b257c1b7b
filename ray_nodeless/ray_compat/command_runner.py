"""Ray's command-runner internals that a CommandRunnerInterface of our own needs to behave like Ray's SSH runner:
output redirection and interactivity (`subprocess_output_util`), the `export K=V;` prefix of its environment
variables, its failure type, and the CLI logger's verbosity. Imported at module level: the only caller (the local
backend's runner) subclasses Ray's CommandRunnerInterface anyway."""
from __future__ import annotations

from ray.autoscaler._private import subprocess_output_util
from ray.autoscaler._private.cli_logger import cli_logger
from ray.autoscaler._private.command_runner import _with_environment_variables
from ray.autoscaler._private.subprocess_output_util import ProcessRunnerError

_OUTPUT = "ray.autoscaler._private.subprocess_output_util"
RAY_NAMES = ((_OUTPUT, "does_allow_interactive"), (_OUTPUT, "is_output_redirected"),
             (_OUTPUT, "ProcessRunnerError"),
             ("ray.autoscaler._private.cli_logger", "cli_logger"),
             ("ray.autoscaler._private.command_runner", "_with_environment_variables"))

with_environment_variables = _with_environment_variables


def allows_interactive() -> bool:
    return subprocess_output_util.does_allow_interactive()


def output_redirected() -> bool:
    return subprocess_output_util.is_output_redirected()


def cli_verbosity() -> int:
    return cli_logger.verbosity


__all__ = ["ProcessRunnerError", "allows_interactive", "cli_verbosity", "output_redirected",
           "with_environment_variables"]
