#!/usr/bin/env bash
# scripts/prometheus/install.sh - install (once) and cache a real Prometheus server for the tests:
#   Debian bookworm's `prometheus` package (2.42), unpacked with `dpkg -x` (a static Go binary: no dependency to
#   unpack with it).
#
# Only the Debian package registry is used. Nothing is installed system-wide: a private apt configuration (the
# machine's own Debian sources) lives in the cache, as scripts/k8s/build.sh does, and the .deb is unpacked with
# `dpkg -x`.
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

log() { echo "[$(date +%T)] prometheus-install: $*" >&2; }
die() { echo "[$(date +%T)] prometheus-install: ERROR: $*" >&2; exit 1; }
is_built() { [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$BUILD_ID" ]; }

if is_built; then echo "$BIN/prometheus"; exit 0; fi
for t in apt-get dpkg flock timeout; do command -v "$t" >/dev/null || die "missing tool: $t"; done
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -w 900 9 || die "timed out waiting for $CACHE/.lock"
if is_built; then echo "$BIN/prometheus"; exit 0; fi

APTD=$CACHE/apt
DL=$CACHE/downloads
mkdir -p "$APTD"/{lists/partial,cache/archives/partial,sources.list.d} "$DL" "$BIN"
APT=(-o Dir::Etc::SourceList="$APTD/sources.list" -o Dir::Etc::SourceParts="$APTD/sources.list.d"
     -o Dir::State::Lists="$APTD/lists" -o Dir::Cache="$APTD/cache" -o APT::Sandbox::User=root
     -o Debug::NoLocking=1)

log "private apt lists (the machine's Debian sources; nothing system-wide changes)"
: > "$APTD/sources.list"
rm -f "$APTD"/sources.list.d/*
for f in /etc/apt/sources.list.d/*.sources; do   # deb822 (Debian 12 default)
  [ -f "$f" ] || continue
  grep -q "debian-archive-keyring" "$f" 2>/dev/null || continue
  cp "$f" "$APTD/sources.list.d/$(basename "$f")"
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do   # one-line format
  [ -f "$f" ] || continue
  grep -E '^deb[[:space:]].*debian' "$f" 2>/dev/null | grep -v -E 'cloud.google|nodesource' >> "$APTD/sources.list" || true
done
if ! ls "$APTD"/sources.list.d/*.sources >/dev/null 2>&1 && [ ! -s "$APTD/sources.list" ]; then
  log "no Debian apt sources found on this machine; using deb.debian.org bookworm"
  echo 'deb http://deb.debian.org/debian bookworm main' > "$APTD/sources.list"
fi
if [ ! -f "$APTD/.updated" ] || [ -n "$(find "$APTD/.updated" -mmin +1440)" ]; then
  timeout 600 apt-get "${APT[@]}" -q update > "$APTD/update.log" 2>&1 \
    || { tail -20 "$APTD/update.log" >&2; die "apt-get update failed (private config in $APTD)"; }
  touch "$APTD/.updated"
fi

cd "$DL"
if ! ls prometheus_*.deb >/dev/null 2>&1; then
  log "apt-get download prometheus"
  timeout 600 apt-get "${APT[@]}" -q download prometheus > "$DL/download.log" 2>&1 \
    || { tail -20 "$DL/download.log" >&2; die "apt-get download prometheus failed"; }
fi
rm -rf "$CACHE/deb"
dpkg -x "$(ls prometheus_*.deb | head -1)" "$CACHE/deb"
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
