#!/usr/bin/env bash
# Build llama.cpp's own MTP drafter (llama-speculative-simple, which takes --spec-type draft-mtp)
# from the llama.cpp that llama-cpp-python 0.3.36 vendors, outside the repository, then compare
# its greedy drafts with edgespec.runtime.mtp.MtpHead's (scripts/mtp_reference.py).
#
# Not run by CI: the build takes ~9 minutes on one core. Usage:
#   scripts/mtp_reference.sh [mtp_reference.py's options: --model M.gguf (default: the synthetic
#                             qwen35-tiny with an MTP block), --draft-max K, --echo 0.45,1,1 ...]
#   BUILD_ONLY=1 scripts/mtp_reference.sh     (only the build)
# Environment: SDIST (where the sdist is unpacked, default /tmp/sdist), BUILD (the build folder,
# default ~/.cache/edgespec/llama.cpp-build), JOBS (default 1).
set -euo pipefail

VERSION=0.3.36
SDIST=${SDIST:-/tmp/sdist}
BUILD=${BUILD:-$HOME/.cache/edgespec/llama.cpp-build}
JOBS=${JOBS:-1}
TARGET=llama-speculative-simple
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
SRC=$SDIST/llama_cpp_python-$VERSION/vendor/llama.cpp

if [ ! -f "$SRC/CMakeLists.txt" ]; then
    mkdir -p "$SDIST"
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$SDIST"
    tar -xzf "$SDIST/llama_cpp_python-$VERSION.tar.gz" -C "$SDIST"
fi

if [ ! -x "$BUILD/bin/$TARGET" ]; then
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DGGML_LLAMAFILE=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF >/dev/null
    nice -n 10 cmake --build "$BUILD" --target "$TARGET" -j"$JOBS"
fi

if [ "${BUILD_ONLY:-0}" = 1 ]; then
    echo "built $BUILD/bin/$TARGET"
    exit 0
fi
exec "$PY" "$ROOT/scripts/mtp_reference.py" --binary "$BUILD/bin/$TARGET" "$@"
