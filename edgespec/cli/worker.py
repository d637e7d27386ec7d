"""``edgespec worker``: serve this machine's devices to other edgespec processes over llama.cpp's
RPC protocol (``--rpc HOST:PORT`` on their side)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import click

from .. import config
from ..errors import ConfigError
from ..server.run import is_loopback
from .options import CONTEXT_SETTINGS, user_errors

DEFAULT_PORT = 50052  #: llama.cpp's rpc-server's


def free_port(host: str) -> int:
    """A port nothing listens on now (llama.cpp's server cannot report the one it was given)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]


def _pick(devices, wanted: tuple[str, ...]):
    if wanted:
        by_name = {d.name.lower(): d for d in devices}
        missing = [w for w in wanted if w.lower() not in by_name]
        if missing:
            raise ConfigError(f"no device {', '.join(missing)} here; devices: "
                              f"{', '.join(d.name for d in devices)}")
        return [by_name[w.lower()] for w in wanted]
    accelerators = [d for d in devices if d.kind != "CPU"]
    return accelerators or devices


@click.command("worker", context_settings=CONTEXT_SETTINGS)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --allow-remote.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port (0 = any free port; the ready line says which).")
@click.option("--allow-remote", is_flag=True,
              help="Listen on a non-loopback address. The RPC protocol has no authentication and "
                   "no encryption: trusted networks only.")
@click.option("--device", "devices", multiple=True, metavar="NAME",
              help="Device to serve (repeatable; see `edgespec info`) [default: the GPUs, else the CPU].")
@click.option("--threads", "-t", type=click.IntRange(1), default=None,
              help=f"CPU threads for a CPU device (default: {config.default_threads()}).")
@click.option("--cache", "cache", type=click.Path(file_okay=False), default=None,
              help="Where the worker keeps the weights it was sent, so that a reload need not send "
                   "them again [default: <edgespec cache>/rpc].")
@click.option("--no-cache", is_flag=True, help="Keep no weights on disk.")
@user_errors
def worker(host: str, port: int, allow_remote: bool, devices: tuple[str, ...], threads: int | None,
           cache: str | None, no_cache: bool) -> None:
    """Serve this machine's devices to edgespec clients (`--rpc HOST:PORT`).

    Stop it with Ctrl-C or SIGTERM.
    """
    from pathlib import Path

    from ..runtime import rpc

    if not is_loopback(host) and not allow_remote:
        raise ConfigError(f"--host {host} would serve this machine's devices to anyone who can reach "
                          "it: the RPC protocol has no authentication and no encryption. On a trusted "
                          "network, add --allow-remote")
    rpc.require()
    chosen = _pick(rpc.local_devices(), devices)
    cache_dir = None if no_cache else Path(cache).expanduser() if cache else config.cache_dir() / "rpc"
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    if port == 0:
        port = free_port(host)
    endpoint = f"{host}:{port}"
    # llama.cpp's server prints its log on stdout: send it to stderr, keep stdout for our lines.
    out = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    if not is_loopback(host):
        click.echo(f"warning: serving on {host}: no authentication, no encryption; trusted "
                   "networks only", err=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # before the ready line: a stop may follow it at once
    server = threading.Thread(target=rpc.serve, args=(endpoint, chosen),
                              kwargs={"threads": threads or config.default_threads(),
                                      "cache_dir": cache_dir}, daemon=True)
    server.start()
    _wait_listening(host, port, server)
    names = ", ".join(f"{d.name} ({d.description}, {d.free / 2**30:.1f} GiB free)" for d in chosen)
    say(f"edgespec worker: serving {names} on {endpoint} (client: --rpc {endpoint})")
    try:
        while not stop.wait(0.5):
            if not server.is_alive():
                raise ConfigError(f"the RPC server on {endpoint} stopped (see its log above)")
    except KeyboardInterrupt:
        pass
    say("edgespec worker: stopped")
    # llama.cpp's server loop has no stop: leave without waiting for its thread.
    os._exit(0)


def _wait_listening(host: str, port: int, server: threading.Thread, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.is_alive():
            raise ConfigError(f"cannot listen on {host}:{port} (in use, or not an address of this "
                              "machine?)")
        try:
            socket.create_connection((host.strip("[]"), port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise ConfigError(f"the RPC server on {host}:{port} did not start within {timeout:.0f} s")
