"""Load llama.cpp's shared library before NumPy's: the CUDA load crash (issue 11).

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
