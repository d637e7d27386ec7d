#!/usr/bin/env bash
# The GPU checks of issues 10-12 as one run on a lent machine (the device tool), after
# ../shared/gpu/build.sh has built llama.cpp with CUDA and the model pieces are in /tmp/w/parts.
#   bash scripts/gpu/checks.sh [SECONDS]      (from the project root; SECONDS: time allowed, default 540)
# Sections run in order of value and are skipped when their cap no longer fits the time left, so
# a short lease still returns the most important figures. Everything goes to /tmp/r; $OUT gets
# log.txt (as it runs) and r.tgz (after each section), within the tool's 8-file limit. A command
# past its cap gets SIGINT first, so bench and verify still write what they measured.
#
# Before the lease: `bash scripts/gpu/prepare.sh` makes all that the runs carry (.gpu with the
# first model piece, .gpu01..., .hostbase; pieces cut to fit beside the tree as it is) and prints
# the calls in order.
#
# How it went on 2026-11-27 (H100, 15 minutes of device time in all): `bash ../shared/gpu/pack.sh
# default` here, then the first 58,683,392 bytes of the joined model files moved into .gpu/p00
# (so .gpu and a piece travel together: 65.0 MB with the tree) and the rest re-split into 24
# pieces of 65,011,712 bytes (.gpu01-.gpu24); run 1 (carry .gpu): `mkdir -p /tmp/w/parts &&
# mv .gpu/p00 /tmp/w/parts/00 && bash .gpu/build.sh start` (35 s with the machine's start);
# runs 2-25 (carry .gpuNN): `mv .gpuNN/p /tmp/w/parts/NN`, 4-5 s each, issued back to back in
# one batch of tool calls; run 26: this script with 585 s (timeout_s 600). All pieces were in
# after 164 s of device time (the build at 114 of 350 steps); this script waited 188 s for the
# build and then ran every section in 250 s (438 s in all), which left ~290 s for follow-ups
# on the warm machine (scripts/gpu/auto_variants.py -r 5, a top-p bench: 79 s). The next lease
# (H200, at bc5935e) went the same way: all 25 pieces in after 157 s of device time, the build
# done 181 s into this script, every section in 489 s (651 s of the 900 in all). And on
# 2026-11-28 (H100, d5b80a0): all pieces in after 190 s, the build done 126 s into this
# script, every section but verify --exact (its cap did not fit) in 493 s; --exact and a
# bench --exact -r 1 after it on the warm machine (17 s each): 785 s of the 900.
#
# For section 1b's before/after of the host path (host_floor.py --base): .hostbase, `git archive
# 60fb22c edgespec` (the code before the lean host path; prepare.sh makes it), carried by this
# script's run alone.
# After the lease, on the CPU: `python scripts/gpu/replay.py --tree DIR` (DIR: a checkout of the
# commit the lease ran) replays the same prompts on the virtual H100 (add `--prompt-file
# scripts/gpu/heldout.jsonl` for section 2b's). Set its figures against bench_greedy.txt's
# and bench_heldout.txt's: where they part, the cost model needs the lease's numbers
# (`--sweep /tmp/r/sweep.json --machine /tmp/r/bench_greedy.json`: the lease's own GPU and
# calibration; --capture-ms: 5 fitted the 2026-11-28 lease's lookup runs). The sweep's
# `U ms` and `C ms` columns are what auto's call costs take for a change of width.
# Section 2c's bench_exact.json replays with `--machine /tmp/r/bench_exact.json --fixed-width 8`.
set -u
BUDGET=${1:-540}
source scripts/gpu/lib.sh

section "0 models, build, environment"
join_models
wait_build

section "1 loading on CUDA: edgespec's import order, and NumPy first (issue 11; fixed 2026-11-26)"
run 60 complete $ES complete "def fibonacci(n):" $GPU -n 48 --raw --stats
run 60 numpy_first_engine python3 -c "
import numpy, edgespec
from edgespec.runtime.engine import Engine
print('preload:', edgespec.PRELOAD)
e = Engine.load('$T', '$D', n_gpu_layers=-1, draft_n_gpu_layers=-1)
print('LOADED numpy-first engine')"

section "1a the first call of a width in a process, and the engine's warm-up (first_width.py)"
# the H200 lease of 2026-11-27 pointed at ~45 ms more for each width's first call: measured here
run 40 first_width python3 scripts/gpu/first_width.py "$T" --ngl -1

section "1b host time per token outside llama.cpp: edgespec's none against a bare loop of the same calls"
# with .hostbase/edgespec (an older package: see the header) in the tree, that version too, alternating
HB=""; [ -d .hostbase/edgespec ] && HB="--base .hostbase"
# --in-order: the same engine launching each round after the last is yielded (as before rounds
# were launched ahead): the wall time's excess over the bare loop says what launching ahead saves
run 60 host_floor python3 scripts/host_floor.py --model "$T" --ngl -1 -r 5 --in-order $HB
# auto as a GPU plays it: the draft model loaded (it may pay there, so a plain step rates it)
run 60 host_floor_auto python3 scripts/host_floor.py --model "$T" --draft "$D" --drafter auto --ngl -1 -r 5 --in-order $HB

section "2 bench, greedy: every drafter, the references, llama.cpp's anchors (issue 11)"
# -r 3 (133 s at -r 2 on the H200): at -r 2 the floor, auto >= 0.95x of none, rested on two
# repeats whose llama.cpp time differed by up to 11% for the same calls
TAIL=70 run 240 bench_greedy $ES bench $GPU -r 3 $ANCH --json "$R/bench_greedy.json" --plot "$R/bench_greedy.png"

section "2b the held-out prompts (scripts/gpu/heldout.jsonl): does auto hold on text it was not tuned on?"
TAIL=40 run 150 bench_heldout $ES bench $GPU -r 1 --prompts scripts/gpu/heldout.jsonl --drafters none,lookup,hybrid,auto --json "$R/bench_heldout.json" --plot "$R/bench_heldout.png"

section "2c the exact mode's speed: does auto use the draft model where it pays? (issue 11)"
# (17 s on the H100 of 2026-11-28, run by hand there: auto 1.64x of none, code 1.14x where the
# model drafter ran 1.88x; replay.py --fixed-width 8 on that run's costs says ~1.95x since the
# draft model's price stopped taking in its catch-ups, and ~2.06x since a short catch-up is
# charged only as far as lookup saves it: chat 1.01-1.04x -> 1.14-1.18x, model alone 1.05-1.19x)
TAIL=30 run 45 bench_exact $ES bench $GPU -r 1 --exact --drafters none,lookup,model,auto --json "$R/bench_exact.json"
# answers of prose then code: a model refused in the prose must come back for the code (a
# re-trial rated in step; replayed 1.29x -> 1.46x of none, the model drafter 1.44x)
TAIL=15 run 40 bench_exact_mixed $ES bench $GPU -r 1 --exact --prompts scripts/gpu/mixed.jsonl --drafters none,model,auto --json "$R/bench_exact_mixed.json"

section "3 where auto loses to none: auto against variants of its policy, one engine (issue 11)"
# the variants are PolicyConfig changes (auto_variants.py lists them): auto >= 0.95x of none
# on every prompt, and which of its rules pays?
TAIL=25 run 120 auto_variants python3 scripts/gpu/auto_variants.py "$T" "$D" --ngl -1 -r 3 --json "$R/auto_variants.json"

section "4 sampled, after the hot-loop work (issue 10 on a GPU)"
if [ "$SELF" = 0 ]; then
  TAIL=30 run 100 bench_t08 $ES bench $GPU -r 1 --temperature 0.8 --seed 1 --drafters none,model,hybrid,auto --json "$R/bench_t08.json" --plot "$R/t08.png"
fi

section "5 the cost of changing width: t(k) interleaved against repeated, and auto's calibration"
TAIL=30 run 90 sweep $ES bench $GPU --sweep --no-runs --json "$R/sweep.json"

section "6 exactness: greedy verify in the exact mode and the batch-dependent default (issue 12)"
# (caps: 17 s and 14 s on the H100 of 2026-11-28, where a cap of 150 s skipped the first)
TAIL=20 run 60 verify_greedy_exact $ES verify $GPU --temperature 0 --exact
TAIL=20 run 60 verify_greedy_batchdep $ES verify $GPU --temperature 0

section "7 host work of the loop on this machine's CPU (synthetic model)"
TAIL=60 run 60 overhead_device $ES bench --overhead --device-window -r 1 --json "$R/overhead_device.json"

section "8 sampled rounds sampled on the device: llama.cpp's dist sampler coupled draw for draw on CUDA"
# scripts/device_sampling.py (a probe): are rounds of 2 and of 4 one-hot drafts (one llama_decode
# call each on a GPU) the same tokens as plain device-sampled decoding for the same seed?
run 40 device_sampling_d2 python3 scripts/device_sampling.py --model "$T" --ngl -1 -n 48 --drafts 2
run 40 device_sampling_d4 python3 scripts/device_sampling.py --model "$T" --ngl -1 -n 48 --drafts 4

section "done"; pack
