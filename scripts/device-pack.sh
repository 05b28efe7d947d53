#!/usr/bin/env bash
# Packs a build's test and benchmark binaries for a machine that has none of the Debian packages
# (the lent GPU machine of docs/development.md, "On a lent GPU machine"): stripped copies of the
# binaries named, plus every shared library they load from outside glibc / libstdc++, into one
# tar.xz. There: `tar xJf PACK && export LD_LIBRARY_PATH=$PWD/lib`, then run build-*/... as here.
#
#   scripts/device-pack.sh BUILD_DIR OUT.tar.xz BINARY...   (binaries relative to BUILD_DIR)
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 BUILD_DIR OUT.tar.xz BINARY..." >&2
  exit 2
fi
build=$1
out=$2
shift 2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
name=$(basename "$build")
mkdir -p "$stage/lib"
for bin in "$@"; do
  src="$build/$bin"
  [ -x "$src" ] || { echo "device-pack: $src is not an executable" >&2; exit 1; }
  mkdir -p "$stage/$name/$(dirname "$bin")"
  strip -o "$stage/$name/$bin" "$src"
  # Libraries outside the C / C++ runtime, which the other machine has in newer versions.
  ldd "$src" | awk '$3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
    while read -r lib; do cp -Lu "$lib" "$stage/lib/"; done
done
tar -C "$stage" -cJf "$out" "$name" lib
echo "device-pack: $out ($(du -h "$out" | cut -f1)): $# binaries, $(ls "$stage/lib" | wc -l) libraries"
