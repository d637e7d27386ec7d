# Shared by checks.sh and twins.sh (sourced from the project root on the lent machine): the
# time-boxed runner, and section 0 (the models joined and checked, the CUDA build waited for,
# the environment). Set BUDGET (seconds) before sourcing.
END=$((SECONDS + BUDGET))
OUT=${OUT:-/tmp/out}; R=/tmp/r; mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
pack() { tar czf "$OUT/r.tgz" -C /tmp r 2>/dev/null; }
fits() { local cap=$1; [ $((END - SECONDS)) -ge "$cap" ]; }
section() { echo; echo "#### $1  (t=${SECONDS}s, $((END - SECONDS))s left)"; }
run() {  # run CAP NAME CMD...: at most CAP seconds (SIGINT first, so bench and verify still
         # write what they measured); output to $R/NAME.txt; prints rc and the tail
  local cap=$1 name=$2; shift 2
  if ! fits "$cap"; then echo "SKIP $name (needs ${cap}s)"; return 0; fi
  local t0=$SECONDS; timeout -s INT -k 10 "$cap" "$@" > "$R/$name.txt" 2>&1; local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s"; tail -n "${TAIL:-25}" "$R/$name.txt"; pack; return 0
}

# join the pieces in /tmp/w/parts into the files models.txt lists, each checked by its sha256
join_models() {
  ( cd /tmp/w 2>/dev/null || { echo "no /tmp/w: run ../shared/gpu/build.sh start first"; exit 1; }
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
    fi ) || exit 1
  T=/tmp/w/m/$(sed -n 1p /tmp/w/gpu/models.txt | cut -d' ' -f1)
  D=/tmp/w/m/$(sed -n 2p /tmp/w/gpu/models.txt | cut -d' ' -f1)
  [ -f "$T" ] || { echo "no target model"; exit 1; }
  SELF=0; [ -f "$D" ] || { D=$T; SELF=1; echo "draft missing: self-draft ($T)"; }
  export T D
}

# wait for build.sh's CUDA build, then the environment: PYTHONPATH, the compiled row passes,
# ES (edgespec), GPU (every layer of both models offloaded), B (llama.cpp's tools)
wait_build() {
  for _ in $(seq 1 110); do grep -q BUILD_DONE /tmp/w/build.log && break; sleep 3; done
  grep -q BUILD_DONE /tmp/w/build.log || { echo "build not done:"; tail -20 /tmp/w/build.log; cp /tmp/w/build.log "$OUT/"; exit 1; }
  export PYTHONPATH="/tmp/w/site:$PWD" PYTHONUNBUFFERED=1 B=/tmp/w/build/bin
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
}
