"""Starting the server: loopback only unless asked, API key setup, port errors, and the
`edgespec serve` command's one-line errors (all before any model loads)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.errors import ConfigError
from edgespec.server.run import ServeError, bind_socket, check_api_key, check_host, is_loopback, url_of


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.5.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("10.0.0.1", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_a_non_loopback_address_needs_allow_remote():
    check_host("127.0.0.1", allow_remote=False)
    check_host("0.0.0.0", allow_remote=True)
    with pytest.raises(ConfigError, match="--allow-remote"):
        check_host("0.0.0.0", allow_remote=False)


@pytest.mark.parametrize("key", ["", " ", "two words", "tab\tkey", "caf\u00e9", "new\nline"])
def test_unusable_api_keys_are_refused(key):
    with pytest.raises(ConfigError, match="API key"):
        check_api_key(key)


def test_usable_api_keys_pass():
    assert check_api_key(None) is None
    assert check_api_key("sk-local_123.ABC") == "sk-local_123.ABC"


def test_bind_reports_a_port_in_use_in_one_line():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is already in use"):
            bind_socket("127.0.0.1", port)
    finally:
        taken.close()
    free = bind_socket("127.0.0.1", 0)
    assert url_of(free).startswith("http://127.0.0.1:")
    free.close()


def run_serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("edgespec")
    return subprocess.run([str(exe), "serve", "--pair", "tiny", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("case", ["remote", "remote-v6", "key", "env-key", "port", "queue"])
def test_serve_user_errors_are_one_line_without_traceback(case, busy_port):
    args, env, code, message = {
        "remote": (["--host", "0.0.0.0"], None, 2, "--allow-remote"),
        "remote-v6": (["--host", "::"], None, 2, "--allow-remote"),
        "key": (["--api-key", "has space"], None, 2, "API key"),
        "env-key": ([], {"EDGESPEC_API_KEY": "bad key"}, 2, "API key"),
        "port": (["--port", str(busy_port)], None, 1, "already in use"),
        "queue": (["--max-queue", "-1"], None, 2, "max-queue"),
    }[case]
    res = run_serve(*args, env=env)
    assert res.returncode == code, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    if code == 1:
        assert res.stderr.strip().count("\n") == 0 and res.stderr.startswith("error: ")
