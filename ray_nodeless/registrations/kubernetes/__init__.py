"""`registration: kubernetes`: machines join a Kubernetes cluster as Nodes; Ray runs in a pod bound to each.

settings.py (the `kubernetes:` block), labels.py (every label / annotation / taint), join.py (eks / kubeadm / k3s
user data and its parser), pods.py (the Ray pod), registration.py (the watches, pods, orphans), check.py (bad input
before any launch)."""
from ray_nodeless.registrations.kubernetes.check import check
from ray_nodeless.registrations.kubernetes.registration import KubernetesRegistration
from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings

__all__ = ["KubernetesRegistration", "KubernetesSettings", "check"]
