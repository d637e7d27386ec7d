"""Keep freed row-sized buffers in the process, so the host work per token pays no page faults.

glibc's malloc serves an allocation above its mmap threshold (128 KiB at first, raised to the
largest block freed so far) with fresh pages, and hands the top of its heap back to the system
once more than twice that is free. Sampling makes a few temporaries the size of a row of logits
per row (608 KiB for a 152k vocabulary); when two or three of them are freed together they go
back, and the next row faults them in again: ~265 faults for three (~0.9 ms, 3.4 µs a fault on
the development VM), 15-40 faults per token on the overhead bench's top-p and draft-model runs.

:func:`keep_freed_memory` fixes both thresholds (the process then keeps up to
:data:`TRIM_THRESHOLD` of freed heap), once per process, on glibc only. A user's own
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (glibc's tunables by environment) wins:
nothing is changed then.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: glibc's mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: allocations below this come from the heap (glibc's largest allowed value on 64-bit)
MMAP_THRESHOLD = 32 << 20
#: freed heap kept before any is given back
TRIM_THRESHOLD = 256 << 20
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Make glibc keep freed heap for reuse instead of returning it (see the module's doc).

    Returns whether the thresholds are set (False off glibc, or where the environment sets
    them). Safe to call any number of times, from any thread.
    """
    global _done
    if _done is None:
        _done = _set_thresholds()
    return _done


def _set_thresholds() -> bool:
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _ENV):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no libc.so.6)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # (the mmap threshold first: setting either one stops glibc adjusting them itself)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
