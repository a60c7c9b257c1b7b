"""`ray-nodeless convert RAY_YAML [-o OUT] [--free-instance-types] [--json]`: an existing Ray cluster YAML for
`type: aws` or `type: gcp` becomes a ray_nodeless one that `ray up` takes (ray_nodeless/swapin/convert.py).

Output: the converted YAML goes to OUT (or, without -o, to stdout, with the report on stderr); the report is the
instance of every node type before and after with its hourly price, and the idle / ceiling cost before and after.
With --json the report is one JSON document on stdout (without -o, no YAML is written).

A KubeRay manifest (RayCluster / RayJob / RayService, detected by apiVersion and kind) is converted for the KubeRay
bridge instead (kuberay/convert.py): OUT is the patched manifest, --ray-up PATH also writes a `ray up` YAML
with `registration: kubernetes`; --cloud / --region / --join / --autoscaler-image / --open (shape-open; a
RayCluster may then declare no worker group) / --max-workers apply to manifests only.
"""
from __future__ import annotations

from pathlib import Path

import click

from ray_nodeless.cli.errors import user_errors
from ray_nodeless.ray_compat.defaults import quiet_config_logs


@click.command("convert")
@click.argument("ray_yaml", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Write the converted YAML here (default: stdout, the report on stderr).")
@click.option("--free-instance-types", is_flag=True,
              help="Replace each pinned instance type by the shape it implies (CPUs, GPUs, GPU model, memory), so "
                   "the planner may pick a cheaper fit.")
@click.option("--project-id", help="GCP: the project, where the YAML has `project_id: null` (Ray's examples).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.option("--cloud", help="KubeRay manifest: the cloud (aws, gcp) when neither the annotation nor the groups' "
                              "node labels say.")
@click.option("--region", help="KubeRay manifest: the region, when the annotation has none.")
@click.option("--join", "join", help="KubeRay manifest: how machines join the Kubernetes cluster, a YAML mapping "
                                     "(the provider's kubernetes.join), e.g. '{method: eks, cluster: my-eks, ...}'.")
@click.option("--autoscaler-image", help="KubeRay manifest: the autoscaler container's image (with ray_nodeless "
                                         "installed); default: autoscalerOptions.image, else the head's image.")
@click.option("--ray-image", help="KubeRay manifest: the image of every Ray container (head, worker groups; the "
                                  "autoscaler's too unless --autoscaler-image), e.g. rayproject/ray:2.60.0.")
@click.option("--ray-up", "ray_up", type=click.Path(dir_okay=False),
              help="KubeRay manifest: also write a `ray up` YAML (VM head, registration: kubernetes) here.")
@click.option("--open", "open_shapes", is_flag=True,
              help="KubeRay manifest: shape-open (open_shapes: true): a demand no worker group holds gets its "
                   "cheapest-fit machine; a RayCluster may then declare no worker group at all.")
@click.option("--max-workers", type=int, help="KubeRay manifest: the cluster's worker limit (the annotation's "
                                              "maxWorkers; needed when it declares no worker group).")
def convert_command(ray_yaml: str, output: str | None, free_instance_types: bool, project_id: str | None,
                    as_json: bool, cloud: str | None, region: str | None, join: str | None,
                    autoscaler_image: str | None, ray_image: str | None, ray_up: str | None,
                    open_shapes: bool, max_workers: int | None) -> None:
    """Convert a Ray cluster YAML (type: aws or gcp) into a ray_nodeless one, or a KubeRay manifest for the
    ray_nodeless bridge, and show what changes."""
    from ray_nodeless.core.files import write_atomic
    from ray_nodeless.swapin import report
    from ray_nodeless.swapin.convert import convert_file

    with user_errors():
        manifest = _manifest(ray_yaml)
        if manifest is not None:
            _convert_manifest(ray_yaml, manifest, output, as_json, free_instance_types, project_id, cloud, region,
                              join, autoscaler_image, ray_up, ray_image, open_shapes, max_workers)
            return
        for name, value in (("--cloud", cloud), ("--region", region), ("--join", join),
                            ("--autoscaler-image", autoscaler_image), ("--ray-image", ray_image),
                            ("--ray-up", ray_up), ("--open", open_shapes or None), ("--max-workers", max_workers)):
            if value is not None:
                raise click.UsageError(f"{name} applies to KubeRay manifests only (this is a Ray cluster YAML)")
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


def _write(path: str, text: str) -> None:
    from ray_nodeless.core.files import write_atomic

    p = Path(path)
    mode = p.stat().st_mode & 0o7777 if p.exists() else 0o644
    try:
        write_atomic(p, text, mode=mode)
    except OSError as e:
        raise click.ClickException(f"cannot write {path}: {e}") from e


def _manifest(path: str) -> list | None:
    """The file's documents when it holds a KubeRay manifest, else None (a Ray cluster YAML, read as before)."""
    from ray_nodeless.errors import ConfigError
    from ray_nodeless.kuberay import convert as KC

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None                   # convert_file names the problem
    try:
        docs = KC.load_documents(text, path)
    except ConfigError:
        return None
    return docs if KC.kuberay_indexes(docs) else None


def _convert_manifest(path: str, docs: list, output: str | None, as_json: bool, free: bool, project_id: str | None,
                      cloud: str | None, region: str | None, join: str | None, image: str | None,
                      ray_up: str | None, ray_image: str | None = None, open_shapes: bool = False,
                      max_workers: int | None = None) -> None:
    import yaml

    from ray_nodeless.errors import ConfigError
    from ray_nodeless.kuberay import convert as KC

    if free:
        raise click.UsageError("--free-instance-types applies to Ray cluster YAMLs (a KubeRay group pins no type)")
    join_map = None
    if join is not None:
        try:
            join_map = yaml.safe_load(join)
        except yaml.YAMLError as e:
            raise ConfigError("--join", f"not valid YAML: {e}") from e
        if not isinstance(join_map, dict):
            raise ConfigError("--join", "must be a mapping, e.g. '{method: eks, cluster: my-eks}'")
    with quiet_config_logs():
        conv = KC.convert_manifest(docs, source_name=Path(path).name, cloud=cloud, region=region,
                                   project_id=project_id, join=join_map, autoscaler_image=image,
                                   ray_up=ray_up is not None, ray_image=ray_image, open_shapes=open_shapes,
                                   max_workers=max_workers)
    if output:
        _write(output, conv.text)
    if ray_up:
        _write(ray_up, conv.ray_up_text or "")
    if as_json:
        import json

        click.echo(json.dumps(conv.to_dict(), indent=2, sort_keys=True))
        if not output:
            click.echo("ray-nodeless: no -o OUT given: the converted manifest was not written", err=True)
        return
    if output:
        click.echo(KC.table(conv, output, ray_up))
    else:
        click.echo(conv.text, nl=False)
        click.echo(KC.table(conv, None, ray_up), err=True)
