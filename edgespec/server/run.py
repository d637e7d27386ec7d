"""Binding the listening socket and running the app under uvicorn, with a clean shutdown.

The socket is bound before the models load, so a port in use or a refused address fails at
once; it only starts listening when the app is ready, so until then a client's connection is
refused (a desktop app polls ``/health`` until it answers). SIGINT and SIGTERM stop the server
cleanly: running and queued generations are cancelled at the end of their current round,
open responses end, the worker thread is joined, and :func:`run_server` returns normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import signal
import socket
import threading
from typing import Callable, Iterator

from ..errors import ConfigError, EdgespecError

#: Seconds uvicorn waits for open responses after a stop signal before cutting them off.
SHUTDOWN_GRACE_SECONDS = 10


class ServeError(EdgespecError):
    """The server cannot start: address in use or not allowed, bad key setup."""


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_host(host: str, allow_remote: bool) -> None:
    """:class:`ConfigError` unless ``host`` is loopback or ``allow_remote`` is set."""
    if not allow_remote and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host}: it is reachable from other machines. "
            "Pass --allow-remote to do it anyway (and set an API key)"
        )


def check_api_key(key: str | None) -> str | None:
    """The key, if it is usable in an ``Authorization: Bearer`` header, else :class:`ConfigError`."""
    if key is None:
        return None
    if not key or not key.isprintable() or not key.isascii() or any(c.isspace() for c in key):
        raise ConfigError("the API key must be non-empty printable ASCII without spaces "
                          "(--api-key or EDGESPEC_API_KEY)")
    return key


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet); :class:`ServeError` if the
    address is in use, not available or not permitted."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ServeError(f"cannot listen on {host}: {err.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise ServeError(_bind_message(host, port, err)) from None
    sock.set_inheritable(True)
    return sock


def _bind_message(host: str, port: int, err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use (choose another with --port)"
    if err.errno == errno.EACCES:
        return f"not allowed to listen on {host}:{port} (ports below 1024 need privileges)"
    return f"cannot listen on {host}:{port}: {err.strerror or err}"


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(app, sock: socket.socket, *, log_level: str = "warning",
               on_ready: Callable[[], None] | None = None) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGINT/SIGTERM, then shut down cleanly.

    ``on_ready`` runs once the socket is listening. From the main thread, the signals are
    handled; from another thread (tests), stop it with ``server.should_exit`` via
    :func:`make_server`.
    """
    server = make_server(app, log_level=log_level, on_ready=on_ready)
    try:
        server.run(sockets=[sock])
    except OSError as err:  # listen() failed: another server took the port meanwhile
        raise ServeError(_bind_message(*sock.getsockname()[:2], err)) from None
    finally:
        sock.close()


def make_server(app, *, log_level: str = "warning", on_ready: Callable[[], None] | None = None):
    """A uvicorn server for ``app`` whose stop signal also cancels the running generations."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets=sockets)
            if self.started and on_ready is not None:
                on_ready()

        def handle_exit(self, sig: int, frame) -> None:
            # Cancel generations first, so open streams end now rather than after max_tokens.
            # This runs in a signal handler: do as little as possible, hand the rest to the loop.
            loop = getattr(self, "_loop", None)
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(app.state.worker.cancel_all)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after shutting down (KeyboardInterrupt, or death by
            # SIGTERM); a clean stop returns normally instead, so the models are closed and the
            # exit status is 0.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS)
    return Server(config)
