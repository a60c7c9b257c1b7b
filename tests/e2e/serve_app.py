"""The Serve application of the KubeRay RayService e2e (tests/e2e/test_kuberay_operator.py): one GPU replica per
request of capacity, answering with the id of the machine it runs on. Imported by Ray's workers as
`tests.e2e.serve_app:app` (the repository is on their PYTHONPATH)."""
import os

from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 1, "num_gpus": 1})
class Where:
    def __call__(self, request) -> str:
        return os.environ.get("RAY_CLOUD_INSTANCE_ID", "")


app = Where.bind()
