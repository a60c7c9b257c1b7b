"""ray_nodeless on KubeRay: a RayCluster's `ray-nodeless.io/config` annotation (annotation.py), a worker group's pod
scheduling as rules (scheduling.py; the table of label handlers is labels.py, the constraints it accumulates
constraints.py, the labels resolved against the catalog catalog_labels.py), the autoscaler container that runs
Ray's monitor with ray_nodeless as its provider (bridge.py, provider.py), and `ray-nodeless convert` of KubeRay
manifests (convert.py).

Above ray_adapter/ (the provider it runs) and swapin/ (the generic convert helpers it reuses); nothing below imports
it but the CLI."""
