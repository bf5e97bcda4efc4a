#!/bin/sh
# Fetch the onnxruntime C/C++ API headers without installing anything system-wide.
#
# Usage: fetch_ort_headers.sh DEST
#
# The onnxruntime wheels ship no headers. Debian trixie's libonnxruntime-dev (onnxruntime 1.21, MIT) has them.
# This script points a private apt configuration (under DEST/apt) at the Debian mirror the machine's apt already
# uses, with the suite trixie, downloads that one .deb with `apt-get download` and unpacks it with `dpkg -x`.
# The system's apt sources, lists and dpkg state are not modified. On success the last line printed is the
# include directory (DEST/root/usr/include/onnxruntime); on failure the script says why and exits non-zero.
set -eu

DEST=${1:?usage: fetch_ort_headers.sh DEST}
SUITE=trixie
PACKAGE=libonnxruntime-dev
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
INCLUDE="$DEST/root/usr/include/onnxruntime"

fail() { echo "fetch_ort_headers: $*" >&2; exit 1; }

if [ -f "$INCLUDE/onnxruntime_cxx_api.h" ]; then
  echo "$INCLUDE"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || fail "apt-get not found (not a Debian-like system)"
command -v dpkg >/dev/null 2>&1 || fail "dpkg not found"
[ -r "$KEYRING" ] || fail "$KEYRING missing (install the debian-archive-keyring package)"

# The Debian mirror of this machine: the first URI of a deb822 source or of a one-line "deb" entry that serves
# the Debian archive (not the security archive).
MIRROR=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -r "$f" ] || continue
  MIRROR=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
  [ -n "$MIRROR" ] && break
done
if [ -z "$MIRROR" ]; then
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    MIRROR=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { if ($i !~ /security/) print $i; break } }' "$f" | head -n 1)
    [ -n "$MIRROR" ] && break
  done
fi
[ -n "$MIRROR" ] || fail "no Debian mirror found in the machine's apt sources"

APTDIR="$DEST/apt"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$DEST/deb"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" > "$APTDIR/sources.list"
: > "$APTDIR/status"

set -- \
  -o Dir::Etc::SourceList="$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null \
  -o Dir::State::Lists="$APTDIR/lists" -o Dir::Cache="$APTDIR/cache" -o Dir::State::Status="$APTDIR/status" \
  -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)"

echo "fetch_ort_headers: reading the $SUITE index from $MIRROR" >&2
apt-get "$@" -q update >&2 || fail "apt-get update of the $SUITE index failed"
(cd "$DEST/deb" && apt-get "$@" -q download "$PACKAGE" >&2) || fail "apt-get download $PACKAGE failed"
DEB=$(ls "$DEST"/deb/"$PACKAGE"_*.deb 2>/dev/null | head -n 1)
[ -n "$DEB" ] || fail "no $PACKAGE .deb was downloaded"
dpkg -x "$DEB" "$DEST/root" || fail "dpkg -x $DEB failed"
[ -f "$INCLUDE/onnxruntime_cxx_api.h" ] || fail "$DEB has no onnxruntime_cxx_api.h"
echo "$INCLUDE"
