#!/usr/bin/env bash
# Cuts the parts pack.sh made into parts of another size, without rebuilding the site tree
# (seconds instead of pack.sh's minutes): for a tracked tree that grew past what a call carries
# beside one part (64 MiB in all).
#   usage: bash benchmarks/gpu/staging/recut.sh DIR PART_SIZE   (PART_SIZE as split -b takes it)
set -euo pipefail
dir=${1:?usage: recut.sh DIR PART_SIZE}
size=${2:?usage: recut.sh DIR PART_SIZE}
shopt -s nullglob
# The stream's order is the parts' numbered suffix (s10 sorts after s9 there, not after s1).
parts=()
while IFS= read -r p; do parts+=("$p"); done < <(
    for p in "$dir"/s[0-9]*/site.tar.xz.*; do echo "${p##*.} $p"; done | sort -n | cut -d' ' -f2-)
[ "${#parts[@]}" -gt 0 ] || { echo "recut: no parts in $dir/s*/ (run pack.sh first)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "${parts[@]}" > "$work/site.tar.xz"
xz -t "$work/site.tar.xz" || { echo "recut: the parts in $dir do not join into one xz stream"; exit 1; }
(cd "$work" && split -b "$size" -d -a 2 site.tar.xz part)
rm -rf "$dir"/s[0-9]*
i=1
for p in "$work"/part*; do
  mkdir -p "$dir/s$i" && mv "$p" "$dir/s$i/site.tar.xz.$(printf %02d "$i")"
  i=$((i + 1))
done
echo "recut: $(stat -c %s "$work/site.tar.xz") bytes in $((i - 1)) parts of $size under $dir (s1..s$((i - 1)))"
