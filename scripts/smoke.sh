#!/usr/bin/env bash
# Smoke test of ray_nodeless against a real cloud account (or moto / the fake GCE server by endpoint):
#   scripts/smoke.sh aws|gcp [CLUSTER_YAML]
# 1. `ray-nodeless plan` (the cost preview; a YAML `ray up` would refuse is refused here, naming the key)
# 2. `make wheel` when the YAML mounts the plugin's wheel (the cloud configs: their head installs ray_nodeless from
#    ./dist/ray_nodeless_wheel), then `ray up -y` from the checkout's root
# 3. a task that needs {GPU: 1}, run on the head with `ray exec`: prints the instance it ran on and its type
# 4. `ray-nodeless status` (machines, prices, cost so far)
# 5. `ray down -y` (also when a step above failed)
# 6. proof that nothing is left: zero instances tagged ray-cluster-name=<cluster> that are not terminated
# Exit status 0 only if every step passed. Costs money on a real account: a GPU worker runs for a few minutes.
#
# Environment: the cloud's usual credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID..., or gcloud ADC); RAY and
# RAY_NODELESS (the CLIs, default: from PATH); SMOKE_UP_TIMEOUT (s, default 1800), SMOKE_TASK_TIMEOUT (s, default
# 1200), SMOKE_DOWN_TIMEOUT (s, default 900); SMOKE_RAY_ADDRESS (passed to the task; default "auto" on the head).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
CLOUD="${1:-}"
case "$CLOUD" in
  aws|gcp) ;;
  *) echo "usage: $0 aws|gcp [CLUSTER_YAML]" >&2; exit 2 ;;
esac
YAML="${2:-$ROOT/cluster-configs/$CLOUD-gpu-head.yaml}"
RAY="${RAY:-ray}"
RAY_NODELESS="${RAY_NODELESS:-ray-nodeless}"
PYTHON="${PYTHON:-python}"
UP_TIMEOUT="${SMOKE_UP_TIMEOUT:-1800}"
TASK_TIMEOUT="${SMOKE_TASK_TIMEOUT:-1200}"
DOWN_TIMEOUT="${SMOKE_DOWN_TIMEOUT:-900}"

log() { echo "[smoke $(date -u +%H:%M:%S)] $*"; }
fail() { log "FAILED: $*"; FAILED=1; }
FAILED=0
UP_STARTED=0

[ -f "$YAML" ] || { log "FAILED: no cluster YAML at $YAML"; exit 2; }
YAML="$(cd "$(dirname "$YAML")" && pwd)/$(basename "$YAML")"     # absolute: `ray up` runs from $ROOT
for tool in "$RAY" "$RAY_NODELESS" "$PYTHON"; do
  command -v "$tool" >/dev/null 2>&1 || { log "FAILED: '$tool' not found (activate the venv with ray and ray-nodeless)"; exit 2; }
done
CLUSTER="$("$PYTHON" "$HERE/smoke/check.py" cluster-name "$YAML")" || { log "FAILED: cannot read $YAML"; exit 2; }
YAML_CLOUD="$("$PYTHON" -c 'import sys, yaml; print((yaml.safe_load(open(sys.argv[1])).get("provider") or {}).get("cloud", ""))' "$YAML")"
[ "$YAML_CLOUD" = "$CLOUD" ] || { log "FAILED: $YAML has provider.cloud '$YAML_CLOUD', not '$CLOUD'"; exit 2; }
log "cloud $CLOUD, cluster $CLUSTER, config $YAML"

teardown() {
  [ "$UP_STARTED" = 1 ] || return 0
  UP_STARTED=0
  log "ray down -y (timeout ${DOWN_TIMEOUT}s)"
  if ! timeout "$DOWN_TIMEOUT" "$RAY" down -y "$YAML"; then
    fail "ray down failed or timed out; the check below lists what is left"
  fi
  log "checking that no instance tagged ray-cluster-name=$CLUSTER is left"
  if ! "$PYTHON" "$HERE/smoke/check.py" leftovers "$YAML"; then
    fail "instances of cluster $CLUSTER are still there: terminate them (they cost money)"
  else
    log "nothing left"
  fi
}
trap 'teardown; log "interrupted"; exit 130' INT TERM

run() {
  # step name, then the command; stdout+stderr go to the terminal and to a log file for matching
  local name="$1"; shift
  log "$name: $*"
  "$@" 2>&1 | tee "$WORK/$name.log"
  return "${PIPESTATUS[0]}"
}
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ray-nodeless-smoke.XXXXXX")"

if ! run plan "$RAY_NODELESS" plan "$YAML"; then
  log "FAILED: ray-nodeless plan refused the config (see above); nothing was launched"
  exit 1
fi

if grep -q "ray_nodeless_wheel" "$YAML" && ! run wheel make -s -C "$ROOT" wheel; then
  log "FAILED: make wheel (the plugin's wheel the YAML mounts for the head); nothing was launched"
  exit 1
fi
cd "$ROOT"
UP_STARTED=1
if ! run up timeout "$UP_TIMEOUT" "$RAY" up -y "$YAML"; then
  fail "ray up failed or timed out after ${UP_TIMEOUT}s (see $WORK/up.log)"
else
  log "cluster up; running a {GPU: 1} task on it (timeout ${TASK_TIMEOUT}s: a GPU worker must be launched)"
  TASK_B64="$(base64 -w0 < "$HERE/smoke/task.py" 2>/dev/null || base64 < "$HERE/smoke/task.py" | tr -d '\n')"
  ENVS="SMOKE_TASK_TIMEOUT=$TASK_TIMEOUT"
  [ -n "${SMOKE_RAY_ADDRESS:-}" ] && ENVS="$ENVS SMOKE_RAY_ADDRESS=$SMOKE_RAY_ADDRESS"
  if ! run task timeout "$((TASK_TIMEOUT + 120))" "$RAY" exec "$YAML" \
      "echo $TASK_B64 | base64 -d > /tmp/ray_nodeless_smoke_task.py && $ENVS python /tmp/ray_nodeless_smoke_task.py"; then
    fail "the GPU task did not run (see $WORK/task.log)"
  fi
  RESULT="$(grep -o 'SMOKE_RESULT .*' "$WORK/task.log" | tail -1 | cut -d' ' -f2-)"
  if [ -n "$RESULT" ]; then
    IID="$("$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])["instance_id"])' "$RESULT")"
    ITYPE="$("$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])["instance_type"])' "$RESULT")"
    if [ -n "$IID" ]; then
      DESC="$("$PYTHON" "$HERE/smoke/check.py" describe "$YAML" "$IID" 2>&1)" || fail "instance $IID of the GPU task is unknown to $CLOUD: $DESC"
      log "GPU task ran on $IID (${ITYPE:-type not visible from the node}): $DESC"
    else
      fail "the GPU task ran on a node without RAY_CLOUD_INSTANCE_ID (not a machine of the provider): $RESULT"
    fi
  else
    fail "the GPU task printed no result (see $WORK/task.log)"
  fi
  if ! run status "$RAY_NODELESS" status "$YAML"; then
    fail "ray-nodeless status failed (see $WORK/status.log)"
  fi
fi

teardown
trap - INT TERM
if [ "$FAILED" = 0 ]; then
  log "PASSED (logs in $WORK)"
  exit 0
fi
log "FAILED (logs in $WORK)"
exit 1
