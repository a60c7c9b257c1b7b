"""Swap-in for existing Ray users: an existing Ray cluster YAML for `type: aws` / `type: gcp` becomes a
ray_nodeless one (`ray-nodeless convert`), and every Ray key keeps its meaning.

- `ray_defaults.py`: the installed Ray's own per-cloud defaults, merged exactly as `ray up` merges them, and Ray's
  own config checks (`prepare_config` + `validate_config`).
- `keymap.py`: the table of Ray's provider / node_config keys and their ray_nodeless meaning (the mapping itself
  lives where every YAML is read: `providers/aws/settings.py`, `providers/gcp/node_config.py`), and what a Ray
  node type would launch under Ray's own provider (the "before" of a conversion).
- `convert.py`: the conversion (provider block swapped, Ray's defaults made explicit, pinned types kept or freed).
- `yaml_text.py`: writing the converted YAML with the user's comments where they still apply (PyYAML only).
- `report.py`: the before/after table and its JSON document.
- `kuberay.py`: KubeRay's side, pure: the `ray-nodeless.io/config` annotation of a RayCluster, and a worker group's
  pod scheduling (nodeSelector, required node affinity, Ray labels) as constraint keys (`group_rules`).
- `kuberay_convert.py`: convert for KubeRay manifests (the manifest patched for the bridge, a `ray up` YAML with
  `registration: kubernetes`, the cost report), and the bridge's config of a manifest for `plan`.
"""
