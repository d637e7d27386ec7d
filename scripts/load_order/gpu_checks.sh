#!/bin/bash
# (issue 11) The CUDA build segfaulted loading a model when NumPy was imported before llama_cpp;
# on the CPU build nothing differs (tests/test_real_tiny.py guards the structure). Run this on the GPU.
# GPU-side checks for the numpy-before-llama_cpp load crash. usage:
#   PY=/path/to/python MODEL=/path/model.gguf bash gpu_checks.sh [OUTDIR]
# Needs: this directory (segv_bt.c, order_matrix.py, diff_bindings.py). gdb optional.
set -u
PY=${PY:-python3}; M=${MODEL:?set MODEL=/path/to/model.gguf}; OUT=${1:-${OUT:-/tmp/gpu_checks}}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
LOAD="llama_cpp.Llama('$M', n_gpu_layers=-1, n_ctx=256, verbose=True)"
echo "## 0 environment"; { $PY -c "import sys,numpy,llama_cpp;print(sys.version);print('numpy',numpy.__version__,numpy.__file__);print('llama_cpp',llama_cpp.__version__)"; ldd --version | head -1; nvidia-smi -L; } 2>&1 | tee "$OUT/env.txt"
L=$($PY -c "import importlib.util,os;print(os.path.join(importlib.util.find_spec('llama_cpp').submodule_search_locations[0],'lib'))")
ls -li "$L" > "$OUT/libdir.txt"; for f in "$L"/*.so.0 "$L"/libllama.so; do echo "== $f"; readelf -d "$f" | grep -E 'NEEDED|RPATH|RUNPATH|FLAGS'; done > "$OUT/readelf_llama.txt"
readelf -d "$(readlink -f "$(command -v $PY)")" | grep -E 'RPATH|RUNPATH|NEEDED' > "$OUT/readelf_python.txt"
echo "## 1 which runtime libs does each order map (H-A: first loader picks the libstdc++/libgcc_s/libgomp instance)"
for o in "numpy, llama_cpp" "llama_cpp, numpy"; do
  echo "== import $o"; $PY -c "import $o
seen={}
for l in open('/proc/self/maps'):
    p=l.split()[-1]
    if '.so' in p: seen.setdefault(p,l.split()[4])
for p,i in sorted(seen.items()): print(i,p)"
done > "$OUT/maps_both_orders.txt" 2>&1
grep -E "libstdc|libgcc_s|libgomp|libcudart|libcublas|libcuda\.|ggml|llama" "$OUT/maps_both_orders.txt"
awk '/^== /{o++} !/^== /{print o, $2}' "$OUT/maps_both_orders.txt" | sort -k2 | awk '{c[$2]=c[$2] $1} END{for(k in c) if (c[k]!="12") print "ONLY-IN-ORDER-" c[k], k}' | grep -E "libstdc|libgcc|libgomp|libcu|ggml|llama|libm\.|libz"   # same path in both orders expected
awk '!/^== /{n=$2; sub(/.*\//,"",n); print n}' "$OUT/maps_both_orders.txt" | sort | uniq -c | awk '$1>2'   # a basename mapped from 2 paths = duplicate copy
echo "## 2 native backtrace of the crash"
if command -v gdb >/dev/null; then
  gdb -q -batch -ex "set pagination off" -ex "handle SIGSEGV stop" -ex run -ex "bt 40" -ex "info registers rip rsp" -ex 'x/8i $pc-16' -ex "info sharedlibrary" \
      --args $PY -X faulthandler -c "import numpy, llama_cpp; $LOAD" > "$OUT/gdb_numpy_first.txt" 2>&1
  grep -A45 "received signal" "$OUT/gdb_numpy_first.txt" | head -60
else
  cc -O1 -g -fPIC -shared "$HERE/segv_bt.c" -o "$OUT/segv_bt.so" -ldl
  LD_PRELOAD="$OUT/segv_bt.so" $PY -X faulthandler -c "import numpy, llama_cpp; $LOAD" > "$OUT/segvbt_numpy_first.txt" 2>&1
  grep -A40 "segv_bt:" "$OUT/segvbt_numpy_first.txt"   # resolve: addr2line -Cfe LIB 0xOFFSET  (or gdb -batch -ex 'info symbol 0xOFFSET' LIB)
fi
echo "## 3 LD_DEBUG bindings, both orders, diff"
rm -f "$OUT"/ld_numpy_first.* "$OUT"/ld_llama_first.*
for o in numpy_first llama_first; do
  if [ $o = numpy_first ]; then imp="import numpy, llama_cpp"; else imp="import llama_cpp, numpy"; fi
  LD_DEBUG=bindings,libs LD_DEBUG_OUTPUT="$OUT/ld_$o" $PY -c "$imp; $LOAD" > "$OUT/run_$o.txt" 2>&1; echo "$o rc=$?"
done
BOTH_ONLY=0 python3 "$HERE/diff_bindings.py" "$(ls "$OUT"/ld_numpy_first.* | head -1)" "$(ls "$OUT"/ld_llama_first.* | head -1)" "libllama|libggml|libstdc\+\+|libgomp|libgcc_s|libcudart|libcublas|libcuda\." > "$OUT/bindings_diff.txt"
grep -v "^   " "$OUT/bindings_diff.txt" | head -60
grep -hE "binding file .*(libllama|libggml|libstdc\+\+|libgomp|libcu).* to .*(numpy|_multiarray|openblas|gfortran|quadmath)" "$OUT"/ld_numpy_first.* | sed 's/^ *[0-9]*://' | sort | uniq -c | head -40
echo "## 4 experiment matrix (rc=-11 is SIGSEGV)"
REPEAT=${REPEAT:-2} OUTDIR="$OUT/matrix" $PY "$HERE/order_matrix.py" "$M" | tee "$OUT/matrix.txt"
echo "## 5 heap checker (H-C)"
MD=$(ls /lib/x86_64-linux-gnu/libc_malloc_debug.so.0 /usr/lib64/libc_malloc_debug.so.0 2>/dev/null | head -1)
[ -n "$MD" ] && LD_PRELOAD=$MD GLIBC_TUNABLES=glibc.malloc.check=3 $PY -c "import llama_cpp, numpy; $LOAD" > "$OUT/malloccheck_llama_first.txt" 2>&1; echo "malloc.check llama_first rc=$?"
