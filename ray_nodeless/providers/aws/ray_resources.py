"""The AWS part of Ray's resource fill-in for a pinned node type (`core/node_resources.FillRule`): what Ray's AWS
provider (`AWSNodeProvider.fillout_available_node_types_resources`) detects beyond CPU, GPU and memory.

Ray's constants are copied here, not imported (`ray-nodeless plan` imports no Ray); tests/swapin/test_fill_parity.py
checks them against the installed Ray.
"""
from __future__ import annotations

from ray_nodeless.core.node_resources import FillRule

# ray._private.accelerators.neuron.AWS_NEURON_INSTANCE_MAP: NeuronCores per instance type (Ray's resource
# `neuron_cores`, accelerator type `aws-neuron-core`); Ray knows no other Neuron types.
AWS_NEURON_CORES = {
    "trn1.2xlarge": 2, "trn1.32xlarge": 32, "trn1n.32xlarge": 32,
    "inf2.xlarge": 2, "inf2.8xlarge": 2, "inf2.24xlarge": 12, "inf2.48xlarge": 24,
}
NEURON_CORES_RESOURCE = "neuron_cores"
AWS_NEURON_CORE = "aws-neuron-core"        # ray.util.accelerators.AWS_NEURON_CORE
# Canonical GPU model (core/gpus.py) -> the `GpuInfo.Gpus[0].Name` EC2 reports, which is what Ray puts in
# `accelerator_type:<name>`. Models not listed are spelled the same.
AWS_GPU_NAMES = {
    "A100-80GB": "A100",
    "T4G": "T4g",
    "RTX-PRO-4500": "RTX PRO 4500",
    "RTX-PRO-6000": "RTX PRO Server 6000",
    "RADEON-PRO-V520": "Radeon Pro V520",
}

AWS_FILL = FillRule(gpu_names=AWS_GPU_NAMES, accelerator_cores=AWS_NEURON_CORES,
                    cores_resource=NEURON_CORES_RESOURCE, cores_accelerator=AWS_NEURON_CORE)
