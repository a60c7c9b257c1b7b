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

LOG_TAG=k8s-node-build
# shellcheck source=SCRIPTDIR/../lib/apt.sh
source "$HERE/../lib/apt.sh"
# shellcheck source=SCRIPTDIR/common.sh
source "$HERE/common.sh"

lock_cache "$CACHE" "$LOCK_TIMEOUT"
if is_built; then
  log "built by a concurrent caller"
  echo "$NODE"
  exit 0
fi

start_steps "$CACHE"
need_tools apt-get dpkg dpkg-source make timeout gcc python3

APTD=$CACHE/apt            # build.sh's private apt configuration
DL=$CACHE/downloads
DEB=$CACHE/deb
SRC=$CACHE/src
GOHOME=$CACHE/gohome
NDEB=$CACHE/node-deb       # the node's unpacked debs (kept: containerd, runc and iptables run from here)
apt_use "$APTD"
k8s_paths

# ---------------------------------------------------------------------------------------------------------------
step "1/5 Debian packages: build toolchain (kept by build.sh) + containerd, runc, CNI plugins, busybox, iptables"
TOOL_PKGS=(golang-1.19-go golang-1.19-src rsync libpopt0 golang-github-modern-go-reflect2-dev)
NODE_PKGS=(containerd runc containernetworking-plugins busybox-static iptables libip6tc2 libip4tc2 libxtables12
           libnftnl11 libnetfilter-conntrack3 libnfnetlink0 libmnl0)
apt_fetch "$DL/node" "${NODE_PKGS[@]}"
if [ ! -x "$GOROOT_DEB/bin/go" ] || [ ! -x "$DEB/usr/bin/rsync" ] || [ ! -f "$R2_DEB/reflect2.go" ]; then
  rm -rf "$DEB"
  deb_unpack "$DL" "$DEB" "${TOOL_PKGS[@]}"     # build.sh's archives
fi
k8s_rsync_wrapper
rm -rf "$NDEB"
deb_unpack "$DL/node" "$NDEB" "${NODE_PKGS[@]}"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "2/5 the kubernetes source tree (build.sh's archive; reflect2 1.0.2 swapped in as for the control plane)"
K=$SRC/kubernetes
k8s_unpack_source "$DL/source" "$K"      # build.sh downloaded the source package
step_done

# ---------------------------------------------------------------------------------------------------------------
step "3/5 make WHAT=\"cmd/kubelet cmd/kubeadm\" (Go 1.19; about 8 min cold on 2 cores)"
k8s_make "$K" "$CACHE/build-node.log" "cmd/kubelet cmd/kubeadm"
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
k8s_clean_up "$KEEP_SRC"
step_done
log "built in $((SECONDS - T_ALL)) s: $NODE"
echo "$NODE"
}

main "$@"
