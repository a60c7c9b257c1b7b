"""The CLI's one error convention (`ray_nodeless.cli.errors.user_errors`)."""
from __future__ import annotations

import pytest

from ray_nodeless.cli.errors import user_errors
from ray_nodeless.errors import CatalogError, ConfigError, NodelessError


@pytest.mark.parametrize("error", [ConfigError("provider.cloud", "'azure' is not one of ['aws']"),
                                   CatalogError("cannot read catalog x.json")])
def test_bad_input_exits_2_with_one_line(error, capsys):
    with pytest.raises(SystemExit) as e:
        with user_errors():
            raise error
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"ray-nodeless: error: {error}\n"


def test_other_failures_exit_1():
    with pytest.raises(SystemExit) as e:
        with user_errors():
            raise NodelessError("the workload cannot complete")
    assert e.value.code == 1


def test_other_widens_and_narrows_what_exits_1():
    # `trace record` widens it: the state API raises unrelated exception types when the dashboard is down.
    with pytest.raises(SystemExit) as e:
        with user_errors(other=Exception):
            raise ConnectionError("refused")
    assert e.value.code == 1
    # `catalog list` narrows it to nothing: anything but bad input there is a bug and keeps its traceback.
    with pytest.raises(NodelessError):
        with user_errors(other=()):
            raise NodelessError("boom")
    # Bad input is always exit 2, whatever `other` says.
    with pytest.raises(SystemExit) as e:
        with user_errors(other=()):
            raise ConfigError("--region", "unknown")
    assert e.value.code == 2


def test_bugs_propagate():
    with pytest.raises(KeyError):
        with user_errors():
            raise KeyError("a bug, not the user's input")
