#!/usr/bin/env bash
# The GPU checks of issues 10-12 as one run on a lent machine (the device tool), after
# ../shared/gpu/build.sh has built llama.cpp with CUDA and the model pieces are in /tmp/w/parts.
#   bash scripts/gpu/checks.sh [SECONDS]      (from the project root; SECONDS: time allowed, default 540)
# Sections run in order of value and are skipped when their cap no longer fits the time left, so
# a short lease still returns the most important figures. Everything goes to /tmp/r; $OUT gets
# log.txt (as it runs) and r.tgz (after each section), within the tool's 8-file limit. A command
# past its cap gets SIGINT first, so bench and verify still write what they measured.
#
# How it went on 2026-11-26 (H200, 15 minutes of device time in all): `bash ../shared/gpu/pack.sh
# default` here, then the first 58.68 MB of the joined model files moved into .gpu/p00 (so .gpu and
# a piece travel together) and the rest re-split into 24 pieces of 65,011,712 bytes; run 1 (carry
# .gpu): `mkdir -p /tmp/w/parts && mv .gpu/p00 /tmp/w/parts/00 && bash .gpu/build.sh start`
# (32 s with the machine's start); runs 2-25 (carry .gpuNN): `mv .gpuNN/p /tmp/w/parts/NN`, about
# 5 s each, back to back; run 26: this script with 585 s (it waits for the build, ~5 min from
# run 1). All pieces were in after 165 s of device time, and this script took 385 s.
set -u
BUDGET=${1:-540}; END=$((SECONDS + BUDGET))
OUT=${OUT:-/tmp/out}; R=/tmp/r; mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
pack() { tar czf "$OUT/r.tgz" -C /tmp r 2>/dev/null; }
fits() { local cap=$1; [ $((END - SECONDS)) -ge "$cap" ]; }
section() { echo; echo "#### $1  (t=${SECONDS}s, $((END - SECONDS))s left)"; }
run() {  # run CAP NAME CMD...: at most CAP seconds; output to $R/NAME.txt; prints rc and the tail
  local cap=$1 name=$2; shift 2
  if ! fits "$cap"; then echo "SKIP $name (needs ${cap}s)"; return 0; fi
  local t0=$SECONDS; timeout -s INT -k 10 "$cap" "$@" > "$R/$name.txt" 2>&1; local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s"; tail -n "${TAIL:-25}" "$R/$name.txt"; pack; return 0
}

section "0 models, build, environment"
cd /tmp/w 2>/dev/null || { echo "no /tmp/w: run ../shared/gpu/build.sh start first"; exit 1; }
if ls parts/* >/dev/null 2>&1; then
  cat parts/* > all.bin; off=0; have=$(stat -c %s all.bin)
  while read -r name size sha; do
    if [ $((off + size)) -le "$have" ]; then
      tail -c +$((off + 1)) all.bin | head -c "$size" > "m/$name"
      echo "$sha  m/$name" | sha256sum -c - || rm -f "m/$name"
    else echo "$name: only $((have - off)) of $size bytes arrived"; fi
    off=$((off + size))
  done < gpu/models.txt
  rm -f all.bin parts/*
fi
for _ in $(seq 1 110); do grep -q BUILD_DONE build.log && break; sleep 3; done
grep -q BUILD_DONE build.log || { echo "build not done:"; tail -20 build.log; cp build.log "$OUT/"; exit 1; }
cd - >/dev/null
export PYTHONPATH="/tmp/w/site:$PWD" PYTHONUNBUFFERED=1 B=/tmp/w/build/bin
T=/tmp/w/m/$(sed -n 1p /tmp/w/gpu/models.txt | cut -d' ' -f1); D=/tmp/w/m/$(sed -n 2p /tmp/w/gpu/models.txt | cut -d' ' -f1)
[ -f "$T" ] || { echo "no target model"; exit 1; }
SELF=0; [ -f "$D" ] || { D=$T; SELF=1; echo "draft missing: self-draft ($T)"; }
export T D
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader
python3 -c "import sys, numpy; print(sys.version.split()[0], 'numpy', numpy.__version__)"
# the sampler's compiled row passes (pip builds them at install; here the source tree is run
# as it is): a few seconds; without Python's headers the sampler uses NumPy's and says so
eval "$(python3 -c "import sysconfig as s; print('PYINC=%s EXT=%s' % (s.get_paths()['include'], s.get_config_var('EXT_SUFFIX')))")"
cc -O3 -Wno-psabi -shared -fPIC -I"$PYINC" edgespec/core/_rows.c -o "edgespec/core/_rows$EXT" 2>&1 | tail -3
python3 -c "from edgespec.core import rowpass; print('sampler:', rowpass.describe())"
ES="python3 -m edgespec"
ANCH=""; [ -x "$B/llama-bench" ] && ANCH="--llama-cpp-bin $B"
GPU="--target $T --draft $D --ngl -1 --draft-ngl -1"

section "1 loading on CUDA: edgespec's import order, and NumPy first (issue 11; fixed 2026-11-26)"
run 60 complete $ES complete "def fibonacci(n):" $GPU -n 48 --raw --stats
run 60 numpy_first_engine python3 -c "
import numpy, edgespec
from edgespec.runtime.engine import Engine
print('preload:', edgespec.PRELOAD)
e = Engine.load('$T', '$D', n_gpu_layers=-1, draft_n_gpu_layers=-1)
print('LOADED numpy-first engine')"

section "2 the cost of changing width: t(k) interleaved against repeated, and auto's calibration"
TAIL=30 run 90 sweep $ES bench $GPU --sweep --no-runs --json "$R/sweep.json"
python3 -c "import json; print('calibration:', json.load(open('$R/sweep.json'))['machine'].get('calibration'))" 2>/dev/null

section "3 bench, greedy: every drafter, the references, llama.cpp's anchors (issue 11)"
TAIL=70 run 240 bench_greedy $ES bench $GPU -r 2 $ANCH --json "$R/bench_greedy.json" --plot "$R/bench_greedy.png"

section "4 the exact mode: verify, and what it costs (issue 12)"
TAIL=20 run 150 verify_greedy_exact $ES verify $GPU --temperature 0 --exact
TAIL=40 run 120 bench_exact $ES bench $GPU -r 2 --exact --drafters none,auto,hybrid --json "$R/bench_exact.json" --plot "$R/bench_exact.png"

section "5 sampled: the device window against whole rows (issue 10 on a GPU)"
# the host work of the GPU path on this machine's CPU (no model: a synthetic one), then the real
TAIL=60 run 60 overhead_device $ES bench --overhead --device-window -r 1 --json "$R/overhead_device.json"
if [ "$SELF" = 0 ]; then
  TAIL=30 run 100 bench_t08_window $ES bench $GPU -r 1 --temperature 0.8 --seed 1 --drafters none,model,hybrid,auto --json "$R/bench_t08_window.json" --plot "$R/w.png"
fi

section "6 batch consistency by width, and a narrower exact width"
TAIL=30 run 90 batch_consistency python3 scripts/batch_consistency.py "$T" --ngl -1 --widths 2,4,8,16,32
TAIL=40 run 120 bench_fixed4 $ES bench $GPU -r 2 --fixed-width 4 --drafters none,auto,hybrid --json "$R/bench_fixed4.json" --plot "$R/bench_fixed4.png"
TAIL=20 run 120 verify_greedy_batchdep $ES verify $GPU --temperature 0
TAIL=30 run 150 verify_sampling_exact $ES verify $GPU --no-greedy --samples 200 --exact

section "done"; pack
