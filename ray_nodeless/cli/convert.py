"""`ray-nodeless convert RAY_YAML [-o OUT] [--free-instance-types] [--json]`: an existing Ray cluster YAML for
`type: aws` or `type: gcp` becomes a ray_nodeless one that `ray up` takes (ray_nodeless/swapin/convert.py).

Output: the converted YAML goes to OUT (or, without -o, to stdout, with the report on stderr); the report is the
instance of every node type before and after with its hourly price, and the idle / ceiling cost before and after.
With --json the report is one JSON document on stdout (without -o, no YAML is written).
"""
from __future__ import annotations

from pathlib import Path

import click

from ray_nodeless.cli.errors import user_errors
from ray_nodeless.ray_adapter.compat.defaults import quiet_config_logs


@click.command("convert")
@click.argument("ray_yaml", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Write the converted YAML here (default: stdout, the report on stderr).")
@click.option("--free-instance-types", is_flag=True,
              help="Replace each pinned instance type by the shape it implies (CPUs, GPUs, GPU model, memory), so "
                   "the planner may pick a cheaper fit.")
@click.option("--project-id", help="GCP: the project, where the YAML has `project_id: null` (Ray's examples).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
def convert_command(ray_yaml: str, output: str | None, free_instance_types: bool, project_id: str | None,
                    as_json: bool) -> None:
    """Convert a Ray cluster YAML (type: aws or gcp) into a ray_nodeless one, and show what changes."""
    from ray_nodeless.core.files import write_atomic
    from ray_nodeless.swapin import report
    from ray_nodeless.swapin.convert import convert_file

    with user_errors():
        with quiet_config_logs():
            conv = convert_file(ray_yaml, free_instance_types=free_instance_types, project_id=project_id)
        if output:
            p = Path(output)
            mode = p.stat().st_mode & 0o7777 if p.exists() else 0o644
            try:
                write_atomic(p, conv.text, mode=mode)
            except OSError as e:
                raise click.ClickException(f"cannot write {output}: {e}") from e
        if as_json:
            click.echo(report.json_text(conv))
            if not output:
                click.echo("ray-nodeless: no -o OUT given: the converted YAML was not written", err=True)
            return
        if output:
            click.echo(report.table(conv, output))
        else:
            click.echo(conv.text, nl=False)
            click.echo(report.table(conv, None), err=True)
