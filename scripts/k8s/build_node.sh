#!/usr/bin/env bash
# scripts/k8s/build_node.sh - build (once) and cache what a real Kubernetes *node* needs on this host, next to the
# control plane of build.sh:
#   kubelet + kubeadm v1.20.2     built from the same Debian `kubernetes` source package as the control plane
#                                 (the archives build.sh keeps in $CACHE/downloads; Debian's Go 1.19)
#   containerd 1.6.20, runc 1.1.5, the CNI plugins, busybox-static, iptables (nft) + its libraries
#                                 Debian bookworm debs unpacked with dpkg -x (nothing installed system-wide)
#   images/pause.tar              the sandbox image (gcc -static of the tree's build/pause/linux/pause.c): no registry
#   images/ray-host.tar           busybox + a usr-merged skeleton: a Ray pod hostPath-mounts /usr and a Python
#
# Result: $CACHE/node/{bin,cni/bin,images} and the stamp $CACHE/node/.stamp; the control plane's stamp
# ($CACHE/bin/.stamp) is never touched, so a cached control plane is not rebuilt.
#   CACHE=${RAY_NODELESS_K8S_CACHE:-$HOME/.cache/ray-nodeless/k8s}
#
# Idempotent (fast path: the stamp matches), serialised with build.sh and other callers by flock on $CACHE/.lock (the
# two share the unpacked source tree and toolchain). It runs build.sh first (KEEP_SRC=1, so a fresh clone compiles
# the shared packages once); at the end it deletes the source tree, the Go build cache and the unpacked toolchain as
# build.sh does (KEEP_SRC=1 keeps them).
#
# Usage: scripts/k8s/build_node.sh     (prints the node directory on its last line)
#        BUILD_TIMEOUT=3600 (seconds for `make`), LOCK_TIMEOUT=5400 (seconds to wait for another builder)
set -euo pipefail

main() {
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RAY_NODELESS_K8S_CACHE:-$HOME/.cache/ray-nodeless/k8s}
KEEP_SRC=${KEEP_SRC:-0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-3600}
LOCK_TIMEOUT=${LOCK_TIMEOUT:-5400}
NODE=$CACHE/node
STAMP=$NODE/.stamp
# Change this string whenever the recipe changes: a different stamp forces a rebuild (of the node part only).
BUILD_ID="node: kubelet+kubeadm v1.20.2 (Debian 1.20.5+really1.20.2) go1.19 reflect2-1.0.2;"
BUILD_ID+=" containerd runc containernetworking-plugins busybox-static iptables bookworm; pause+ray-host images; v1"
NODE_FILES=(bin/kubelet bin/kubeadm bin/containerd bin/containerd-shim-runc-v2 bin/ctr bin/runc bin/iptables
            cni/bin/bridge cni/bin/host-local cni/bin/loopback images/pause.tar images/ray-host.tar)

log() { echo "[$(date +%T)] k8s-node-build: $*" >&2; }
die() { echo "[$(date +%T)] k8s-node-build: ERROR: $*" >&2; exit 1; }

is_built() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$BUILD_ID" ] || return 1
  local f
  for f in "${NODE_FILES[@]}"; do [ -e "$NODE/$f" ] || return 1; done
}

if is_built; then
  echo "$NODE"
  exit 0
fi

# The control plane first (its apt configuration and downloaded archives are reused here). KEEP_SRC=1: when it has
# to build, its source tree and Go build cache stay for the kubelet's make (shared packages compile once).
KEEP_SRC=1 bash "$HERE/build.sh" > /dev/null

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.lock; waiting up to ${LOCK_TIMEOUT} s"
  flock -w "$LOCK_TIMEOUT" 9 || die "timed out after ${LOCK_TIMEOUT} s waiting for $CACHE/.lock"
fi
if is_built; then
  log "built by a concurrent caller"
  echo "$NODE"
  exit 0
fi

T_ALL=$SECONDS
T_STEP=$SECONDS
step() { T_STEP=$SECONDS; log "== $*"; }
step_done() { log "   done in $((SECONDS - T_STEP)) s"; }
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || echo "[$(date +%T)] k8s-node-build: FAILED (exit $rc) after $((SECONDS - T_ALL)) s; logs in $CACHE" >&2
}
trap on_exit EXIT
for t in apt-get dpkg dpkg-source make timeout gcc python3; do
  command -v "$t" >/dev/null || die "missing tool: $t"
done

APTD=$CACHE/apt            # build.sh's private apt configuration
DL=$CACHE/downloads
DEB=$CACHE/deb
SRC=$CACHE/src
GOHOME=$CACHE/gohome
NDEB=$CACHE/node-deb       # the node's unpacked debs (kept: containerd, runc and iptables run from here)
[ -f "$APTD/.updated" ] || die "build.sh left no apt configuration in $APTD"
APT=(-o Dir::Etc::SourceList="$APTD/sources.list" -o Dir::Etc::SourceParts="$APTD/sources.list.d"
     -o Dir::State::Lists="$APTD/lists" -o Dir::Cache="$APTD/cache" -o APT::Sandbox::User=root
     -o Debug::NoLocking=1)

# ---------------------------------------------------------------------------------------------------------------
step "1/5 Debian packages: build toolchain (kept by build.sh) + containerd, runc, CNI plugins, busybox, iptables"
TOOL_PKGS=(golang-1.19-go golang-1.19-src rsync libpopt0 golang-github-modern-go-reflect2-dev)
NODE_PKGS=(containerd runc containernetworking-plugins busybox-static iptables libip6tc2 libip4tc2 libxtables12
           libnftnl11 libnetfilter-conntrack3 libnfnetlink0 libmnl0)
mkdir -p "$DL/node"
cd "$DL"
for p in "${TOOL_PKGS[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || die "build.sh left no $p archive in $DL"; done
cd "$DL/node"
for p in "${NODE_PKGS[@]}"; do
  if ! ls "${p}"_*.deb >/dev/null 2>&1; then
    log "   apt-get download $p"
    timeout 600 apt-get "${APT[@]}" -q download "$p" > "$DL/node/download-$p.log" 2>&1 || true
    ls "${p}"_*.deb >/dev/null 2>&1 || { tail -10 "$DL/node/download-$p.log" >&2; die "download of $p failed"; }
  fi
done
GOROOT_DEB=$DEB/usr/lib/go-1.19
R2_DEB=$DEB/usr/share/gocode/src/github.com/modern-go/reflect2
if [ ! -x "$GOROOT_DEB/bin/go" ] || [ ! -x "$DEB/usr/bin/rsync" ] || [ ! -f "$R2_DEB/reflect2.go" ]; then
  rm -rf "$DEB"; mkdir -p "$DEB"
  for p in "${TOOL_PKGS[@]}"; do dpkg -x "$(ls "$DL/${p}"_*.deb | head -1)" "$DEB"; done
fi
mkdir -p "$DEB/wrap"
cat > "$DEB/wrap/rsync" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$DEB/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $DEB/usr/bin/rsync "\$@"
EOF
chmod +x "$DEB/wrap/rsync"
rm -rf "$NDEB"; mkdir -p "$NDEB"
for p in "${NODE_PKGS[@]}"; do dpkg -x "$(ls "$DL/node/${p}"_*.deb | head -1)" "$NDEB"; done
step_done

# ---------------------------------------------------------------------------------------------------------------
step "2/5 the kubernetes source tree (build.sh's archive; reflect2 1.0.2 swapped in as for the control plane)"
K=$SRC/kubernetes
if [ ! -d "$K/cmd/kubelet" ] || [ ! -f "$K/.unpacked" ]; then
  cd "$DL/source"
  ls kubernetes_*.dsc >/dev/null 2>&1 || die "build.sh left no kubernetes source package in $DL/source"
  rm -rf "$SRC"; mkdir -p "$SRC"
  log "   dpkg-source -x"
  dpkg-source --no-check -x "$(ls kubernetes_*.dsc | head -1)" "$K" > "$SRC/unpack.log" 2>&1 \
    || { tail -20 "$SRC/unpack.log" >&2; die "dpkg-source -x failed"; }
  touch "$K/.unpacked"
fi
R2=$K/vendor/github.com/modern-go/reflect2
rm -f "$R2"/*.go
cp "$R2_DEB"/*.go "$R2"/
step_done

# ---------------------------------------------------------------------------------------------------------------
step "3/5 make WHAT=\"cmd/kubelet cmd/kubeadm\" (Go 1.19; about 8 min cold on 2 cores)"
cd "$K"
mkdir -p "$GOHOME"
BUILD_LOG=$CACHE/build-node.log
(
  export GOROOT=$GOROOT_DEB PATH=$GOROOT_DEB/bin:$DEB/wrap:$PATH HOME=$GOHOME \
         GOCACHE=$GOHOME/go-build GOPATH=$GOHOME/go \
         CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOTOOLCHAIN=local GO111MODULE=
  exec timeout "$BUILD_TIMEOUT" make WHAT="cmd/kubelet cmd/kubeadm" GOLDFLAGS="-s -w"
) > "$BUILD_LOG" 2>&1 &
MAKE_PID=$!
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
  die "make failed with exit $rc (log: $BUILD_LOG)"
fi
step_done

# ---------------------------------------------------------------------------------------------------------------
step "4/5 install into $NODE (binaries, CNI plugins, iptables wrappers, images)"
rm -f "$STAMP"
mkdir -p "$NODE/bin" "$NODE/cni/bin" "$NODE/images"
inst() { cp "$1" "$2.tmp" && mv -f "$2.tmp" "$2"; }
for b in kubelet kubeadm; do inst "$K/_output/bin/$b" "$NODE/bin/$b"; done
for b in containerd containerd-shim-runc-v2 ctr; do inst "$NDEB/usr/bin/$b" "$NODE/bin/$b"; done
inst "$NDEB/usr/sbin/runc" "$NODE/bin/runc"
for f in "$NDEB"/usr/lib/cni/*; do inst "$f" "$NODE/cni/bin/$(basename "$f")"; done
# iptables-nft from the unpacked debs (the CNI bridge plugin and the kubelet's probes call it)
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s XTABLES_LIBDIR=%s\nexec %s %s "$@"\n' "$NDEB/usr/lib/x86_64-linux-gnu" \
    "$NDEB/usr/lib/x86_64-linux-gnu/xtables" "$NDEB/usr/sbin/xtables-nft-multi" "$t" > "$NODE/bin/$t"
  chmod +x "$NODE/bin/$t"
done
IMG=$CACHE/node-img
rm -rf "$IMG"; mkdir -p "$IMG/pause" "$IMG/rh"/{bin,proc,sys,dev,etc,tmp,root,usr,run,var}
gcc -Os -Wall -static -DVERSION=v3.4-local -o "$IMG/pause/pause" "$K/build/pause/linux/pause.c" \
  || die "gcc -static of pause.c failed (libc6-dev's libc.a is needed)"
cp "$NDEB/bin/busybox" "$IMG/rh/bin/"
for a in $("$NDEB/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$IMG/rh/bin/$a"; done
# usr-merged skeleton: /lib, /lib64 and bash resolve into the hostPath-mounted /usr
ln -sfn usr/lib "$IMG/rh/lib"; ln -sfn usr/lib64 "$IMG/rh/lib64"; ln -sf /usr/bin/bash "$IMG/rh/bin/bash"
echo 'root:x:0:0:root:/root:/bin/sh' > "$IMG/rh/etc/passwd"; echo 'root:x:0:' > "$IMG/rh/etc/group"
python3 "$HERE/mkimage.py" "$IMG/pause" local/pause:3.4 "$NODE/images/.pause.tar.tmp" /pause >&2
python3 "$HERE/mkimage.py" "$IMG/rh" local/ray-host:1 "$NODE/images/.ray-host.tar.tmp" >&2
mv -f "$NODE/images/.pause.tar.tmp" "$NODE/images/pause.tar"
mv -f "$NODE/images/.ray-host.tar.tmp" "$NODE/images/ray-host.tar"
rm -rf "$IMG"
"$NODE/bin/kubelet" --version >&2 || die "kubelet does not run"
"$NODE/bin/kubeadm" version -o short >&2 || die "kubeadm does not run"
"$NODE/bin/containerd" --version >&2 || die "containerd does not run"
"$NODE/bin/runc" --version | sed -n 1p >&2 || die "runc does not run"
echo "$BUILD_ID" > "$STAMP.tmp" && mv -f "$STAMP.tmp" "$STAMP"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "5/5 clean up (KEEP_SRC=$KEEP_SRC)"
cd "$CACHE"
if [ "$KEEP_SRC" = 0 ]; then
  rm -rf "$SRC" "$GOHOME" "$DEB"
  log "   removed the source tree, the Go build cache and the unpacked toolchain"
fi
log "   cache size: $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
step_done
log "built in $((SECONDS - T_ALL)) s: $NODE"
echo "$NODE"
}

main "$@"
