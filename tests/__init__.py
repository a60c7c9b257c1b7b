"""The test suite; folders mirror the package (core/, ray_adapter/, providers/<backend>/, ...), e2e/ holds the tests
that drive a real Ray autoscaler."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
