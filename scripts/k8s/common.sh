# scripts/k8s/common.sh - the build steps scripts/k8s/build.sh (control plane) and scripts/k8s/build_node.sh (kubelet,
# kubeadm) share: both compile parts of the same Debian `kubernetes` source tree with the same unpacked Go 1.19.
# Sourced after scripts/lib/apt.sh (log, die, step timing); it only defines functions. They read the callers' globals
#   CACHE, DEB (unpacked toolchain), SRC (unpacked source tree), GOHOME (the build's HOME and Go cache), BUILD_TIMEOUT
# shellcheck shell=bash

# The Go toolchain's paths inside $DEB (Debian's golang-1.19-go, and reflect2 1.0.2's sources).
k8s_paths() {
  GOROOT_DEB=$DEB/usr/lib/go-1.19
  R2_DEB=$DEB/usr/share/gocode/src/github.com/modern-go/reflect2
}

# The kubernetes Makefile runs rsync: Debian's, unpacked in $DEB, with its libpopt next to it.
k8s_rsync_wrapper() {
  mkdir -p "$DEB/wrap"
  cat > "$DEB/wrap/rsync" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$DEB/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $DEB/usr/bin/rsync "\$@"
EOF
  chmod +x "$DEB/wrap/rsync"
}

# k8s_unpack_source DSC_DIR TREE: dpkg-source -x the .dsc in DSC_DIR into TREE (under $SRC) unless already done, then
# swap in reflect2 1.0.2: the vendored v1.0.1 built with Go >= 1.18 makes the API server crash (SIGSEGV in
# mapiterinit) when certain objects are written.
k8s_unpack_source() {
  local dsc_dir=$1 tree=$2 dscs r2
  if [ ! -f "$tree/.unpacked" ]; then
    dscs=("$dsc_dir"/kubernetes_*.dsc)
    [ -f "${dscs[0]}" ] || die "no kubernetes source package in $dsc_dir"
    rm -rf "$SRC"; mkdir -p "$SRC"
    log "   dpkg-source -x"
    dpkg-source --no-check -x "${dscs[0]}" "$tree" > "$SRC/unpack.log" 2>&1 \
      || { tail -20 "$SRC/unpack.log" >&2; die "dpkg-source -x failed"; }
    touch "$tree/.unpacked"
  fi
  r2=$tree/vendor/github.com/modern-go/reflect2
  [ -d "$r2" ] || die "vendored reflect2 not found at $r2"
  rm -f "$r2"/*.go
  cp "$R2_DEB"/*.go "$r2"/
  [ -f "$r2/go_above_118.go" ] || die "reflect2 sources from Debian lack go_above_118.go (expected v1.0.2)"
}

# k8s_make TREE LOG WHAT: `make WHAT=...` in TREE with the unpacked Go 1.19, everything vendored (no network), under
# `timeout $BUILD_TIMEOUT`; a progress line a minute; die with the log's tail on failure.
k8s_make() {
  local tree=$1 build_log=$2 what=$3 make_pid rc _
  mkdir -p "$GOHOME"
  (
    cd "$tree" || exit 1
    export GOROOT=$GOROOT_DEB PATH=$GOROOT_DEB/bin:$DEB/wrap:$PATH HOME=$GOHOME \
           GOCACHE=$GOHOME/go-build GOPATH=$GOHOME/go \
           CGO_ENABLED=0 GOPROXY=off GOFLAGS="" GOTOOLCHAIN=local GO111MODULE=
    exec timeout "$BUILD_TIMEOUT" make WHAT="$what" GOLDFLAGS="-s -w"
  ) > "$build_log" 2>&1 &
  make_pid=$!
  # `timeout` runs make in its own process group and forwards TERM to all of it
  # shellcheck disable=SC2064  # the pid is meant to be expanded now
  trap "kill $make_pid 2>/dev/null; wait $make_pid 2>/dev/null; die interrupted" INT TERM
  while kill -0 "$make_pid" 2>/dev/null; do
    for _ in $(seq 1 60); do kill -0 "$make_pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$make_pid" 2>/dev/null \
      && log "   still building ($((SECONDS - T_STEP)) s): $(tail -1 "$build_log" | cut -c1-100)"
  done
  rc=0; wait "$make_pid" || rc=$?
  trap - INT TERM
  if [ "$rc" != 0 ]; then
    tail -30 "$build_log" >&2
    [ "$rc" = 124 ] && die "make timed out after ${BUILD_TIMEOUT} s (log: $build_log)"
    die "make failed with exit $rc (log: $build_log)"
  fi
}

# The last step of both scripts: drop the source tree, the Go build cache and the unpacked toolchain (KEEP_SRC=0).
k8s_clean_up() {
  local keep_src=$1
  cd "$CACHE" || die "no $CACHE"
  if [ "$keep_src" = 0 ]; then
    rm -rf "$SRC" "$GOHOME" "$DEB"
    log "   removed the source tree, the Go build cache and the unpacked toolchain"
  fi
  log "   cache size: $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
}
