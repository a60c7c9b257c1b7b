#!/usr/bin/env bash
# scripts/prometheus/install.sh - install (once) and cache a real Prometheus server for the tests:
#   Debian bookworm's `prometheus` package (2.42), unpacked with `dpkg -x` (a static Go binary: no dependency to
#   unpack with it).
#
# Only the Debian package registry is used. Nothing is installed system-wide: a private apt configuration (the
# machine's own Debian sources) lives in the cache and the .deb is unpacked with `dpkg -x` (scripts/lib/apt.sh, which
# scripts/k8s/build_node.sh uses too).
#
# Result: $CACHE/bin/prometheus, $CACHE/bin/promtool and the stamp $CACHE/bin/.stamp
#   CACHE=${RAY_NODELESS_PROMETHEUS_CACHE:-$HOME/.cache/ray-nodeless/prometheus}
# Idempotent (the stamp), serialised with flock on $CACHE/.lock, every network step under `timeout`.
# Usage: scripts/prometheus/install.sh      (prints the binary's path on its last line)
set -euo pipefail

main() {
CACHE=${RAY_NODELESS_PROMETHEUS_CACHE:-$HOME/.cache/ray-nodeless/prometheus}
BIN=$CACHE/bin
STAMP=$BIN/.stamp
BUILD_ID="prometheus+promtool bookworm deb (dpkg -x); v2"

is_built() { [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$BUILD_ID" ]; }

if is_built; then echo "$BIN/prometheus"; exit 0; fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=prometheus-install
# shellcheck source=SCRIPTDIR/../lib/apt.sh
source "$HERE/../lib/apt.sh"
need_tools apt-get dpkg timeout
lock_cache "$CACHE" 900
if is_built; then echo "$BIN/prometheus"; exit 0; fi

DL=$CACHE/downloads
mkdir -p "$BIN"
log "private apt lists (the machine's Debian sources; nothing system-wide changes)"
apt_private "$CACHE/apt"
apt_fetch "$DL" prometheus
rm -rf "$CACHE/deb"
deb_unpack "$DL" "$CACHE/deb" prometheus
for b in promtool prometheus; do     # promtool checks the dashboard's queries (tests/metrics/test_dashboard.py)
  cp "$CACHE/deb/usr/bin/$b" "$BIN/$b.new"
  mv "$BIN/$b.new" "$BIN/$b"
done
rm -rf "$CACHE/deb"
"$BIN/prometheus" --version > "$CACHE/version.txt" 2>&1 || die "the unpacked prometheus does not run"
log "$(head -1 "$CACHE/version.txt")"
echo "$BUILD_ID" > "$STAMP"
echo "$BIN/prometheus"
}
main "$@"
