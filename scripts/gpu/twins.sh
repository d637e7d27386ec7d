#!/usr/bin/env bash
# Issue 49 as one run on a lent GPU: the default target's cost twins (../shared/twin/: the
# target's logits bit for bit at 5x and 15x its matmul weights, about a 7B's and a 24B's cost)
# next to the real 0.5B draft, every layer offloaded; then what issue 11 left on the default pair.
#   bash scripts/gpu/twins.sh [SECONDS]     (from the project root; default 585)
# The calls before it are checks.sh's (prepare.sh prints them): .gpu with the first model piece
# (starts the CUDA build), then .gpu01.. back to back. The twins are made here from the target
# already carried, in the background while the build finishes (nothing more to transfer).
# Sections run in order of value and are skipped when their cap no longer fits; results in
# $OUT/log.txt and $OUT/r.tgz (as checks.sh).
#
# After the lease, on the CPU: the twins' sweeps feed the virtual GPU (scripts/gpu/replay.py
# --sweep /tmp/r/sweep_x5.json); scripts/gpu/README.md records the figures. The 2026-11-28
# H200 ran it in 756 s of the 900 (222 s of transfers, the build done 108 s into this script):
# sections 1-4; `auto` then never drafted with the model on the twins, restated since: the
# next lease checks it against the replay's ~1.75x (x5) and ~2.2x (x15) of none.
set -u
BUDGET=${1:-585}
source scripts/gpu/lib.sh

section "0 models, twins started, build, environment"
join_models
TW=/tmp/w/m; X5=$TW/twin5.gguf; X15=$TW/twin15.gguf
python3 -m pip install -q --no-index --no-deps --target /tmp/w/twinsite /tmp/w/gpu/gguf-*.whl \
  /tmp/w/gpu/[Pp]y[Yy][Aa][Mm][Ll]-*.whl 2>&1 | tail -2
# x5 first (the first sections need it), x15 after it; each file appears under its name only
# once whole
( for s in 5 15; do
    t0=$SECONDS
    PYTHONPATH=/tmp/w/twinsite python3 /tmp/w/gpu/make_twin.py "$T" "$TW/twin$s.part" --scale $s \
      && mv "$TW/twin$s.part" "$TW/twin$s.gguf" && echo "twin x$s made in $((SECONDS - t0))s" \
      || { echo "twin x$s failed"; touch "$TW/twin$s.failed"; }
  done ) > "$R/twins_made.txt" 2>&1 &
wait_build
waitfor() {  # waitfor FILE: until it exists, its making failed, or the budget is nearly gone
  while [ ! -f "$1" ] && [ ! -f "${1%.gguf}.failed" ] && fits 30; do sleep 2; done
  cat "$R/twins_made.txt"; [ -f "$1" ]
}

# llama.cpp's tools for the twins: each run loads the model again (4.6 and 14 GB), so the two anchors
# the targets name (plain decoding and the draft model), not llama-lookup
mkdir -p /tmp/w/anchors2 && ln -sf "$B/llama-bench" "$B/llama-speculative-simple" /tmp/w/anchors2/
ANCH2="--llama-cpp-bin /tmp/w/anchors2"
# the default pair's floor needs only llama-bench; the x15 twin only the draft model's anchor
# (its llama-bench ran at 0.98x of none on the 2026-11-28 H200, and 14 GB loads cost time)
mkdir -p /tmp/w/anchors1 && ln -sf "$B/llama-bench" /tmp/w/anchors1/
mkdir -p /tmp/w/anchors3 && ln -sf "$B/llama-speculative-simple" /tmp/w/anchors3/

section "1 x5 twin (~7B cost), greedy: every drafter, llama-cpp-python plain, llama-bench and llama-speculative-simple"
if waitfor "$X5"; then
  TAIL=60 run 170 bench_x5 $ES bench --target "$X5" --draft "$D" --ngl -1 --draft-ngl -1 -r 1 \
    --drafters none,lookup,model,hybrid,auto,llama-cpp-python-plain $ANCH2 \
    --json "$R/bench_x5.json" --plot "$R/bench_x5.png"
fi

section "2 x15 twin (~24B cost), greedy: the drafters and llama-speculative-simple"
if waitfor "$X15"; then
  TAIL=50 run 200 bench_x15 $ES bench --target "$X15" --draft "$D" --ngl -1 --draft-ngl -1 -r 1 \
    --drafters none,lookup,model,hybrid,auto --llama-cpp-bin /tmp/w/anchors3 \
    --json "$R/bench_x15.json" --plot "$R/bench_x15.png"
fi

section "3 the twins' sweeps: t(k) repeated and interleaved, the draft's cost, the return penalty"
[ -f "$X5" ] && TAIL=40 run 50 sweep_x5 $ES bench --target "$X5" --draft "$D" --ngl -1 --draft-ngl -1 \
  --sweep --no-runs --json "$R/sweep_x5.json"
[ -f "$X15" ] && TAIL=40 run 70 sweep_x15 $ES bench --target "$X15" --draft "$D" --ngl -1 --draft-ngl -1 \
  --sweep --no-runs --json "$R/sweep_x15.json"

section "4 the default pair (issue 11): auto >= 0.95x none on every prompt, none against llama-bench"
TAIL=40 run 75 bench_pair $ES bench $GPU -r 3 --drafters none,auto --llama-cpp-bin /tmp/w/anchors1 \
  --json "$R/bench_pair.json"

section "5 x5 twin in the exact mode (--exact: every call one fixed width)"
[ -f "$X5" ] && TAIL=30 run 70 bench_x5_exact $ES bench --target "$X5" --draft "$D" --ngl -1 --draft-ngl -1 \
  -r 1 --exact --drafters none,lookup,model,auto --json "$R/bench_x5_exact.json"

section "6 x5 twin sampled (temperature 0.8)"
[ -f "$X5" ] && TAIL=30 run 70 bench_x5_t08 $ES bench --target "$X5" --draft "$D" --ngl -1 --draft-ngl -1 \
  -r 1 --temperature 0.8 --seed 1 --drafters none,model,hybrid,auto --json "$R/bench_x5_t08.json"

section "7 x5 twin: greedy verify in the exact mode"
[ -f "$X5" ] && TAIL=20 run 60 verify_x5_exact $ES verify --target "$X5" --draft "$D" --ngl -1 \
  --draft-ngl -1 --temperature 0 --exact

section "done"; pack
