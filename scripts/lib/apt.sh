# scripts/lib/apt.sh - the helpers the cache-building scripts share (scripts/k8s/build_go.sh, scripts/k8s/build_node.sh,
# scripts/prometheus/install.sh). Sourced, never run: it only defines functions.
#
#   LOG_TAG=name             the prefix of log/die lines (set it before sourcing or calling)
#   log MSG / die MSG        a timestamped line on stderr; die exits 1
#   need_tools TOOL...       die naming the first tool not on PATH
#   lock_cache DIR SECONDS   serialise callers: flock on DIR/.lock (fd 9, held until the script exits)
#   start_steps LOGDIR       time the run: step/step_done lines, a FAILED line naming LOGDIR on a non-zero exit
#   apt_private DIR [src]    a private apt configuration in DIR from the machine's own Debian sources (with deb-src
#                            lines when the second argument is `src`), `apt-get update` when older than a day; sets
#                            the array APT of apt-get options pointing at it
#   apt_use DIR              set APT for a private configuration apt_private made earlier (die if there is none)
#   apt_fetch DIR PKG...     `apt-get download` each PKG whose .deb is not yet in DIR (log: DIR/download-PKG.log)
#   deb_unpack DIR DEST PKG...  dpkg -x each PKG's .deb from DIR into DEST
#
# Only the Debian package registry is used, and nothing system-wide changes: apt reads and writes only DIR
# (Debug::NoLocking: the system's apt lock is not taken), and a .deb is unpacked with dpkg -x, never installed.
# Every network step runs under `timeout`.
# shellcheck shell=bash

log() { echo "[$(date +%T)] ${LOG_TAG:-build}: $*" >&2; }
die() { echo "[$(date +%T)] ${LOG_TAG:-build}: ERROR: $*" >&2; exit 1; }

need_tools() {
  local t
  for t in "$@"; do command -v "$t" >/dev/null || die "missing tool: $t"; done
}

lock_cache() {
  local dir=$1 wait_s=$2
  need_tools flock
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  if ! flock -n 9; then
    log "another build holds $dir/.lock; waiting up to ${wait_s} s"
    flock -w "$wait_s" 9 || die "timed out after ${wait_s} s waiting for $dir/.lock"
  fi
}

start_steps() {
  STEPS_LOGDIR=$1
  T_ALL=$SECONDS
  T_STEP=$SECONDS
  trap _steps_on_exit EXIT
}
step() { T_STEP=$SECONDS; log "== $*"; }
step_done() { log "   done in $((SECONDS - T_STEP)) s"; }
_steps_on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || echo "[$(date +%T)] ${LOG_TAG:-build}: FAILED (exit $rc) after $((SECONDS - T_ALL)) s;" \
                        "logs in $STEPS_LOGDIR" >&2
}

_apt_opts() {
  APT=(-o Dir::Etc::SourceList="$1/sources.list" -o Dir::Etc::SourceParts="$1/sources.list.d"
       -o Dir::State::Lists="$1/lists" -o Dir::Cache="$1/cache" -o APT::Sandbox::User=root
       -o Debug::NoLocking=1)
}

apt_use() {
  [ -f "$1/.updated" ] || die "no private apt configuration in $1 (apt_private makes it)"
  _apt_opts "$1"
}

apt_private() {
  local dir=$1 src=${2:-} f line
  need_tools apt-get timeout find
  mkdir -p "$dir"/{lists/partial,cache/archives/partial,sources.list.d}
  : > "$dir/sources.list"
  rm -f "$dir"/sources.list.d/*
  for f in /etc/apt/sources.list.d/*.sources; do   # deb822 (Debian 12 default)
    [ -f "$f" ] || continue
    grep -q "debian-archive-keyring" "$f" 2>/dev/null || continue
    if [ "$src" = src ]; then
      sed -E 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb deb-src/' "$f" > "$dir/sources.list.d/$(basename "$f")"
    else
      cp "$f" "$dir/sources.list.d/$(basename "$f")"
    fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do   # one-line format
    [ -f "$f" ] || continue
    grep -E '^deb[[:space:]].*debian' "$f" 2>/dev/null | grep -v -E 'cloud.google|nodesource' \
      | while read -r line; do
          echo "$line"
          if [ "$src" = src ]; then echo "deb-src${line#deb}"; fi
        done >> "$dir/sources.list" || true
  done
  if ! ls "$dir"/sources.list.d/*.sources >/dev/null 2>&1 && [ ! -s "$dir/sources.list" ]; then
    log "no Debian apt sources found on this machine; using deb.debian.org bookworm"
    echo 'deb http://deb.debian.org/debian bookworm main' > "$dir/sources.list"
    if [ "$src" = src ]; then echo 'deb-src http://deb.debian.org/debian bookworm main' >> "$dir/sources.list"; fi
  fi
  _apt_opts "$dir"
  if [ ! -f "$dir/.updated" ] || [ -n "$(find "$dir/.updated" -mmin +1440)" ]; then
    timeout 600 apt-get "${APT[@]}" -q update > "$dir/update.log" 2>&1 \
      || { tail -20 "$dir/update.log" >&2; die "apt-get update failed (private config in $dir)"; }
    touch "$dir/.updated"
  fi
}

apt_fetch() {
  local dir=$1 p
  shift
  mkdir -p "$dir"
  for p in "$@"; do
    if ! ls "$dir/${p}"_*.deb >/dev/null 2>&1; then
      log "   apt-get download $p"
      (cd "$dir" && timeout 600 apt-get "${APT[@]}" -q download "$p") > "$dir/download-$p.log" 2>&1 || true
      ls "$dir/${p}"_*.deb >/dev/null 2>&1 || { tail -10 "$dir/download-$p.log" >&2; die "download of $p failed"; }
    fi
  done
}

deb_unpack() {
  local dir=$1 dest=$2 p debs
  shift 2
  mkdir -p "$dest"
  for p in "$@"; do
    debs=("$dir/${p}"_*.deb)
    [ -f "${debs[0]}" ] || die "no $p archive in $dir"
    dpkg -x "${debs[0]}" "$dest"
  done
}
