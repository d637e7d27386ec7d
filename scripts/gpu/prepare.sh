#!/usr/bin/env bash
# Everything a GPU lease carries, made here before asking for the machine (all git-ignored):
#   bash scripts/gpu/prepare.sh [PAIR]        (from the project root; PAIR: default)
# ../shared/gpu/pack.sh's .gpu (llama.cpp's trimmed source, the build scripts) and the pair's
# model files, cut again so that each device call carries as much as its 64 MiB allows beside
# the working tree as it is now: .gpu with the first piece (.gpu/p00), then .gpu01, .gpu02, ...
# (pack.sh's fixed 62 MiB pieces leave 2 MiB for the tree, which the tree nearly fills). Also
# .hostbase, the package before the lean host path, for checks.sh's section 1b. Prints the
# calls to make, in order. Run it again after any commit that grows the tree.
set -euo pipefail
PAIR=${1:-default}
LIMIT=$((64 * 1024 * 1024)); SLACK=$((2 * 1024 * 1024)); HOSTBASE=60fb22c
[ -f ../shared/gpu/pack.sh ] || { echo "prepare.sh: no ../shared/gpu/pack.sh beside the project" >&2; exit 1; }
bash ../shared/gpu/pack.sh "$PAIR" > /dev/null

size() { xargs -0 -r stat -c %s | awk '{s += $1} END {print s + 0}'; }
tree=$(( $(git ls-files -z | size) + $(git ls-files -z --others --exclude-standard | size) ))
gpu=$(find .gpu -type f -print0 | size)
piece=$(( (LIMIT - tree - SLACK) / 4096 * 4096 ))
first=$(( (LIMIT - tree - gpu - SLACK) / 4096 * 4096 ))
[ "$first" -gt 0 ] || { echo "prepare.sh: the tree ($tree bytes) and .gpu ($gpu) leave no room" >&2; exit 1; }

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat .gpu[0-9][0-9]/p > "$tmp/all"; rm -rf .gpu[0-9][0-9]
total=$(stat -c %s "$tmp/all")
head -c "$first" "$tmp/all" > .gpu/p00
tail -c +$((first + 1)) "$tmp/all" | split -b "$piece" -d -a 2 --numeric-suffixes=1 - "$tmp/piece."
n=0
for p in "$tmp"/piece.*; do
  n=$((n + 1)); d=$(printf '.gpu%02d' "$n"); mkdir -p "$d"; mv "$p" "$d/p"
done
sent=$(printf '%s\0' .gpu/p00 .gpu[0-9][0-9]/p | size)
[ "$sent" -eq "$total" ] || { echo "prepare.sh: pieces hold $sent of $total bytes" >&2; exit 1; }

grep -qx '/.hostbase/' .git/info/exclude || echo '/.hostbase/' >> .git/info/exclude
rm -rf .hostbase && mkdir .hostbase && git archive "$HOSTBASE" edgespec | tar -x -C .hostbase

last=$(printf '%02d' "$n")
cat <<STEPS
Ready for a lease: $total bytes of models in .gpu/p00 ($first) and .gpu01-.gpu$last ($piece each),
beside a tree of $tree bytes (+ .gpu's $gpu on the first call): each call under 64 MiB.
Check the device tool's status first, then make the calls back to back (a machine is given back
~30 s after a call returns, and all on it is lost):
  1. carry [".gpu"]:      mkdir -p /tmp/w/parts && mv .gpu/p00 /tmp/w/parts/00 && bash .gpu/build.sh start
  2. carry [".gpuNN"]:    mv .gpuNN/p /tmp/w/parts/NN      for NN = 01 .. $last, in one batch of calls
  3. carry [".hostbase"], timeout_s 600:  bash scripts/gpu/checks.sh S
     S: status's budget_left_s less ~60 s, at most 585 (the script skips sections whose cap no
     longer fits, most valuable first). Results: \$OUT/log.txt and r.tgz (unpack to /tmp/r).
STEPS
