"""llama.cpp's RPC backend: a worker serves this machine's devices, and a client puts a model's
layers on workers elsewhere (llama.cpp's own protocol, as ``llama-server --rpc`` speaks it).

Everything goes through the ggml that ``libllama`` links: its ``.so.0`` files. The wheel also
holds ``libggml*.so`` and ``.so.0.x`` as separate files, and loading those would bring a second,
independent ggml (its own device registry, its own abort callback) that llama.cpp never uses.

ggml aborts the process when a worker cannot be reached or stops answering. :func:`install_abort_handler`
turns that into one ``error:`` line and exit status 1 (what was already printed stays): there is
no way back into the program from inside llama.cpp at that point.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, ModelError

#: ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: the longest one call to the workers may take before the client gives up on them
DEFAULT_RPC_TIMEOUT_S = 60.0
_ENDPOINT_RE = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}
_servers: dict[str, list[int]] = {}  #: endpoint -> its device handles, once added
_abort_cb = None  #: keeps the ctypes callback alive
_context = {"endpoints": ""}
_last_words: list[Callable[[str], None]] = []  #: on_fatal hooks
_ending = threading.Lock()  #: held by the thread that ends the process


@dataclass(frozen=True)
class Device:
    """A ggml device: its name (``CPU``, ``CUDA0``, ``RPC0``), description and memory in bytes."""

    handle: int
    name: str
    description: str
    kind: str
    free: int
    total: int


def parse_endpoints(text: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` as a tuple; :class:`ConfigError` naming a malformed one."""
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for raw in items:
        ep = raw.strip()
        m = _ENDPOINT_RE.match(ep)
        if not m or not 0 < int(m.group("port")) < 65536:
            raise ConfigError(f"RPC endpoint {raw.strip()!r} is not HOST:PORT")
        out.append(ep)
    return tuple(dict.fromkeys(out))


def _lib(name: str) -> ctypes.CDLL:
    """One of llama.cpp's ggml libraries, by the ``.so.0`` name libllama links (dlopen hands back
    the copy already loaded, being the same file)."""
    with _lock:
        if name not in _libs:
            spec = importlib.util.find_spec("llama_cpp")
            dirs = list(spec.submodule_search_locations or []) if spec is not None else []
            if not dirs:
                raise ModelError("llama-cpp-python's libraries are not installed")
            # `import edgespec` has loaded libllama already (edgespec._native), so this is its copy
            _libs[name] = ctypes.CDLL(str(Path(dirs[0]) / "lib" / f"{name}.so.0"))
        return _libs[name]


def _ggml() -> ctypes.CDLL:
    lib = _lib("libggml")
    if not getattr(lib, "_edgespec_typed", False):
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        for fname, res, args in [
            ("ggml_backend_reg_by_name", vp, [cp]),
            ("ggml_backend_reg_get_proc_address", vp, [vp, cp]),
            ("ggml_backend_register", None, [vp]),
            ("ggml_backend_reg_dev_count", ctypes.c_size_t, [vp]),
            ("ggml_backend_reg_dev_get", vp, [vp, ctypes.c_size_t]),
            ("ggml_backend_dev_count", ctypes.c_size_t, []),
            ("ggml_backend_dev_get", vp, [ctypes.c_size_t]),
            ("ggml_backend_dev_name", cp, [vp]),
            ("ggml_backend_dev_description", cp, [vp]),
            ("ggml_backend_dev_type", ctypes.c_int, [vp]),
            ("ggml_backend_dev_memory", None, [vp, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]),
        ]:
            fn = getattr(lib, fname)
            fn.restype, fn.argtypes = res, args
        lib._edgespec_typed = True
    return lib


def available() -> bool:
    """Whether this llama.cpp build has the RPC backend."""
    try:
        return bool(_ggml().ggml_backend_reg_by_name(b"RPC"))
    except (OSError, AttributeError, ModelError):
        return False


def require() -> int:
    """The RPC backend's registry; :class:`ConfigError` when this llama.cpp was built without it."""
    reg = _ggml().ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise ConfigError("this llama.cpp was built without RPC: rebuild with `make setup` "
                          "(it adds -DGGML_RPC=ON)")
    return reg


def _proc(name: str, restype, *argtypes):
    addr = _ggml().ggml_backend_reg_get_proc_address(require(), name.encode())
    if not addr:
        raise ConfigError(f"this llama.cpp's RPC backend has no {name}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


def device(handle: int) -> Device:
    """A device's name, description, kind and memory."""
    g = _ggml()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return Device(handle=handle, name=(g.ggml_backend_dev_name(handle) or b"").decode(),
                  description=(g.ggml_backend_dev_description(handle) or b"").decode(),
                  kind=DEVICE_TYPES.get(g.ggml_backend_dev_type(handle), "?"),
                  free=free.value, total=total.value)


def local_devices() -> list[Device]:
    """This machine's devices (RPC devices added by this process excluded)."""
    g = _ggml()
    remote = {h for hs in _servers.values() for h in hs}
    return [device(h) for h in (g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count()))
            if h not in remote and not (g.ggml_backend_dev_name(h) or b"").startswith(b"RPC")]


# --------------------------------------------------------------------------- client


def check_reachable(endpoint: str, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """:class:`ModelError` naming the worker if nothing accepts a connection there (ggml itself
    would abort the process)."""
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise ModelError(f"RPC worker {endpoint} is unreachable: {err.strerror or err}") from None


def connect(endpoints: tuple[str, ...], *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[Device]:
    """The devices the workers at ``endpoints`` serve, registered with llama.cpp (once per
    endpoint and process)."""
    install_abort_handler()
    add = None
    out = []
    for ep in endpoints:
        if ep not in _servers:
            check_reachable(ep, timeout)
            add = add or _proc("ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
            _context["endpoints"] = ", ".join([*_servers, ep])
            reg = add(ep.encode())
            if not reg:
                raise ModelError(f"RPC worker {ep} serves no device")
            g = _ggml()
            g.ggml_backend_register(reg)
            _servers[ep] = [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]
        out += [device(h) for h in _servers[ep]]
    return out


def connected() -> bool:
    """Whether this process has registered any worker."""
    return bool(_servers)


def device_array(devices: list[Device]) -> ctypes.Array:
    """A NULL-terminated ``ggml_backend_dev_t`` array for ``llama_model_params.devices`` (keep it
    alive as long as the model)."""
    arr = (ctypes.c_void_p * (len(devices) + 1))(*[d.handle for d in devices], None)
    return arr


# --------------------------------------------------------------------------- faults


def install_abort_handler() -> None:
    """From now on, a ggml abort (a worker gone, a malformed answer) prints one ``error:`` line
    naming the workers and exits with status 1, instead of a core dump and a backtrace."""
    global _abort_cb
    if _abort_cb is not None:
        return
    base = _lib("libggml-base")
    cb_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    def on_abort(message: bytes | None) -> None:
        text = " ".join((message or b"").decode("utf-8", "replace").split())
        text = re.sub(r"^\S+\.(?:cpp|c|h):\d+:\s*", "", text)  # ggml's file:line prefix
        workers = _context["endpoints"]
        fatal(f"RPC worker {workers}: {text}" if workers else text or "llama.cpp aborted")

    _abort_cb = cb_type(on_abort)
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback.argtypes = [cb_type]
    base.ggml_set_abort_callback(_abort_cb)


def on_fatal(hook: Callable[[str], None]) -> Callable[[], None]:
    """Have ``hook(message)`` called when a worker fault is about to end the process, before the
    ``error:`` line: the last chance to answer whoever waits (``serve``'s open requests,
    ``complete --json``'s object). It runs on the thread that found the fault, possibly one
    stuck inside llama.cpp, so it must not touch the models, and must return within seconds.
    Returns a function that removes it."""
    _last_words.append(hook)

    def remove() -> None:
        if hook in _last_words:
            _last_words.remove(hook)

    return remove


def last_words(message: str) -> None:
    """Run the :func:`on_fatal` hooks (what :func:`fatal` does before it ends the process)."""
    for hook in list(_last_words):
        try:
            hook(message)
        except BaseException:  # noqa: BLE001 - ending anyway; the error line still goes out
            pass


def fatal(message: str) -> None:
    """End the process now: the :func:`on_fatal` hooks run, what was printed stays, then one
    ``error:`` line, exit status 1. A second thread that finds a fault meanwhile waits for the
    first to end the process."""
    if not _ending.acquire(blocking=False):
        while True:
            time.sleep(60)
    last_words(message)
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
    os.write(2, f"\nerror: {message}\n".encode())
    os._exit(1)


class Watchdog:
    """Ends the process with an error when a call to the workers outlives ``timeout`` seconds:
    ggml's sockets have none, and a host that vanishes without closing them blocks for ever.
    Arm it by setting ``deadline`` (``time.perf_counter()`` seconds), disarm with ``None``."""

    def __init__(self, endpoints: tuple[str, ...], timeout: float) -> None:
        self.timeout = timeout
        self.deadline: float | None = None
        self._endpoints = ", ".join(endpoints)
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="rpc-watchdog", daemon=True).start()

    def close(self) -> None:
        """Stop watching (the model is freed)."""
        self._closed.set()

    def _watch(self) -> None:
        tick = min(1.0, self.timeout / 4)
        while not self._closed.wait(tick):
            deadline = self.deadline
            if deadline is not None and time.perf_counter() > deadline:
                fatal(f"RPC worker {self._endpoints}: no answer within {self.timeout:g} s "
                      "(--rpc-timeout)")


# --------------------------------------------------------------------------- worker


def serve(endpoint: str, devices: list[Device], *, threads: int, cache_dir: Path | None) -> None:
    """Serve ``devices`` at ``endpoint`` (blocks for ever; llama.cpp's server has no stop)."""
    start = _proc("ggml_backend_rpc_start_server", None, ctypes.c_char_p, ctypes.c_char_p,
                  ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))
    arr = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    cache = str(cache_dir).encode() if cache_dir is not None else None
    start(endpoint.encode(), cache, threads, len(devices), arr)
