"""The CLI's one error convention: one line `ray-nodeless: error: ...` naming the key at fault, on stderr; exit
status 2 for bad input (a config key, an infeasible request, a catalog that cannot be read), 1 for anything else.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator, NoReturn

import click

from ray_nodeless.errors import CatalogError, ConfigError, NodelessError, NoFeasibleOffering

BAD_INPUT = 2
FAILURE = 1


def fail(e: BaseException, code: int) -> NoReturn:
    click.echo(f"ray-nodeless: error: {e}", err=True)
    sys.exit(code)


@contextmanager
def user_errors(other: type[BaseException] | tuple[type[BaseException], ...] = NodelessError) -> Iterator[None]:
    """Turn the errors of the block into the convention: bad input exits 2, `other` exits 1, the rest propagate
    (a traceback: a bug, not the user's input)."""
    try:
        yield
    except (ConfigError, NoFeasibleOffering, CatalogError) as e:
        fail(e, BAD_INPUT)
    except other as e:
        fail(e, FAILURE)
