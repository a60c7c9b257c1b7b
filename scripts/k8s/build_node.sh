#!/usr/bin/env bash
# scripts/k8s/build_node.sh - build (once) and cache what a real Kubernetes *node* needs on this host, next to the
# control plane of build_go.sh:
#   kubelet + kubeadm             from build_go.sh (k8s.io/kubernetes at scripts/k8s/versions.env's K8S_VERSION)
#   containerd 1.6.20, runc 1.1.5, the CNI plugins, busybox-static, iptables (nft) + its libraries
#                                 Debian bookworm debs unpacked with dpkg -x (nothing installed system-wide)
#   images/pause.tar              the sandbox image (gcc -static of build/pause/linux/pause.c from the same
#                                 k8s.io/kubernetes module version, in the Go module cache): no registry
#   images/ray-host.tar           busybox + a usr-merged skeleton: a Ray pod hostPath-mounts /usr and a Python
#
# Result: $NODE/{bin,cni/bin,images} and the stamp $NODE/.stamp.
#   NODE=${RAY_NODELESS_K8S_NODE:-$HOME/.cache/ray-nodeless/k8s-node}
#
# Idempotent (fast path: the stamp matches), serialised by flock on $NODE/.lock. It runs build_go.sh first (which
# returns at once when built).
#
# Usage: scripts/k8s/build_node.sh     (prints the node directory on its last line)
#        LOCK_TIMEOUT=5400 (seconds to wait for another builder)
set -euo pipefail

main() {
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODE=${RAY_NODELESS_K8S_NODE:-$HOME/.cache/ray-nodeless/k8s-node}
LOCK_TIMEOUT=${LOCK_TIMEOUT:-5400}
STAMP=$NODE/.stamp
_env_k8s=${K8S_VERSION:-}
# shellcheck source=versions.env
. "$HERE/versions.env"
K8S_VERSION=${_env_k8s:-$K8S_VERSION}
# Change this string whenever the recipe changes: a different stamp forces a rebuild.
BUILD_ID="node: kubelet+kubeadm v$K8S_VERSION (build_go.sh);"
BUILD_ID+=" containerd runc containernetworking-plugins busybox-static iptables bookworm; pause+ray-host images; v2"
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

# The control plane's build first: it has the kubelet and kubeadm, and the module cache with pause.c.
GO_OUT=$(bash "$HERE/build_go.sh" all | tail -n 1)
GO_ROOT=$(dirname "$GO_OUT")
PAUSE_C=$GO_ROOT/gopath/pkg/mod/k8s.io/kubernetes@v$K8S_VERSION/build/pause/linux/pause.c

LOG_TAG=k8s-node-build
# shellcheck source=SCRIPTDIR/../lib/apt.sh
source "$HERE/../lib/apt.sh"

mkdir -p "$NODE"
lock_cache "$NODE" "$LOCK_TIMEOUT"
if is_built; then
  log "built by a concurrent caller"
  echo "$NODE"
  exit 0
fi

start_steps "$NODE"
need_tools apt-get dpkg timeout gcc python3

APTD=$NODE/apt             # private apt configuration (nothing system-wide changes)
DL=$NODE/downloads         # the .debs (kept: a rebuild needs no network)
NDEB=$NODE/deb             # the node's unpacked debs (kept: containerd, runc and iptables run from here)
[ -f "$PAUSE_C" ] || die "pause.c not found at $PAUSE_C (build_go.sh keeps the module cache)"

# ---------------------------------------------------------------------------------------------------------------
step "1/3 Debian packages: containerd, runc, CNI plugins, busybox, iptables (dpkg -x, not installed)"
apt_private "$APTD"
NODE_PKGS=(containerd runc containernetworking-plugins busybox-static iptables libip6tc2 libip4tc2 libxtables12
           libnftnl11 libnetfilter-conntrack3 libnfnetlink0 libmnl0)
apt_fetch "$DL" "${NODE_PKGS[@]}"
rm -rf "$NDEB"
deb_unpack "$DL" "$NDEB" "${NODE_PKGS[@]}"
step_done

# ---------------------------------------------------------------------------------------------------------------
step "2/3 install into $NODE (binaries, CNI plugins, iptables wrappers, images)"
rm -f "$STAMP"
mkdir -p "$NODE/bin" "$NODE/cni/bin" "$NODE/images"
inst() { cp "$1" "$2.tmp" && mv -f "$2.tmp" "$2"; }
for b in kubelet kubeadm; do inst "$GO_OUT/bin/$b" "$NODE/bin/$b"; done
for b in containerd containerd-shim-runc-v2 ctr; do inst "$NDEB/usr/bin/$b" "$NODE/bin/$b"; done
inst "$NDEB/usr/sbin/runc" "$NODE/bin/runc"
for f in "$NDEB"/usr/lib/cni/*; do inst "$f" "$NODE/cni/bin/$(basename "$f")"; done
# iptables-nft from the unpacked debs (the CNI bridge plugin and the kubelet's probes call it)
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s XTABLES_LIBDIR=%s\nexec %s %s "$@"\n' "$NDEB/usr/lib/x86_64-linux-gnu" \
    "$NDEB/usr/lib/x86_64-linux-gnu/xtables" "$NDEB/usr/sbin/xtables-nft-multi" "$t" > "$NODE/bin/$t"
  chmod +x "$NODE/bin/$t"
done
IMG=$NODE/img
rm -rf "$IMG"; mkdir -p "$IMG/pause" "$IMG/rh"/{bin,proc,sys,dev,etc,tmp,root,usr,run,var}
gcc -Os -Wall -static -DVERSION=v3.4-local -o "$IMG/pause/pause" "$PAUSE_C" \
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

log "built in $((SECONDS - T_ALL)) s: $NODE"
echo "$NODE"
}

main "$@"
