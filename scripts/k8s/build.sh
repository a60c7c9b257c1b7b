#!/usr/bin/env bash
# scripts/k8s/build.sh - build (once) and cache a real Kubernetes control plane for the tests:
#   kube-apiserver, kube-scheduler, kube-controller-manager  v1.20.2, built from Debian bookworm's `kubernetes`
#   source package (1.20.5+really1.20.2, the full upstream tree with vendor/) with Debian's Go 1.19,
#   etcd 3.4.23 extracted from Debian's `etcd-server` package.
#
# Only the Debian package registry is used (no GitHub, no dl.k8s.io, no Go module proxy). Nothing is installed
# system-wide: a private apt configuration (the machine's own Debian sources plus deb-src; scripts/lib/apt.sh) lives in
# the cache, and every .deb is unpacked with `dpkg -x`. The steps build_node.sh repeats are in scripts/k8s/common.sh.
#
# Result: $CACHE/bin/{kube-apiserver,kube-scheduler,kube-controller-manager,etcd} and the stamp $CACHE/bin/.stamp
#   CACHE=${RAY_NODELESS_K8S_CACHE:-$HOME/.cache/ray-nodeless/k8s}
#
# Idempotent: when the stamp matches, the script returns at once. Concurrent callers are serialised with flock on
# $CACHE/.lock (the second one waits, then finds the stamp). Bounded: each network/build step runs under `timeout`.
# KEEP_SRC=0 (default) deletes the unpacked source tree, the Go build cache and the unpacked toolchain after a
# successful build (about 2.5 GB while building; about 300 MB afterwards, most of it the downloaded archives).
#
# Pitfalls handled (see docs in the header of each step):
#   * the vendored github.com/modern-go/reflect2 v1.0.1 built with Go >= 1.18 makes the API server crash
#     (SIGSEGV in mapiterinit) when certain objects are written: Debian's reflect2 1.0.2 sources are swapped in;
#   * the kubernetes Makefile needs rsync: Debian's rsync + libpopt0 are unpacked and wrapped with LD_LIBRARY_PATH;
#   * everything is vendored: GOPROXY=off GOFLAGS= CGO_ENABLED=0 GOTOOLCHAIN=local.
#
# Usage: scripts/k8s/build.sh          (prints the bin directory on its last line)
#        KEEP_SRC=1 scripts/k8s/build.sh   keep the source tree (for rebuilding by hand)
#        BUILD_TIMEOUT=3600 (seconds for `make`), LOCK_TIMEOUT=5400 (seconds to wait for another builder)
set -euo pipefail

# Everything runs inside main(), which bash parses whole before running it: editing this file while a build is
# running (bash reads scripts incrementally) cannot break that build.
main() {
CACHE=${RAY_NODELESS_K8S_CACHE:-$HOME/.cache/ray-nodeless/k8s}
KEEP_SRC=${KEEP_SRC:-0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-3600}
LOCK_TIMEOUT=${LOCK_TIMEOUT:-5400}
BIN=$CACHE/bin
STAMP=$BIN/.stamp
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager etcd)
# Change this string whenever the recipe changes: a different stamp forces a rebuild.
BUILD_ID="k8s v1.20.2 (Debian 1.20.5+really1.20.2) go1.19 reflect2-1.0.2"
BUILD_ID+=" apiserver+scheduler+controller-manager; etcd-server bookworm; v1"

is_built() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$BUILD_ID" ] || return 1
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}

# Fast path (no lock, no subprocess but cat, nothing sourced): the stamp is written last, after every binary is in place.
if is_built; then
  echo "$BIN"
  exit 0
fi

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=k8s-build
# shellcheck source=SCRIPTDIR/../lib/apt.sh
source "$HERE/../lib/apt.sh"
# shellcheck source=SCRIPTDIR/common.sh
source "$HERE/common.sh"

lock_cache "$CACHE" "$LOCK_TIMEOUT"
if is_built; then   # the other caller finished the build while we waited
  log "built by a concurrent caller"
  echo "$BIN"
  exit 0
fi

start_steps "$CACHE"
need_tools apt-get dpkg dpkg-source make timeout find
[ "$(dpkg --print-architecture)" = amd64 ] || log "warning: only tested on amd64"

APTD=$CACHE/apt
DL=$CACHE/downloads        # .deb files and the source package (kept: a rebuild needs no network)
DEB=$CACHE/deb             # unpacked .debs (toolchain, rsync, etcd, reflect2 sources)
SRC=$CACHE/src             # unpacked kubernetes tree
GOHOME=$CACHE/gohome       # HOME for the build (Go build cache)
mkdir -p "$DL" "$BIN"
k8s_paths

# ---------------------------------------------------------------------------------------------------------------
step "1/6 private apt lists (the machine's Debian sources + deb-src; nothing system-wide changes)"
apt_private "$APTD" src
step_done

# ---------------------------------------------------------------------------------------------------------------
step "2/6 Debian binary packages: Go 1.19, rsync + libpopt0, etcd-server, reflect2 sources (dpkg -x, not installed)"
PKGS=(golang-1.19-go golang-1.19-src rsync libpopt0 etcd-server golang-github-modern-go-reflect2-dev)
apt_fetch "$DL" "${PKGS[@]}"
if [ ! -x "$DEB/usr/bin/etcd" ] || [ ! -x "$GOROOT_DEB/bin/go" ] || [ ! -x "$DEB/usr/bin/rsync" ] \
   || [ ! -f "$R2_DEB/reflect2.go" ]; then
  rm -rf "$DEB"
  deb_unpack "$DL" "$DEB" "${PKGS[@]}"
fi
k8s_rsync_wrapper
"$GOROOT_DEB/bin/go" version >&2 || die "Go 1.19 from Debian does not run"
"$DEB/wrap/rsync" --version | sed -n 1p >&2 || die "rsync wrapper does not run"
"$DEB/usr/bin/etcd" --version | sed -n 1p >&2 || die "etcd from Debian does not run"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "3/6 Debian source package kubernetes (1.20.5+really1.20.2)"
K=$SRC/kubernetes
if [ ! -f "$K/.unpacked" ] && ! ls "$DL"/source/kubernetes_*.dsc >/dev/null 2>&1; then
  mkdir -p "$DL/source"
  log "   apt-get source --download-only kubernetes (large: the upstream tree with vendor/)"
  (cd "$DL/source" && timeout 1200 apt-get "${APT[@]}" -q source --download-only kubernetes) > "$DL/source.log" 2>&1 \
    || { tail -20 "$DL/source.log" >&2; rm -f "$DL"/source/kubernetes_*.dsc; die "apt-get source kubernetes failed"; }
fi
k8s_unpack_source "$DL/source" "$K"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "4/6 make WHAT=\"cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager\" (Go 1.19; 5-20 min)"
k8s_make "$K" "$CACHE/build.log" "cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager"
for b in kube-apiserver kube-scheduler kube-controller-manager; do
  [ -x "$K/_output/bin/$b" ] || die "make succeeded but _output/bin/$b is missing (log: $CACHE/build.log)"
done
step_done

# ---------------------------------------------------------------------------------------------------------------
step "5/6 install into $BIN"
rm -f "$STAMP"
for b in kube-apiserver kube-scheduler kube-controller-manager; do
  cp "$K/_output/bin/$b" "$BIN/.$b.tmp" && mv -f "$BIN/.$b.tmp" "$BIN/$b"
done
cp "$DEB/usr/bin/etcd" "$BIN/.etcd.tmp" && mv -f "$BIN/.etcd.tmp" "$BIN/etcd"
for b in "${BINARIES[@]}"; do
  "$BIN/$b" --version 2>&1 | sed -n 1p | sed "s/^/   $b: /" >&2 || die "$BIN/$b does not run"
done
echo "$BUILD_ID" > "$STAMP.tmp" && mv -f "$STAMP.tmp" "$STAMP"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "6/6 clean up (KEEP_SRC=$KEEP_SRC)"
k8s_clean_up "$KEEP_SRC"
step_done
log "built in $((SECONDS - T_ALL)) s: $BIN"
echo "$BIN"
}

main "$@"
