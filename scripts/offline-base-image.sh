#!/usr/bin/env bash
# The inputs of an image build that needs no container registry and no package index:
#
#   1. a Debian bookworm base image: debootstrap (minbase, plus python3, python3-venv,
#      ca-certificates) into a temp folder, then `docker import` (about 45 s here);
#   2. a wheelhouse: every wheel compose/Dockerfile installs (torch CPU, LMCache 0.5.6 and its
#      runtime needs, kvchaos's dependencies), fetched with this machine's pip configuration
#      (find-links, local indexes) into $KVCHAOS_WHEELHOUSE, default compose/wheelhouse
#      (git-ignored; about 20-40 s, 340 MB).
#
# Each step is skipped when already done (--force redoes both; --wheelhouse-only skips the
# image, and needs neither root nor debootstrap: for hosts that can pull a base image;
# --base-only skips the wheelhouse: enough for tests/compose).
#
#   scripts/offline-base-image.sh [--force] [--wheelhouse-only | --base-only] [IMAGE]
#                                                    IMAGE defaults to kvchaos/base:bookworm
#
# The Debian mirror is the one this machine's apt uses (read from /etc/apt/sources.list*), or
# $DEBIAN_MIRROR when set. Use the image with
#   docker build --network host --build-arg BASE_IMAGE=kvchaos/base:bookworm -f compose/Dockerfile ...
# Exit codes: 0 image present, 3 missing tool / not root / no mirror found.
set -euo pipefail
force=0
wheelhouse_only=0
base_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) force=1; shift ;;
    --wheelhouse-only) wheelhouse_only=1; shift ;;
    --base-only) base_only=1; shift ;;
    -*) echo "offline-base-image: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
IMAGE=${1:-${KVCHAOS_BASE_IMAGE:-kvchaos/base:bookworm}}
WHEELHOUSE=${KVCHAOS_WHEELHOUSE:-compose/wheelhouse}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
SUITE=${DEBIAN_SUITE:-bookworm}
INCLUDE=python3,python3-venv,ca-certificates

say() { echo "offline-base-image: $*"; }
die() { echo "offline-base-image: $*" >&2; exit 3; }

if [ $wheelhouse_only -eq 0 ]; then
  command -v docker >/dev/null 2>&1 || die "no docker CLI; run scripts/docker-setup.sh"
  command -v debootstrap >/dev/null 2>&1 || die "no debootstrap; run scripts/docker-setup.sh"
  [ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
fi

# --- 2. wheelhouse (first: it needs no root and no docker) ----------------------------------
# Resolved for this interpreter; pip evaluates environment markers for the running Python only
# (--python-version does not change them), so wheels that only an older 3.11 needs are named
# here: Debian bookworm's Python is 3.11.2 and redis wants async-timeout below 3.11.3.
OLDER_PYTHON_WHEELS=("async-timeout>=4.0.3")
make_wheelhouse() {
  local stamp="$WHEELHOUSE/.kvchaos-stamp" want reqs start=$SECONDS
  want=$(cat pyproject.toml constraints/reference.txt requirements/lmcache-runtime.txt | sha1sum | cut -c1-12)
  if [ $force -eq 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "wheelhouse $WHEELHOUSE is up to date; skipped"
    return
  fi
  mkdir -p "$WHEELHOUSE"
  reqs=$(mktemp /tmp/kvchaos-wheelhouse-reqs.XXXXXX)
  "$PYTHON" - >"$reqs" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    doc = tomllib.load(f)
project = doc["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["reference"]
                + doc["build-system"]["requires"]))
PY
  local dl=("$PYTHON" -m pip download -q --disable-pip-version-check -d "$WHEELHOUSE"
            -c constraints/reference.txt)
  say "downloading wheels into $WHEELHOUSE"
  "${dl[@]}" -r "$reqs" -r requirements/lmcache-runtime.txt \
    2> >(grep -v "is neither a file nor a directory" >&2)
  "${dl[@]}" "${OLDER_PYTHON_WHEELS[@]}" 2> >(grep -v "is neither a file nor a directory" >&2)
  "$PYTHON" -m pip download -q --disable-pip-version-check -d "$WHEELHOUSE" --no-deps \
    -c constraints/reference.txt lmcache==0.5.6 2> >(grep -v "is neither a file nor a directory" >&2)
  rm -f "$reqs"
  echo "$want" >"$stamp"
  say "wheelhouse ready in $((SECONDS - start))s ($(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1))"
}
[ $base_only -eq 1 ] || make_wheelhouse
[ $wheelhouse_only -eq 0 ] || exit 0

# --- 1. base image -----------------------------------------------------------------------------
if [ $force -eq 0 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "$IMAGE exists; skipped (--force rebuilds)"
  exit 0
fi

# The first Debian archive (not -security, not a third-party repo) that apt is configured with.
find_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i, $(i+1); break } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822 stanzas: print "URI SUITE" for each stanza.
    awk 'BEGIN { RS = ""; FS = "\n" }
         { uri = ""; suites = "";
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^URIs:/)   { sub(/^URIs:[ \t]*/, "", $i); split($i, u, " "); uri = u[1] }
             if ($i ~ /^Suites:/) { sub(/^Suites:[ \t]*/, "", $i); suites = $i } }
           n = split(suites, s, " "); for (j = 1; j <= n; j++) if (uri != "") print uri, s[j] }' "$f"
  done
}
MIRROR=${DEBIAN_MIRROR:-$(find_mirror | awk -v suite="$SUITE" '$2 == suite && $1 ~ /\/debian\/?$/ { print $1; exit }')}
[ -n "$MIRROR" ] || die "no Debian '$SUITE' archive in /etc/apt/sources.list*; set DEBIAN_MIRROR"

start=$SECONDS
root=$(mktemp -d /tmp/kvchaos-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
say "debootstrap $SUITE (minbase + $INCLUDE) from the configured Debian mirror"
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$root" "$MIRROR" \
  >"$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; die "debootstrap failed"; }
rm -f "$root.log"
# Smaller image: no package cache, no apt lists (a Dockerfile runs apt-get update anyway).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log
say "docker import as $IMAGE"
tar -C "$root" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  --message "kvchaos offline base: debootstrap $SUITE minbase + $INCLUDE" \
  - "$IMAGE" >/dev/null
say "$IMAGE built in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
