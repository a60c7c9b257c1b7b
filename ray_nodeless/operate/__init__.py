"""The operate layer: what reads, checks and operates a cluster rather than launching into it.

The one provider-block loader and the cluster-YAML checks (config.py, with Ray's schema and `ray up`'s
preparation replayed without Ray: ray_schema.py, ray_prepare.py), the plugin's wheel on the head
(plugin_install.py), and the commands that act on a running or abandoned cluster: status.py, sweep.py.

It sits above launch/ (the launcher, the machine view, the catalog, shape-open types, reversion): operate may import
launch, launch never imports operate (tests/cli/test_layering.py), so the launch path carries no config-time code.
"""
