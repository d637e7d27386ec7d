"""llama.cpp's native libraries, reached without importing llama_cpp (the foundation: every
layer may use it, and it imports nothing from edgespec).

- :func:`preload`: put the C++ runtime in the global scope and load llama.cpp's shared library
  (the CUDA crashes of issue 11);
- :func:`exp_kernel`: ggml's vectorised ``exp`` for the sampler's untruncated rows (issue 10).

The CUDA crashes, as measured on an H200 (CUDA 13.0, NumPy 2.5.2, 2026-11-26): loading a model
segfaulted whenever NumPy was imported before ``llama_cpp``, and ``edgespec bench`` segfaulted at
exit even when it was not. The backtrace of the load crash ends in ``llama_model::print_info``
calling ``std::ostream::_M_insert<long>``, run from the copy of that libstdc++ function inside
``libggml-cuda.so`` (the CUDA build exports ~1,800 ``std::`` symbols of its own and does not
link ``libstdc++.so.6``), on objects built by ``libstdc++.so.6``. NumPy's extension modules load
``libstdc++.so.6`` into their own local scope, which changes which copy a symbol binds to. With
``libstdc++.so.6`` loaded into the global scope before ``libllama`` (``RTLD_GLOBAL``), every
library binds the one C++ runtime: NumPy first loaded 3 of 3 times, and the exit crash was gone
(``bench --sweep``: 2 of 2 crashed without it, 0 of 2 with it). Doing it after ``libllama`` is
loaded does not help, so ``import edgespec`` does it before anything imports ``llama_cpp``,
whenever NumPy came. ``EDGESPEC_NO_PRELOAD=1`` turns this off.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

_handle: ctypes.CDLL | None = None

#: the C++ runtime every llama.cpp library must bind (see the module docstring)
CXX_RUNTIME = "libstdc++.so.6"


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


def switched_on(name: str) -> bool:
    """Whether the environment variable ``name`` is set to 1, true or yes (edgespec's
    switches that turn a native path off)."""
    return os.environ.get(name, "").strip() in {"1", "true", "yes"}


def preload() -> str:
    """Make ``libstdc++.so.6`` global, then load libllama; return how (for diagnostics):
    ``off``, ``absent``, ``loaded``, ``loaded-no-libstdc++`` (no such library here: nothing to
    bind apart), ``already`` (llama_cpp was imported first: too late to help) or ``failed: ...``.
    Never raises: llama_cpp's own import reports a broken library later, with its message."""
    global _handle
    if _handle is not None:
        return "already"
    if switched_on("EDGESPEC_NO_PRELOAD"):
        return "off"
    if not sys.platform.startswith("linux") or "llama_cpp" in sys.modules:
        return "absent" if "llama_cpp" not in sys.modules else "already"
    path = library_path()
    if path is None:
        return "absent"
    try:
        ctypes.CDLL(CXX_RUNTIME, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        how = "loaded"
    except OSError:
        how = "loaded-no-libstdc++"
    try:
        _handle = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as err:
        return f"failed: {err}"
    return how


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
    if switched_on(NO_NATIVE_EXP):
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
