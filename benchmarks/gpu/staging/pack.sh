#!/usr/bin/env bash
# Repacks what the GPU machine lacks (the folder ../shared/gpu/fetch_wheels.sh made: wheel parts
# p1.. and FlashAttention-3 parts f1..) into fewer bytes to carry: every wheel unpacked into one
# site-packages tree with FA3 in place, one tar, xz -9, split into parts of PART_SIZE.
#   usage: bash benchmarks/gpu/staging/pack.sh SRC DEST [PART_SIZE]   (DEST ignored by git;
#   PART_SIZE as split -b takes it, given as the third argument or in the environment, default 40M;
#   recut.sh cuts packed parts to another size in seconds)
# Why: a device call carries at most 64 MiB (the tracked tree, 25 MiB and growing with the
# checked-in results, included: 40M parts stopped fitting beside 24 MiB of it) and each call
# of ~60 MiB took 80-100 s of device time, so the bytes carried are most of the staging cost.
# The wheels (zip-deflate, 138 MB) shrink to ~85 MB as one xz stream; FA3 (xz -2, 188 MB) to ~165.
# The machine then unpacks the tree instead of running pip (benchmarks/gpu/staging/stage.sh).
set -euo pipefail
src=${1:?usage: pack.sh SRC DEST [PART_SIZE]}
dest=${2:?usage: pack.sh SRC DEST [PART_SIZE]}
part_size=${3:-${PART_SIZE:-40M}}  # a part and the tracked tree (~9 MiB) fit one call's 64 MiB
here=$(cd "$(dirname "$0")" && pwd)
ls "$src"/p[0-9]/part* >/dev/null 2>&1 || { echo "pack: no wheel parts in $src/p*/ (run ../shared/gpu/fetch_wheels.sh $src first)"; exit 1; }
ls "$src"/f[0-9]/fa* >/dev/null 2>&1 || { echo "pack: no FA3 parts in $src/f*/ (run ../shared/gpu/fetch_wheels.sh $src first)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" "$work/site"
cat "$src"/p[0-9]/part* | tar -xf - -C "$work/wheels"
for whl in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$whl" "$work/site"
done
# What pip would do with a wheel's .data folder: purelib/platlib go to site-packages; scripts,
# headers and data files are not needed to import or serve.
for data in "$work"/site/*.data; do
  [ -d "$data" ] || continue
  for lib in purelib platlib; do
    [ -d "$data/$lib" ] && cp -a "$data/$lib/." "$work/site/"
  done
  rm -rf "$data"
done
# A static library used only to build against xgrammar, never loaded at run time (62 MB).
rm -f "$work"/site/xgrammar/lib/libxgrammar.a
[ -d "$work/site/sgl_kernel" ] || { echo "pack: no sgl_kernel in the wheels"; exit 1; }
cat "$src"/f[0-9]/fa* | xz -d > "$work/site/sgl_kernel/flash_ops.abi3.so"
echo "pack: tree $(du -sm "$work/site" | cut -f1) MB; compressing (xz -9, a few minutes)"
tar -cf - -C "$work/site" . | xz -9 -T2 -c > "$work/site.tar.xz"
rm -rf "$dest"/s[0-9]*
mkdir -p "$dest"
(cd "$work" && split -b "$part_size" -d -a 2 site.tar.xz part)
i=1
for p in "$work"/part*; do
  mkdir -p "$dest/s$i" && mv "$p" "$dest/s$i/site.tar.xz.$(printf %02d "$i")"
  i=$((i + 1))
done
cp "$here/stage.sh" "$dest/stage.sh"
total=$(du -cb "$dest"/s*/site.tar.xz.* | tail -1 | cut -f1)
echo "pack: $((total / 1048576)) MiB ($total bytes) in $((i - 1)) parts under $dest (s1..s$((i - 1))): one device call per part"
