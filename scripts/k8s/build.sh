#!/usr/bin/env bash
# scripts/k8s/build.sh - build (once) and cache a real Kubernetes control plane for the tests:
#   kube-apiserver, kube-scheduler, kube-controller-manager  v1.20.2, built from Debian bookworm's `kubernetes`
#   source package (1.20.5+really1.20.2, the full upstream tree with vendor/) with Debian's Go 1.19,
#   etcd 3.4.23 extracted from Debian's `etcd-server` package.
#
# Only the Debian package registry is used (no GitHub, no dl.k8s.io, no Go module proxy). Nothing is installed
# system-wide: a private apt configuration (the machine's own Debian sources plus deb-src) lives in the cache, and
# every .deb is unpacked with `dpkg -x`.
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

log() { echo "[$(date +%T)] k8s-build: $*" >&2; }
die() { echo "[$(date +%T)] k8s-build: ERROR: $*" >&2; exit 1; }

is_built() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$BUILD_ID" ] || return 1
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}

# Fast path (no lock, no subprocess but cat): the stamp is written last, after every binary is in place.
if is_built; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE"
command -v flock >/dev/null || die "missing tool: flock (util-linux)"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.lock; waiting up to ${LOCK_TIMEOUT} s"
  flock -w "$LOCK_TIMEOUT" 9 || die "timed out after ${LOCK_TIMEOUT} s waiting for $CACHE/.lock"
fi
if is_built; then   # the other caller finished the build while we waited
  log "built by a concurrent caller"
  echo "$BIN"
  exit 0
fi

T_ALL=$SECONDS
T_STEP=$SECONDS
step() { T_STEP=$SECONDS; log "== $*"; }
step_done() { log "   done in $((SECONDS - T_STEP)) s"; }
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || echo "[$(date +%T)] k8s-build: FAILED (exit $rc) after $((SECONDS - T_ALL)) s; logs in $CACHE" >&2
}
trap on_exit EXIT

for t in apt-get dpkg dpkg-source make timeout find; do
  command -v "$t" >/dev/null || die "missing tool: $t"
done
[ "$(dpkg --print-architecture)" = amd64 ] || log "warning: only tested on amd64"

APTD=$CACHE/apt
DL=$CACHE/downloads        # .deb files and the source package (kept: a rebuild needs no network)
DEB=$CACHE/deb             # unpacked .debs (toolchain, rsync, etcd, reflect2 sources)
SRC=$CACHE/src             # unpacked kubernetes tree
GOHOME=$CACHE/gohome       # HOME for the build (Go build cache)
mkdir -p "$APTD"/{lists/partial,cache/archives/partial,sources.list.d} "$DL" "$BIN"

APT=(-o Dir::Etc::SourceList="$APTD/sources.list" -o Dir::Etc::SourceParts="$APTD/sources.list.d"
     -o Dir::State::Lists="$APTD/lists" -o Dir::Cache="$APTD/cache" -o APT::Sandbox::User=root
     -o Debug::NoLocking=1)

# ---------------------------------------------------------------------------------------------------------------
step "1/6 private apt lists (the machine's Debian sources + deb-src; nothing system-wide changes)"
: > "$APTD/sources.list"
rm -f "$APTD"/sources.list.d/*
for f in /etc/apt/sources.list.d/*.sources; do   # deb822 (Debian 12 default)
  [ -f "$f" ] || continue
  grep -q "debian-archive-keyring" "$f" 2>/dev/null || continue
  sed -E 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb deb-src/' "$f" > "$APTD/sources.list.d/$(basename "$f")"
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do   # one-line format
  [ -f "$f" ] || continue
  grep -E '^deb[[:space:]].*debian' "$f" 2>/dev/null | grep -v -E 'cloud.google|nodesource' \
    | while read -r line; do echo "$line"; echo "deb-src${line#deb}"; done >> "$APTD/sources.list" || true
done
if ! ls "$APTD"/sources.list.d/*.sources >/dev/null 2>&1 && [ ! -s "$APTD/sources.list" ]; then
  log "no Debian apt sources found on this machine; using deb.debian.org bookworm"
  printf 'deb http://deb.debian.org/debian bookworm main\ndeb-src http://deb.debian.org/debian bookworm main\n' \
    > "$APTD/sources.list"
fi
if [ ! -f "$APTD/.updated" ] || [ -n "$(find "$APTD/.updated" -mmin +1440)" ]; then
  timeout 600 apt-get "${APT[@]}" -q update > "$APTD/update.log" 2>&1 \
    || { tail -20 "$APTD/update.log" >&2; die "apt-get update failed (private config in $APTD)"; }
  touch "$APTD/.updated"
fi
step_done

# ---------------------------------------------------------------------------------------------------------------
step "2/6 Debian binary packages: Go 1.19, rsync + libpopt0, etcd-server, reflect2 sources (dpkg -x, not installed)"
PKGS=(golang-1.19-go golang-1.19-src rsync libpopt0 etcd-server golang-github-modern-go-reflect2-dev)
cd "$DL"
for p in "${PKGS[@]}"; do
  if ! ls "${p}"_*.deb >/dev/null 2>&1; then
    log "   apt-get download $p"
    timeout 600 apt-get "${APT[@]}" -q download "$p" > "$DL/download-$p.log" 2>&1 || true
    ls "${p}"_*.deb >/dev/null 2>&1 || { tail -10 "$DL/download-$p.log" >&2; die "download of $p failed"; }
  fi
done
GOROOT_DEB=$DEB/usr/lib/go-1.19
R2_DEB=$DEB/usr/share/gocode/src/github.com/modern-go/reflect2
if [ ! -x "$DEB/usr/bin/etcd" ] || [ ! -x "$GOROOT_DEB/bin/go" ] || [ ! -x "$DEB/usr/bin/rsync" ] \
   || [ ! -f "$R2_DEB/reflect2.go" ]; then
  rm -rf "$DEB"; mkdir -p "$DEB"
  for p in "${PKGS[@]}"; do dpkg -x "$(ls "${p}"_*.deb | head -1)" "$DEB"; done
fi
# rsync workaround: the Makefile's build runs rsync; use Debian's, with its libpopt next to it
mkdir -p "$DEB/wrap"
cat > "$DEB/wrap/rsync" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$DEB/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $DEB/usr/bin/rsync "\$@"
EOF
chmod +x "$DEB/wrap/rsync"
"$GOROOT_DEB/bin/go" version >&2 || die "Go 1.19 from Debian does not run"
"$DEB/wrap/rsync" --version | sed -n 1p >&2 || die "rsync wrapper does not run"
"$DEB/usr/bin/etcd" --version | sed -n 1p >&2 || die "etcd from Debian does not run"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "3/6 Debian source package kubernetes (1.20.5+really1.20.2)"
K=$SRC/kubernetes
if [ ! -d "$K/cmd/kube-apiserver" ] || [ ! -f "$K/.unpacked" ]; then
  mkdir -p "$DL/source"
  cd "$DL/source"
  if ! ls kubernetes_*.dsc >/dev/null 2>&1; then
    log "   apt-get source --download-only kubernetes (large: the upstream tree with vendor/)"
    timeout 1200 apt-get "${APT[@]}" -q source --download-only kubernetes > "$DL/source.log" 2>&1 \
      || { tail -20 "$DL/source.log" >&2; rm -f kubernetes_*.dsc; die "apt-get source kubernetes failed"; }
  fi
  rm -rf "$SRC"; mkdir -p "$SRC"
  log "   dpkg-source -x"
  dpkg-source --no-check -x "$(ls kubernetes_*.dsc | head -1)" "$K" > "$SRC/unpack.log" 2>&1 \
    || { tail -20 "$SRC/unpack.log" >&2; die "dpkg-source -x failed"; }
  touch "$K/.unpacked"
fi
# reflect2 pitfall: vendored v1.0.1 + Go >= 1.18 -> SIGSEGV in mapiterinit inside the API server. Use 1.0.2.
R2=$K/vendor/github.com/modern-go/reflect2
[ -d "$R2" ] || die "vendored reflect2 not found at $R2"
rm -f "$R2"/*.go
cp "$R2_DEB"/*.go "$R2"/
[ -f "$R2/go_above_118.go" ] || die "reflect2 sources from Debian lack go_above_118.go (expected v1.0.2)"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "4/6 make WHAT=\"cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager\" (Go 1.19; 5-20 min)"
cd "$K"
mkdir -p "$GOHOME"
BUILD_LOG=$CACHE/build.log
(
  export GOROOT=$GOROOT_DEB PATH=$GOROOT_DEB/bin:$DEB/wrap:$PATH HOME=$GOHOME \
         GOCACHE=$GOHOME/go-build GOPATH=$GOHOME/go \
         CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOTOOLCHAIN=local GO111MODULE=
  exec timeout "$BUILD_TIMEOUT" make WHAT="cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager" \
       GOLDFLAGS="-s -w"
) > "$BUILD_LOG" 2>&1 &
MAKE_PID=$!
# `timeout` runs make in its own process group and forwards TERM to all of it
trap 'kill "$MAKE_PID" 2>/dev/null; wait "$MAKE_PID" 2>/dev/null; die "interrupted"' INT TERM
while kill -0 "$MAKE_PID" 2>/dev/null; do
  for _ in $(seq 1 60); do kill -0 "$MAKE_PID" 2>/dev/null || break; sleep 1; done
  kill -0 "$MAKE_PID" 2>/dev/null \
    && log "   still building ($((SECONDS - T_STEP)) s): $(tail -1 "$BUILD_LOG" | cut -c1-100)"
done
rc=0; wait "$MAKE_PID" || rc=$?
trap - INT TERM
if [ "$rc" != 0 ]; then
  tail -30 "$BUILD_LOG" >&2
  [ "$rc" = 124 ] && die "make timed out after ${BUILD_TIMEOUT} s (log: $BUILD_LOG)"
  die "make failed with exit $rc (log: $BUILD_LOG)"
fi
for b in kube-apiserver kube-scheduler kube-controller-manager; do
  [ -x "$K/_output/bin/$b" ] || die "make succeeded but _output/bin/$b is missing (log: $BUILD_LOG)"
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
cd "$CACHE"
if [ "$KEEP_SRC" = 0 ]; then
  rm -rf "$SRC" "$GOHOME" "$DEB"
  log "   removed the source tree, the Go build cache and the unpacked toolchain"
fi
log "   cache size: $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
step_done
log "built in $((SECONDS - T_ALL)) s: $BIN"
echo "$BIN"
}

main "$@"
