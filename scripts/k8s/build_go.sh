#!/usr/bin/env bash
# scripts/k8s/build_go.sh - build (once) and cache a CURRENT Kubernetes and its companions from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubeadm   k8s.io/kubernetes $K8S_VERSION
#   etcd                                                                       go.etcd.io/etcd/server/v3 $ETCD_VERSION
#   ray-operator (KubeRay's operator; its CRDs and RBAC are copied next to it)   github.com/ray-project/kuberay/ray-operator
#   kwok (fake Nodes at scale)                                                 sigs.k8s.io/kwok $KWOK_VERSION
#
# Kubernetes and etcd cannot be `go install`ed: their go.mod `replace` their in-tree staging / sibling modules with
# local paths, which `go install path@version` refuses. The usual way to build them as a dependency is a wrapper
# module of our own: it requires the module and pins each replaced module to its published version with `replace`
# (k8s.io/api => k8s.io/api v0.36.3, ...); the list is read from the module's own go.mod, so it cannot drift. The
# operator and kwok have no `replace` and are plain `go install`s. No other project's source is committed: the
# wrapper's go.mod is written into the cache at build time.
#
# Result: $OUT/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubeadm,etcd,ray-operator,kwok},
# $OUT/kuberay/{crd,rbac}/ (from the operator's module at the same version) and the stamp $OUT/.stamp.
#   OUT=${RAY_NODELESS_K8S_GO_CACHE:-$HOME/.cache/ray-nodeless/k8s-go}/v$K8S_VERSION
# GOPATH, GOMODCACHE and GOCACHE live under the cache too (the user's own Go setup is never touched); the Go build
# cache is removed after a successful build (KEEP_GOCACHE=1 keeps it), the module cache is kept (downloads).
#
# Idempotent (fast path: the stamp matches), serialised by flock on the cache's .lock. A progress line a minute.
# Usage: scripts/k8s/build_go.sh [all|k8s|etcd|kuberay|kwok|karpenter]   (prints the output directory on its last line;
#        `karpenter` is not part of `all`: Karpenter's kwok provider for benches/bench_vs_karpenter.py)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/apt.sh
. "$HERE/../lib/apt.sh"
LOG_TAG=k8s-go

# The versions: scripts/k8s/versions.env (the tests read the same file); the environment may override each.
_env_k8s=${K8S_VERSION:-} _env_etcd=${ETCD_VERSION:-} _env_kuberay=${KUBERAY_VERSION:-} _env_kwok=${KWOK_VERSION:-}
_env_karpenter=${KARPENTER_VERSION:-}
# shellcheck source=versions.env
. "$HERE/versions.env"
K8S_VERSION=${_env_k8s:-$K8S_VERSION}
ETCD_VERSION=${_env_etcd:-$ETCD_VERSION}
KUBERAY_VERSION=${_env_kuberay:-$KUBERAY_VERSION}
KWOK_VERSION=${_env_kwok:-$KWOK_VERSION}
KARPENTER_VERSION=${_env_karpenter:-$KARPENTER_VERSION}
ROOT=${RAY_NODELESS_K8S_GO_CACHE:-$HOME/.cache/ray-nodeless/k8s-go}
OUT=$ROOT/v$K8S_VERSION
GOROOT_BIN=${GOROOT_BIN:-/usr/local/go/bin}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-3600}
WHAT=${1:-all}
# Change this string whenever the recipe changes: a different stamp forces a rebuild.
BUILD_ID="k8s v$K8S_VERSION etcd v$ETCD_VERSION kuberay v$KUBERAY_VERSION kwok v$KWOK_VERSION; wrapper-replace; v1"
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubeadm)

export PATH=$GOROOT_BIN:$PATH GOPATH=$ROOT/gopath GOMODCACHE=$ROOT/gopath/pkg/mod GOCACHE=$ROOT/gocache \
       GOFLAGS=-modcacherw CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off
need_tools go flock timeout
mkdir -p "$ROOT" "$OUT/bin"

is_built() {
  [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$BUILD_ID" ] || return 1
  local b
  for b in "${K8S_CMDS[@]}" etcd ray-operator kwok; do [ -x "$OUT/bin/$b" ] || return 1; done
  [ -d "$OUT/kuberay/crd" ]
}

if [ "$WHAT" = all ] && is_built; then
  echo "$OUT"
  exit 0
fi
lock_cache "$ROOT" "${LOCK_TIMEOUT:-5400}"
if [ "$WHAT" = all ] && is_built; then   # another builder finished while we waited
  echo "$OUT"
  exit 0
fi

# run_logged LOG CMD...: CMD under `timeout $BUILD_TIMEOUT`, its output in LOG, a progress line a minute; the log's
# tail and exit 1 on failure.
run_logged() {
  local build_log=$1 pid rc=0 waited=0
  shift
  timeout "$BUILD_TIMEOUT" "$@" > "$build_log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064  # the pid is meant to be expanded now
  trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null; die interrupted" INT TERM
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    waited=$((waited + 5))
    if [ $((waited % 60)) -eq 0 ]; then log "   still building ($waited s): $(tail -n 1 "$build_log" | cut -c1-100)"; fi
  done
  wait "$pid" || rc=$?
  trap - INT TERM
  if [ "$rc" -ne 0 ]; then
    tail -n 30 "$build_log" >&2
    die "failed (exit $rc): $* (log: $build_log)"
  fi
}

# wrapper DIR MODULE VERSION: a module in DIR that requires MODULE@VERSION and replaces every module that MODULE's
# own go.mod replaces with a local path (`=> ./...` or `=> ../...`) by that module's published version (VERSION for
# etcd's siblings; v0.MINOR.PATCH for Kubernetes' staging modules).
wrapper() {
  local dir=$1 module=$2 version=$3 staged_version=$4 modfile
  mkdir -p "$dir"
  modfile=$(cd "$dir" && go mod download -json "$module@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$modfile" ] || die "no go.mod downloaded for $module@$version"
  {
    echo "// Written by scripts/k8s/build_go.sh: builds $module@$version as a dependency."
    echo "module ray-nodeless.local/build/$(basename "$dir")"
    echo
    echo "go $(sed -n 's/^go \([0-9.]*\).*/\1/p' "$modfile" | head -n 1)"
    echo
    echo "require $module $version"
    echo
    echo "replace ("
    sed -n 's|^\s*\([^ ]*\) => \.\.\{0,1\}/.*$|\t\1 => \1 '"$staged_version"'|p' "$modfile"
    echo ")"
  } > "$dir/go.mod"
  log "   wrapper module: $(grep -c '=>' "$dir/go.mod") replaced modules pinned to $staged_version"
}

build_k8s() {
  local minor_patch=${K8S_VERSION#*.} dir=$ROOT/wrap-k8s-$K8S_VERSION cmd
  step "Kubernetes v$K8S_VERSION (${K8S_CMDS[*]})"
  wrapper "$dir" k8s.io/kubernetes "v$K8S_VERSION" "v0.$minor_patch"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor_patch%%.*}"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  log "   go mod download (the module graph)"
  (cd "$dir" && run_logged "$ROOT/k8s-download.log" go mod download -x k8s.io/kubernetes)
  for cmd in "${K8S_CMDS[@]}"; do
    log "   go build $cmd"
    (cd "$dir" && run_logged "$ROOT/k8s-$cmd.log" go build -mod=mod -trimpath -ldflags "$ldflags" \
       -o "$OUT/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
  step_done
}

build_etcd() {
  local dir=$ROOT/wrap-etcd-$ETCD_VERSION
  step "etcd v$ETCD_VERSION"
  wrapper "$dir" go.etcd.io/etcd/server/v3 "v$ETCD_VERSION" "v$ETCD_VERSION"
  (cd "$dir" && run_logged "$ROOT/etcd.log" go build -mod=mod -trimpath -ldflags "-s -w" -o "$OUT/bin/etcd" \
     go.etcd.io/etcd/server/v3)
  step_done
}

build_kuberay() {
  local src
  step "KubeRay operator v$KUBERAY_VERSION"
  run_logged "$ROOT/kuberay.log" env GOBIN="$OUT/bin" go install -trimpath -ldflags "-s -w" \
    "github.com/ray-project/kuberay/ray-operator@v$KUBERAY_VERSION"
  # go install names the binary after the module's last path element.
  src=$GOMODCACHE/github.com/ray-project/kuberay/ray-operator@v$KUBERAY_VERSION
  rm -rf "$OUT/kuberay"
  mkdir -p "$OUT/kuberay"
  cp -r "$src/config/crd/bases" "$OUT/kuberay/crd"
  cp -r "$src/config/rbac" "$OUT/kuberay/rbac"
  chmod -R u+w "$OUT/kuberay"
  step_done
}

# Karpenter's core with its kwok provider (sigs.k8s.io/karpenter/kwok, a main package of Karpenter's own module):
# bin/karpenter-kwok, and karpenter/crd/ (NodePool, NodeClaim, NodeOverlay, KWOKNodeClass from the same module).
# Only benches/bench_vs_karpenter.py uses it; its own stamp karpenter/.stamp.
build_karpenter() {
  local src gobin=$ROOT/karpenter-gobin
  step "Karpenter v$KARPENTER_VERSION (its kwok provider)"
  rm -rf "$gobin"
  run_logged "$ROOT/karpenter.log" env GOBIN="$gobin" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/karpenter/kwok@v$KARPENTER_VERSION"
  mv -f "$gobin/kwok" "$OUT/bin/karpenter-kwok"      # go install names it after the package: kwok
  rm -rf "$gobin"
  src=$GOMODCACHE/sigs.k8s.io/karpenter@v$KARPENTER_VERSION
  rm -rf "$OUT/karpenter"
  mkdir -p "$OUT/karpenter/crd"
  cp "$src"/kwok/charts/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$OUT/karpenter/crd/"
  chmod -R u+w "$OUT/karpenter"
  echo "karpenter v$KARPENTER_VERSION" > "$OUT/karpenter/.stamp"
  step_done
}

build_kwok() {
  step "kwok v$KWOK_VERSION"
  run_logged "$ROOT/kwok.log" env GOBIN="$OUT/bin" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  step_done
}

start_steps "$ROOT"
case "$WHAT" in
  all) build_kuberay; build_kwok; build_etcd; build_k8s ;;
  k8s) build_k8s ;;
  etcd) build_etcd ;;
  kuberay) build_kuberay ;;
  kwok) build_kwok ;;
  karpenter)
    if [ "$(cat "$OUT/karpenter/.stamp" 2>/dev/null)" != "karpenter v$KARPENTER_VERSION" ] \
       || [ ! -x "$OUT/bin/karpenter-kwok" ]; then
      build_karpenter
      [ "${KEEP_GOCACHE:-0}" = 1 ] || rm -rf "$GOCACHE"
    fi ;;
  *) die "usage: $0 [all|k8s|etcd|kuberay|kwok|karpenter]" ;;
esac
if [ "$WHAT" = all ]; then
  echo "$BUILD_ID" > "$OUT/.stamp"
  [ "${KEEP_GOCACHE:-0}" = 1 ] || rm -rf "$GOCACHE"
fi
echo "$OUT"
