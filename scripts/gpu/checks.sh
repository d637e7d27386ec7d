#!/usr/bin/env bash
# The GPU checks of issues 11 and 12 as one run on a lent machine (the device tool), after
# ../shared/gpu/build.sh has built llama.cpp with CUDA and the model pieces are in /tmp/w/parts.
#   bash scripts/gpu/checks.sh [SECONDS]      (from the project root; SECONDS: time allowed, default 540)
# Sections run in order of value and are skipped when their cap no longer fits the time left, so
# a short lease still returns the most important figures. Everything goes to /tmp/r; $OUT gets
# log.txt (as it runs) and r.tgz (after each section), within the tool's 8-file limit. A command
# past its cap gets SIGINT first, so bench and verify still write what they measured.
set -u
BUDGET=${1:-540}; END=$((SECONDS + BUDGET))
OUT=${OUT:-/tmp/out}; R=/tmp/r; mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
W=${FIXED_WIDTH:-8}
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
ES="python3 -m edgespec"
ANCH=""; [ -x "$B/llama-bench" ] && ANCH="--llama-cpp-bin $B"
GPU="--target $T --draft $D --ngl -1 --draft-ngl -1"

section "1 loading on CUDA (issue 11 item 1): edgespec's own import order, and NumPy first"
run 60 complete $ES complete "def fibonacci(n):" $GPU -n 48 --raw --stats
run 60 numpy_first_engine python3 -c "
import numpy, edgespec, edgespec._native as n
from edgespec.runtime.engine import Engine
print('preload:', edgespec.PRELOAD)
e = Engine.load('$T', '$D', n_gpu_layers=-1, draft_n_gpu_layers=-1)
print('LOADED numpy-first engine')"
run 40 numpy_first_stock python3 -c "
import numpy, llama_cpp
m = llama_cpp.Llama('$D', n_gpu_layers=-1, n_ctx=256, verbose=False); print('LOADED stock numpy-first')"

section "2 batch consistency (issue 12): logit differences by width, and the fixed-width remedy"
TAIL=60 run 90 batch_consistency python3 scripts/batch_consistency.py "$T" --ngl -1 --widths 2,4,8,16,32

section "3 verify greedy: batch-dependent, then fixed width $W (issue 12)"
TAIL=40 run 120 verify_greedy_batchdep $ES verify $GPU --temperature 0
TAIL=40 run 150 verify_greedy_fixed$W $ES verify $GPU --temperature 0 --fixed-width "$W"

section "4 bench, greedy: every drafter, the references, llama.cpp's anchors (issue 11)"
TAIL=70 run 240 bench_greedy $ES bench $GPU -r 2 $ANCH --json "$R/bench_greedy.json" --plot "$R/bench_greedy.png"

section "5 why NumPy-first crashes: native backtrace and the order matrix (issue 11 item 1)"
L=/tmp/w/site/llama_cpp/lib
if fits 60; then
  cc -O1 -g -fPIC -shared scripts/load_order/segv_bt.c -o /tmp/segv_bt.so -ldl && \
  LD_PRELOAD=/tmp/segv_bt.so timeout 40 python3 -X faulthandler -c "import numpy, llama_cpp
llama_cpp.Llama('$D', n_gpu_layers=-1, n_ctx=256, verbose=True)" > "$R/segv_bt.txt" 2>&1; echo "segv_bt rc=$?"
  grep -A40 "segv_bt:" "$R/segv_bt.txt" | head -45
  grep -A40 "segv_bt:" "$R/segv_bt.txt" | grep -oE "/[^ ]*(libllama|libggml[a-z-]*)\.so[.0-9]*\+0x[0-9a-f]+" | head -20 | \
    while IFS=+ read -r lib off; do echo "$lib+$off: $(addr2line -Cfpe "$lib" "$off" 2>/dev/null | head -2 | tr '\n' ' ')"; done
  python3 -c "import numpy, llama_cpp
seen = {}
for l in open('/proc/self/maps'):
    p = l.split()[-1]
    if '.so' in p: seen.setdefault(p, 1)
print('\n'.join(sorted(seen)))" > "$R/maps_numpy_first.txt" 2>&1
  grep -E "libstdc|libgcc_s|libgomp|openblas|gfortran|quadmath|libcu|ggml|llama" "$R/maps_numpy_first.txt"
  pack
fi
N_GPU_LAYERS=-1 REPEAT=1 OUTDIR=$R/matrix TAIL=20 run 90 order_matrix python3 scripts/load_order/order_matrix.py "$D" \
  llama_first numpy_first numpy_first_vocab_only numpy_first_ngl0 stdcxx_global_then_numpy gomp_global_then_numpy \
  only_quadmath only_gfortran only_openblas only_mau_ctypes

section "6 bench at fixed width $W (then 16, after 7): none, auto, hybrid (issue 12's cost)"
TAIL=40 run 120 bench_fixed$W $ES bench $GPU -r 2 --fixed-width "$W" --drafters none,auto,hybrid --json "$R/bench_fixed$W.json" --plot "$R/bench_fixed$W.png"
section "7 sampled drafts: the device window against whole rows (issue 10 on a GPU)"
if [ "$SELF" = 0 ]; then
  TAIL=30 run 100 bench_t08_window $ES bench $GPU -r 1 --temperature 0.8 --seed 1 --drafters none,model,hybrid,auto --json "$R/bench_t08_window.json" --plot "$R/w.png"
  TAIL=30 run 100 bench_t08_whole $ES bench $GPU -r 1 --temperature 0.8 --seed 1 --drafters none,model,hybrid,auto --draft-window 0 --json "$R/bench_t08_whole.json" --plot "$R/wh.png"
fi

TAIL=40 run 120 bench_fixed16 $ES bench $GPU -r 2 --fixed-width 16 --drafters none,auto,hybrid --json "$R/bench_fixed16.json" --plot "$R/bench_fixed16.png"

section "8 auto's cost curve, and verify's sampling audit at fixed width"
TAIL=30 run 90 sweep $ES bench $GPU --sweep --no-runs --json "$R/sweep.json"
TAIL=30 run 150 verify_sampling_fixed$W $ES verify $GPU --no-greedy --samples 200 --fixed-width "$W"
section "done"; pack
