# Two commands do everything on a fresh clone: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install bench catalog clean k8s wheel prometheus karpenter kuberay-image docs

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade "pip>=23,<27"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# The plugin's wheel for cloud heads (ray-nodeless is on no package index): the cloud configs in cluster-configs/
# carry WHEEL_DIR to the head with file_mounts and pip-install the wheel in head_setup_commands. Rebuilt every time,
# from a clean build/ (setuptools would otherwise ship modules deleted since the last build); the directory holds
# only this build's wheel, ray_nodeless-<version>-py3-none-any.whl.
WHEEL_DIR ?= dist/ray_nodeless_wheel

wheel: $(BIN)/python
	rm -rf build ray_nodeless.egg-info
	rm -f $(WHEEL_DIR)/ray_nodeless-*.whl
	$(BIN)/python -m pip wheel --no-deps -q -w $(WHEEL_DIR) .
	@ls $(WHEEL_DIR)/ray_nodeless-*.whl

# The KubeRay autoscaler image (Ray's image + the wheel: cluster-configs/kuberay/Dockerfile); needs a Docker daemon.
KUBERAY_IMAGE ?= ray-nodeless-autoscaler
kuberay-image: wheel
	docker build -f cluster-configs/kuberay/Dockerfile --build-arg WHEEL_DIR=$(WHEEL_DIR) -t $(KUBERAY_IMAGE) .

# A current Kubernetes for the Kubernetes tests (kube-apiserver, scheduler, controller-manager, kubelet, kubeadm of the
# release in scripts/k8s/versions.env), etcd, the KubeRay operator and kwok, built from the Go module proxy by
# build_go.sh into ~/.cache/ray-nodeless/k8s-go (about 15-25 minutes the first time on 2 cores; then instant), and a
# real node beside it (that kubelet + kubeadm, containerd + runc + CNI from Debian, the pause image: build_node.sh,
# cached in ~/.cache/ray-nodeless/k8s-node; it runs build_go.sh itself).
k8s:
	bash scripts/k8s/build_node.sh

# Karpenter v1.10.0 with its kwok provider (sigs.k8s.io/karpenter/kwok) for benches/bench_vs_karpenter.py, from the Go
# module proxy into the same cache (a few minutes, once). Not part of `make test`.
karpenter: k8s
	bash scripts/k8s/build_go.sh karpenter

# A real Prometheus (and promtool) for tests/e2e/test_prometheus.py and the dashboard's test: Debian's package, unpacked
# once into ~/.cache/ray-nodeless/prometheus (seconds; then instant).
prometheus:
	bash scripts/prometheus/install.sh

# Two pytest workers (the machine's 2 cores): tests/e2e (whole Ray clusters) runs on one worker in turn, the other
# modules whole on either, longest first (see make_scheduler in tests/suite.py). Every test's duration goes to
# tests/durations.json (committed: the `slow` marker and the scheduler's order read it).
test: $(STAMP) k8s prometheus
	$(BIN)/python -m pytest -q -n 2 --record-durations tests/durations.json

# The inner loop: no Ray cluster, no Kubernetes (no `make k8s` build needed), no config corpora, nothing recorded
# over 10 s (the markers of tests/suite.py).
FAST := not e2e and not k8s and not corpus and not slow
test-fast: $(STAMP) prometheus
	$(BIN)/python -m pytest -q -n 2 -m "$(FAST)"

# ruff (the rules in pyproject.toml; lint only, the code is not reformatted) and mypy (strict on core/, launch/,
# operate/ and providers/base.py, a baseline on the rest of the package). Both must pass; .ci/run runs this before the tests.
lint: $(STAMP)
	$(BIN)/ruff check ray_nodeless tests benches scripts examples
	$(BIN)/mypy

# The documentation site (mkdocs.yml, pages in docs/) into site/, warnings as errors (a broken link or anchor, a
# page missing from the nav). tests/docs/ builds it too and checks its links, anchors, commands and YAMLs.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benches/bench_plan.py

# Rebuilds ray_nodeless/data/catalog/ (index.json + one file per cloud region) from the reference CSVs.
catalog: $(STAMP)
	$(BIN)/python scripts/build_catalog.py --source ../shared/catalog --out ray_nodeless/data/catalog

clean:
	rm -rf $(VENV) build dist *.egg-info site
