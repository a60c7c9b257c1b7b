"""The Ray images of a KubeRay manifest against the Ray that ray_nodeless runs with.

Why: KubeRay's samples pin older Ray images (2.52 at the time of writing); ray_nodeless needs the Ray it is
installed with (its autoscaler bridge runs that Ray's monitor). A head or worker container on another Ray version
joins a cluster whose autoscaler speaks another protocol, and nothing says so until something breaks. `convert`
notes every Ray container whose image tag names another Ray version, and `--ray-image` sets them all (the head's
and every worker group's Ray container, and the autoscaler's unless `--autoscaler-image` names one).
"""
from __future__ import annotations

import importlib.metadata
import re
from typing import Any, Iterator, MutableMapping

# `rayproject/ray:2.52.0`, `rayproject/ray-ml:2.52.0-py311-gpu`, `.../ray:2.60.0.abc123`: the tag's leading version.
_TAG_VERSION = re.compile(r":(\d+\.\d+\.\d+)(?:$|[^\d])")


def installed_ray() -> str:
    return importlib.metadata.version("ray")


def ray_version_of(image: str) -> str | None:
    """The Ray version an image's tag names (None: no version in it, e.g. `:latest` or a digest)."""
    m = _TAG_VERSION.search(image.rsplit("/", 1)[-1])
    return m.group(1) if m else None


def ray_containers(spec: MutableMapping[str, Any], spec_key: str) -> Iterator[tuple[str, MutableMapping[str, Any]]]:
    """(key, container) of the head's and each worker group's Ray container (the first: what KubeRay runs Ray in);
    the groups are checked already (kuberay/shape.py)."""
    yield f"{spec_key}.headGroupSpec.template.spec.containers[0]", spec["headGroupSpec"]["template"]["spec"][
        "containers"][0]
    for j, g in enumerate(spec.get("workerGroupSpecs") or []):
        yield f"{spec_key}.workerGroupSpecs[{j}].template.spec.containers[0]", g["template"]["spec"]["containers"][0]


def settle_ray_images(spec: MutableMapping[str, Any], spec_key: str, ray_image: str | None) -> list[str]:
    """Set every Ray container's image to `ray_image` when given; the notes (one per container whose image names
    another Ray version than the installed one)."""
    ours = installed_ray()
    notes: list[str] = []
    for key, container in ray_containers(spec, spec_key):
        if ray_image:
            if container.get("image") != ray_image:
                notes.append(f"{key}.image: {container.get('image')!r} -> {ray_image!r} (--ray-image)")
            container["image"] = ray_image
            continue
        image = container.get("image")
        version = ray_version_of(image) if isinstance(image, str) else None
        if version is not None and version != ours:
            notes.append(f"{key}.image: {image!r} runs Ray {version}, ray_nodeless runs with Ray {ours} (its "
                         f"autoscaler and the nodes must match): --ray-image rayproject/ray:{ours} sets every Ray "
                         "container's image")
    if ray_image and (v := ray_version_of(ray_image)) is not None and v != ours:
        notes.append(f"--ray-image {ray_image!r} runs Ray {v}, ray_nodeless runs with Ray {ours}")
    return notes
