"""llama.cpp's log, kept quiet and read back, and Ctrl-C during its long calls.

llama.cpp reports through one process-wide log callback. Ours keeps the last lines in memory
(shown on stderr only with :func:`set_verbose`): a failed model load or context creation is
explained from them, and a load's lines tell where the weights went. Loading a model or creating
a context can take long; Python cannot interrupt a C call, so within
:func:`interrupts_deferred` Ctrl-C only sets a flag that the load's progress callback reads, and
KeyboardInterrupt is raised once llama.cpp has returned.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import threading
from typing import Iterator

import llama_cpp

_log_lock = threading.Lock()
_log_lines: list[str] = []
_verbose = False


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Keep llama.cpp's log quiet but remember recent lines to explain load failures."""
    line = text.decode("utf-8", errors="replace")
    with _log_lock:
        _log_lines.append(line)
        del _log_lines[:-200]
    if _verbose:
        os.write(2, text)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (off by default)."""
    global _verbose
    _verbose = verbose


def take_log_lines() -> list[str]:
    """llama.cpp's log lines since the last call (non-blank, stripped), and forget them."""
    with _log_lock:
        lines = [ln.strip() for ln in _log_lines if ln.strip()]
        _log_lines.clear()
    return lines


def logged_errors() -> list[str]:
    """llama.cpp's error lines since the last call (and forget every line)."""
    return [ln for ln in take_log_lines() if "error" in ln.lower() or "failed" in ln.lower()]


def recent_errors() -> str:
    """The last few error lines, joined (and forget every line)."""
    return "; ".join(logged_errors()[-3:])


#: llama.cpp's log prefixes ("llama_model_load: error loading model: ") and its generic lines
_LOG_PREFIX = re.compile(r"^(?:[A-Za-z_][\w:]*: )+|^error loading model: ")
_GENERIC = ("failed to load model", "error loading model")


def load_failure_reason() -> str:
    """The most specific reason llama.cpp logged for a failed model load, in plain words."""
    reasons: list[str] = []
    for line in logged_errors():
        reason = line
        while (stripped := _LOG_PREFIX.sub("", reason)) != reason:
            reason = stripped
        if reason and not reason.startswith(_GENERIC) and reason not in reasons:
            reasons.append(reason)
    reason = "; ".join(reasons[:2]) or "llama.cpp could not load it"
    if "unknown model architecture" in reason:
        return f"{reason} (this llama.cpp, llama-cpp-python {llama_cpp.__version__}, cannot run it)"
    if "failed to read" in reason or "file bounds" in reason or "unexpected" in reason:
        return f"the file is truncated or corrupt, e.g. an incomplete download ({reason})"
    return reason


# ---- Ctrl-C during long llama.cpp calls ----------------------------------------------------

_interrupted = threading.Event()


@llama_cpp.llama_progress_callback
def load_progress(progress: float, user_data: ctypes.c_void_p) -> bool:
    """llama.cpp asks whether to go on loading: not once Ctrl-C was pressed."""
    return not _interrupted.is_set()


def _note_interrupt(signum: int, frame: object) -> None:
    _interrupted.set()


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Make Ctrl-C stop a long llama.cpp call that logs (loading a model, creating a context).

    Python raises KeyboardInterrupt at the next bytecode it runs, and inside such a call that is
    our log callback, where ctypes can only print the exception and drop it: the load would go
    on as if nothing happened. Within this block (main thread, default Ctrl-C handler only),
    SIGINT just sets a flag; the model load's progress callback then aborts the load, and
    KeyboardInterrupt is raised as soon as llama.cpp has returned.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, _note_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if _interrupted.is_set():
            _interrupted.clear()
            raise KeyboardInterrupt
