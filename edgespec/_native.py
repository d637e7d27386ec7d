"""llama.cpp's native libraries, reached without importing llama_cpp (the foundation: every
layer may use it, and it imports nothing from edgespec).

- :func:`preload`: load llama.cpp's shared library before NumPy's (the CUDA load crash,
  issue 11);
- :func:`exp_kernel`: ggml's vectorised ``exp`` for the sampler's untruncated rows (issue 10).

On a CUDA build (seen on an H100 with NumPy 2.5.2), loading a model segfaults inside llama.cpp's
tokenizer set-up whenever NumPy's extension modules were loaded before ``libllama``; loaded
after it, everything works. ``import edgespec`` therefore loads llama-cpp-python's own
``lib/libllama.so`` (the very file ``llama_cpp`` loads next, so there is one copy of llama.cpp
and of the ggml it links) without importing any Python module. An application that imported
NumPy before edgespec is not helped (``RTLD_DEEPBIND`` was tried on the H100: it still crashes),
and ``preload`` then says ``loaded-late``. ``EDGESPEC_NO_PRELOAD=1`` turns this off.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

_handle: ctypes.CDLL | None = None


def library_path() -> Path | None:
    """llama-cpp-python's ``libllama.so`` (found without importing llama_cpp), if any."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base) / "lib" / "libllama.so"
        if path.exists():
            return path
    return None


def preload() -> str:
    """Load libllama now; return how (for diagnostics): ``off``, ``absent``, ``loaded``,
    ``loaded-late`` (NumPy was loaded first), ``already`` or ``failed: ...``. Never raises: llama_cpp's own import
    reports a broken library later, with its message."""
    global _handle
    if _handle is not None:
        return "already"
    if os.environ.get("EDGESPEC_NO_PRELOAD", "").strip() in {"1", "true", "yes"}:
        return "off"
    if not sys.platform.startswith("linux") or "llama_cpp" in sys.modules:
        return "absent" if "llama_cpp" not in sys.modules else "already"
    path = library_path()
    if path is None:
        return "absent"
    late = "numpy" in sys.modules
    try:
        _handle = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as err:
        return f"failed: {err}"
    return "loaded-late" if late else "loaded"


#: the function name in ggml's CPU library, and the environment switch that turns it off
_EXP_SYMBOL = "ggml_vec_soft_max_f32"
NO_NATIVE_EXP = "EDGESPEC_NUMPY_EXP"
_exp: Callable[[int, int, int, float], float] | None = None
_exp_looked_up = False


def exp_kernel() -> Callable[[int, int, int, float], float] | None:
    """ggml's vectorised float32 ``exp``, as ``kernel(n, out, x, shift)``: writes
    ``exp(x[i] - shift)`` for the ``n`` float32 values at address ``x`` to address ``out``
    (which may be ``x``) and returns their sum (float64). ``None`` where it cannot be had (no
    llama-cpp-python, a ggml without the symbol, not Linux, or ``EDGESPEC_NUMPY_EXP=1``);
    callers then use NumPy.

    Why: NumPy's float32 ``exp`` costs 1.3-3 ns per value on the 2-core CI machine (its AVX2
    path), 200-450 µs for one 151,936-wide row; ggml's ``ggml_v_expf`` (the kernel of its
    softmax, AVX2/AVX-512/NEON as built) does the row in ~105 µs with the same accuracy
    (within 2e-7 relative of float64; 0 for ``-inf`` and on underflow). It is an internal but
    exported function of ggml's CPU backend, ``ggml_float ggml_vec_soft_max_f32(int n,
    float *y, const float *x, float max)``; it is looked up by name and checked on a known row,
    so a ggml that changed it is not used.

    The library is the ``libggml-cpu.so.0`` next to llama-cpp-python's ``libllama.so``: the
    very file libllama links, so no second copy of ggml is loaded. Looked up once, lazily.
    """
    global _exp, _exp_looked_up
    if _exp_looked_up:
        return _exp
    _exp_looked_up = True
    if os.environ.get(NO_NATIVE_EXP, "").strip() in {"1", "true", "yes"}:
        return None
    path = library_path()
    if not sys.platform.startswith("linux") or path is None:
        return None
    lib_path = path.parent / "libggml-cpu.so.0"
    try:
        fn = getattr(ctypes.CDLL(str(lib_path), mode=os.RTLD_NOW | os.RTLD_LOCAL), _EXP_SYMBOL)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float]
    if not _works(fn):
        return None
    _exp = fn
    return _exp


def _works(kernel: Callable[[int, int, int, float], float]) -> bool:
    """The kernel on a known row of 64 (whole blocks for every SIMD width: the only way it is
    called) gives exp to 1e-6."""
    import math

    values = [1.0 - 0.5 * i for i in range(62)] + [-float("inf"), -200.0]
    buf = (ctypes.c_float * len(values))(*values)
    out = (ctypes.c_float * len(values))()
    total = kernel(len(values), ctypes.addressof(out), ctypes.addressof(buf), 1.0)
    want = [math.exp(v - 1.0) for v in values]
    return (all(abs(a - b) <= 1e-6 * b + 1e-30 for a, b in zip(out, want))
            and abs(total - sum(want)) <= 1e-6 * sum(want))
