#!/usr/bin/env bash
# Set up edgespec from nothing: .venv, llama-cpp-python built for batch-consistent logits, the
# package with its test dependencies. Idempotent and quick when already done.
#
# llama-cpp-python is compiled from source with llamafile's sgemm and Intel AMX turned off (each
# runs for 2+ tokens only, so a batch's logits would differ from a single token's; see README
# "Exactness")
# and with llama.cpp's RPC backend on (`edgespec worker`, `--rpc`; see README "Across machines").
# The wheel is cached outside the repository, keyed by version and CMake flags, because pip's own
# wheel cache ignores CMAKE_ARGS. GPU users add their flags, e.g.
#   EDGESPEC_CMAKE_ARGS="-DGGML_CUDA=on" make setup
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_VERSION=0.3.36
CMAKE_FLAGS="-DGGML_LLAMAFILE=OFF -DGGML_RPC=ON ${EDGESPEC_CMAKE_ARGS:-}"
CACHE=${EDGESPEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec}
# llama.cpp builds for the CPU it is built on (GGML_NATIVE): a wheel built where AVX-512 is
# would die of an illegal instruction on a CPU without it (a cache or home directory shared
# between machines, a VM moved to another host), so the CPU's vector extensions are in the key.
CPU_SIMD=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -E '^(avx|fma|f16c|amx|sse|ssse|bmi|asimd|sve|i8mm|dotprod)' | sort | tr '\n' ' ' || true)
# Intel AMX off: ggml-cpu multiplies one row with AVX512-VNNI and 2+ rows with AMX tiles, so a
# batch's logits would differ from a single token's (as with llamafile's sgemm); and on this
# project's VMs (Firecracker, CPUs that report AMX) the tile instructions die of SIGILL/SIGSEGV
# once other threads exist (NumPy's OpenBLAS pool). GCC and Clang let -mno-amx-* win over the
# -march=native that GGML_NATIVE adds, wherever it comes on the command line.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$(uname -m)" != x86_64 ] || ! echo 'int main(void){return 0;}' | ${CC:-cc} -x c $NO_AMX -fsyntax-only - 2>/dev/null; then
  NO_AMX=""
fi
TAG=$(printf '%s|%s|%s|%s|%s|%s' "$LLAMA_VERSION" "$CMAKE_FLAGS" "$(uname -m)" "$($PYTHON -c 'import sys; print(sys.version_info[:2])')" "$CPU_SIMD" "$NO_AMX" | sha256sum | cut -c1-12)
WHEELS="$CACHE/wheels/llama-cpp-python-$LLAMA_VERSION-$TAG"

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi

if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "==> building llama-cpp-python $LLAMA_VERSION ($CMAKE_FLAGS): once, ~6 minutes on 2 cores"
  start=$(date +%s)
  rm -rf "$WHEELS.partial" && mkdir -p "$WHEELS.partial"
  CFLAGS="${CFLAGS:-} $NO_AMX" CXXFLAGS="${CXXFLAGS:-} $NO_AMX" \
  CMAKE_ARGS="$CMAKE_FLAGS" .venv/bin/python -m pip wheel -q --no-deps --no-cache-dir \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS.partial"
  mv "$WHEELS.partial" "$WHEELS"  # only a finished build ever has the final name
  echo "==> built in $(( $(date +%s) - start ))s: $WHEELS"
fi

if [ "$(cat .venv/.llama-build 2>/dev/null)" != "$TAG" ]; then
  echo "==> installing llama-cpp-python build $TAG"
  .venv/bin/python -m pip install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
  echo "$TAG" > .venv/.llama-build
fi

# tmux drives `edgespec chat` in a real terminal in the tests.
if ! command -v tmux >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing tmux (Debian package)"
    apt-get update -qq && apt-get install -y -qq tmux >/dev/null
  else
    echo "warning: tmux not found; the terminal test of \`edgespec chat\` will fail (install tmux)" >&2
  fi
fi

echo "==> installing edgespec"
.venv/bin/python -m pip install -q -e ".[test]"
