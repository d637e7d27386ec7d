"""Across machines over llama.cpp's RPC: `edgespec worker` as a real subprocess on 127.0.0.1, the
target's layers on it. Token-identical to local decoding, greedy and seeded; the fault cases end
in one `error:` line and exit 1, the streamed text kept."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli.main import cli
from edgespec.core.sampling import SamplingParams
from edgespec.errors import ConfigError
from edgespec.runtime.rpc import parse_endpoints
from edgespec.server.run import is_loopback

from .real_util import GREEDY, ids

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a short poem about rivers and the sea."


# --------------------------------------------------------------------------- no worker needed


def test_parse_endpoints():
    assert parse_endpoints("127.0.0.1:50052,gpu-box:1, [::1]:9") == ("127.0.0.1:50052", "gpu-box:1", "[::1]:9")
    assert parse_endpoints(None) == () and parse_endpoints(["a:1", "a:1"]) == ("a:1",)
    for bad in ("host", "host:", "host:0", "host:70000", "ho st:1", "a:1,,b:2"):
        with pytest.raises(ConfigError, match="is not HOST:PORT"):
            parse_endpoints(bad)


def test_parse_tensor_split():
    from edgespec.runtime.backend import parse_tensor_split

    assert parse_tensor_split("3,1") == (3.0, 1.0)
    assert parse_tensor_split([0, 2.5]) == (0.0, 2.5)
    assert parse_tensor_split(None) == parse_tensor_split("") == ()
    for bad in ("3,x", "0,0", "1,-1", "inf,1", "1,,2"):
        with pytest.raises(ConfigError, match="tensor split"):
            parse_tensor_split(bad)


def test_loopback():
    """The worker's check is the server's (edgespec.server.run.is_loopback)."""
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("gpu-box")


def test_worker_refuses_a_remote_host_without_allow_remote():
    res = CliRunner().invoke(cli, ["worker", "--host", "0.0.0.0", "--port", "0"])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --host 0.0.0.0 would serve this machine's devices")
    assert "no authentication and no encryption" in res.stderr and "--allow-remote" in res.stderr


def test_bad_rpc_option_is_a_usage_error():
    res = CliRunner().invoke(cli, ["complete", "hi", "--pair", "tiny", "--rpc", "nope"])
    assert res.exit_code == 2 and "RPC endpoint 'nope' is not HOST:PORT" in res.stderr
    res = CliRunner().invoke(cli, ["complete", "hi", "--pair", "tiny", "--tensor-split", "1,x"])
    assert res.exit_code == 2 and "tensor split '1,x' is not a list of numbers" in res.stderr


def test_delay_proxy_adds_the_round_trip():
    echo = socket.create_server(("127.0.0.1", 0))
    port = echo.getsockname()[1]

    def serve():
        conn, _ = echo.accept()
        while data := conn.recv(1024):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    proxy = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "delay_proxy.py"), "--to",
                              f"127.0.0.1:{port}", "--delay-ms", "20"], stdout=subprocess.PIPE, text=True)
    try:
        ready = proxy.stdout.readline()
        listen = re.search(r"ready on (\S+):(\d+)", ready)
        with socket.create_connection((listen.group(1), int(listen.group(2)))) as s:
            times = []
            for _ in range(3):
                t = time.perf_counter()
                s.sendall(b"ping")
                assert s.recv(16) == b"ping"
                times.append(time.perf_counter() - t)
        assert min(times) >= 0.040  # 20 ms each way
        assert min(times) < 0.5
    finally:
        proxy.terminate()
        proxy.wait(10)
        echo.close()


# --------------------------------------------------------------------------- a real worker


class Worker:
    """`edgespec worker --port 0` in a subprocess; ``endpoint`` once it is ready."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "edgespec", "worker", "--port", "0",
                                      "--threads", "2"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r" on (127\.0\.0\.1:\d+) ", line)
        assert m, (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.endpoint = m.group(1)
        self.ready_line = line

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.stop()


def _run(engine, **kw):
    return engine.complete(PROMPT, max_tokens=40, **kw)


@pytest.mark.real
def test_worker_ready_line_and_clean_stop():
    w = Worker()
    assert "serving CPU" in w.ready_line and f"--rpc {w.endpoint}" in w.ready_line
    rc, out = w.stop()
    assert rc == 0 and out.strip().endswith("edgespec worker: stopped")


@pytest.mark.real
def test_info_lists_the_remote_devices(worker):
    res = subprocess.run([sys.executable, "-m", "edgespec", "info", "--rpc", worker.endpoint],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "RPC:              yes" in res.stdout
    assert re.search(rf"remote device:    RPC\d+ at {re.escape(worker.endpoint)}: [\d.]+ of [\d.]+ GiB free",
                     res.stdout)


def _local(pair: str, *, repack: bool):
    """The pair on this machine, with or without llama.cpp's repacked CPU weights (a worker's CPU
    computes without them: the RPC server allocates plain buffers)."""
    from edgespec.models.catalog import resolve_pair
    from edgespec.models.resolve import resolve_model
    from edgespec.runtime.backend import LlamaBackend, ModelOptions
    from edgespec.runtime.engine import Engine

    chosen = resolve_pair(pair)
    paths = [resolve_model(name, progress=False) for name in (chosen.target, chosen.draft)]
    target = LlamaBackend(ModelOptions(path=paths[0], n_threads=2, n_ctx=1024, repack=repack))
    draft = LlamaBackend(ModelOptions(path=paths[1], n_threads=2, n_ctx=1024,
                                      batch_consistent=paths[0] == paths[1]))
    return Engine(target, draft, drafter="hybrid")


@pytest.mark.real
@pytest.mark.parametrize("pair", ["tiny", "default"])
def test_through_a_worker_is_exact_and_token_identical_to_local(worker, pair):
    """Through the worker, every drafter's greedy tokens are plain decoding's there, and greedy and
    seeded sampling match a local run of the same kernels token for token: the worker's CPU runs
    this ggml, and the client keeps the batch-consistent pieces."""
    from edgespec.runtime.engine import Engine

    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=5)
    with _local(pair, repack=False) as local:
        want = ids(_run(local, sampling=GREEDY, drafter="none"))
        want_sampled = ids(_run(local, sampling=sampled, drafter="model"))
    with Engine.load(pair=pair, drafter="hybrid", n_ctx=1024, progress=False,
                     rpc=worker.endpoint) as remote:
        assert remote.target.options.rpc == (worker.endpoint,) and remote.draft.options.rpc == ()
        drafters = ("none", "lookup", "model", "hybrid", "auto") if pair == "tiny" else ("none", "hybrid")
        for drafter in drafters:
            assert ids(_run(remote, sampling=GREEDY, drafter=drafter)) == want, drafter
        assert ids(_run(remote, sampling=sampled, drafter="model")) == want_sampled


@pytest.mark.real
def test_tensor_split_weighs_two_workers_and_keeps_the_tokens(worker):
    from edgespec.runtime.engine import Engine

    second = Worker()
    both = f"{worker.endpoint},{second.endpoint}"
    try:
        got = {}
        for split in ("1,0", "0,1", "3,1"):
            with Engine.load(pair="tiny", drafter="none", rpc=both, tensor_split=split,
                             progress=False) as engine:
                on = {name.split("[")[1].rstrip("]"): mib
                      for name, mib in engine.target.placement.items() if name.startswith("RPC")}
                got[split] = (on, ids(_run(engine, sampling=GREEDY)))
        assert list(got["1,0"][0]) == [worker.endpoint]  # every layer on the first worker
        assert list(got["0,1"][0]) == [second.endpoint]
        three_one = got["3,1"][0]
        assert set(three_one) == {worker.endpoint, second.endpoint}
        assert three_one[worker.endpoint] > three_one[second.endpoint]
        assert got["1,0"][1] == got["0,1"][1] == got["3,1"][1]
        with pytest.raises(ConfigError, match=r"3 weights for 2 devices \(RPC0, RPC1\)"):
            Engine.load(pair="tiny", drafter="none", rpc=both, tensor_split="1,1,1", progress=False)
    finally:
        second.stop()


@pytest.mark.real
def test_unreachable_worker_is_one_error_line():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "edgespec", "complete", "hi", "--pair", "tiny",
                          "--rpc", f"127.0.0.1:{port}", "-n", "4"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip() == (f"error: RPC worker 127.0.0.1:{port} is unreachable: "
                                  "Connection refused")
    assert time.monotonic() - t < 30


@pytest.mark.real
def test_a_server_that_is_no_worker_is_one_error_line():
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def hang_up():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        res = subprocess.run([sys.executable, "-m", "edgespec", "complete", "hi", "--pair", "tiny",
                              "--rpc", f"127.0.0.1:{port}", "-n", "4"], capture_output=True,
                             text=True, timeout=120)
    finally:
        srv.close()
    assert res.returncode == 1, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: RPC worker 127.0.0.1:{port}: ")
    assert "Traceback" not in res.stderr and "backtrace" not in res.stderr.lower()


@pytest.mark.real
def test_worker_killed_mid_stream_keeps_the_text_and_exits_1():
    w = Worker()
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "complete", PROMPT, "--pair", "tiny",
                             "--rpc", w.endpoint, "-n", "400", "--drafter", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(8)  # generation has begun
    w.proc.kill()
    w.proc.wait()
    rest, err = proc.communicate(timeout=120)
    text = (first + rest).decode("utf-8", "replace")
    assert proc.returncode == 1, err
    assert len(text.strip()) >= 8
    last = [line for line in err.decode().splitlines() if line.strip()][-1]
    assert last.startswith(f"error: RPC worker {w.endpoint}: ")
    assert b"Traceback" not in err and b"backtrace" not in err.lower()


@pytest.mark.real
def test_worker_killed_mid_stream_with_json_prints_the_object_so_far():
    w = Worker()
    # --verbose puts llama.cpp's log on stderr: its last load line says generation is next
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "complete", "Count: 1, 2, 3,",
                             "--raw", "--pair", "tiny", "--rpc", w.endpoint, "-n", "3000",
                             "--drafter", "none", "--json", "--verbose"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stderr:
        if b"reserve took" in line:  # the context is made: generation is next
            break
    # keep reading the log: the greedy sampler's graph reserve logs ~75 KB more, and a full pipe
    # would stop the process before it generates anything
    log: list[bytes] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)
    reader.start()
    time.sleep(3)  # well into the count, not at its end: the tiny model makes ~50 tokens/s here
    w.proc.kill()
    w.proc.wait()
    out = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = b"".join(log)
    assert proc.returncode == 1, err[-2000:]
    import json

    obj = json.loads(out)
    assert obj["finish_reason"] == "error" and obj["error"].startswith(f"RPC worker {w.endpoint}: ")
    assert 0 < obj["tokens"] < 3000 and obj["text"] and obj["stats"]["generated"] == obj["tokens"]
    assert err.decode().strip().splitlines()[-1] == f"error: {obj['error']}"
    assert b"Traceback" not in err


@pytest.mark.real
def test_serve_answers_open_requests_when_its_worker_dies_then_exits_1():
    from .test_serve_real import ServeProcess

    w = Worker()
    server = ServeProcess("--pair", "tiny", "--rpc", w.endpoint, "--drafter", "none", "--port", "0")
    try:
        url = server.ready_url()
        import httpx

        events: list[str] = []
        with httpx.stream("POST", url + "/v1/completions", timeout=60,
                          json={"prompt": "Count: 1, 2, 3,", "max_tokens": 3000,
                                "stream": True}) as res:
            for line in res.iter_lines():
                if line:
                    events.append(line)
                if len(events) == 3:
                    w.proc.kill()
        assert events[-1] == "data: [DONE]"
        assert '"backend_unavailable"' in events[-2] and w.endpoint in events[-2]
        assert server.proc.wait(30) == 1
        stderr = server.proc.stderr.read()
        assert stderr.strip().splitlines()[-1].startswith(f"error: RPC worker {w.endpoint}: ")
        assert "Traceback" not in stderr
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


@pytest.mark.real
def test_chat_gives_the_terminal_back_when_its_worker_dies():
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios

    w = Worker()
    pid, fd = pty.fork()
    if pid == 0:  # the child: `edgespec chat` on a terminal of 100 x 30
        os.execv(sys.executable, [sys.executable, "-m", "edgespec", "chat", "--pair", "tiny",
                                  "--rpc", w.endpoint, "--drafter", "none",
                                  "-n", "3000"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    screen = bytearray()

    def read_until(done, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    screen.extend(os.read(fd, 1 << 16))
                except OSError:  # the child has gone
                    return done()
            if done():
                return True
        return False

    try:
        assert read_until(lambda: b"Message (Enter sends" in screen, 60), bytes(screen[-500:])
        # (that placeholder appears once the models are loaded)
        w.proc.kill()  # before the message, not during the answer: the fault must not race it
        w.proc.wait()
        os.write(fd, b"Say hello\r")
        assert read_until(lambda: b"error: RPC worker" in screen, 30), bytes(screen[-500:])
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    tail = bytes(screen[screen.rindex(b"error: RPC worker"):]).decode()
    assert os.waitstatus_to_exitcode(status) == 1
    assert tail.strip().startswith(f"error: RPC worker {w.endpoint}: ")
    before = bytes(screen[:screen.rindex(b"error: RPC worker")])
    assert before.rindex(b"\x1b[?1049l") > before.rindex(b"\x1b[?1049h")  # full screen left first
    assert b"Traceback" not in screen


class FreezingProxy:
    """Forwards TCP to ``target`` until ``freeze()``: then the connection stays open and silent,
    as when a host vanishes without closing it."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.frozen = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                if not self.frozen.is_set():
                    dst.sendall(data)
            if not self.frozen.is_set():
                dst.shutdown(socket.SHUT_WR)  # pass the close on (a worker serves one client at a time)
        except OSError:
            pass

    def freeze(self) -> None:
        self.frozen.set()


@pytest.mark.real
def test_a_worker_that_stops_answering_times_out():
    worker = Worker()  # its own: the frozen connection keeps it busy for ever (one client at a time)
    proxy = FreezingProxy(worker.endpoint)
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "complete", PROMPT, "--pair", "tiny",
                             "--rpc", proxy.endpoint, "--rpc-timeout", "3", "-n", "400",
                             "--drafter", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(8)
    proxy.freeze()
    t = time.monotonic()
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert time.monotonic() - t < 20
    assert len((first + rest).strip()) >= 8
    last = [line for line in err.decode().splitlines() if line.strip()][-1]
    assert last == f"error: RPC worker {proxy.endpoint}: no answer within 3 s (--rpc-timeout)"
    worker.proc.kill()
    worker.proc.wait()


@pytest.mark.real
def test_bench_through_a_worker_records_it_and_skips_the_local_only_reference(worker, tmp_path):
    import json

    out = tmp_path / "b.json"
    res = subprocess.run([sys.executable, "-m", "edgespec", "bench", "--pair", "tiny", "--rpc",
                          worker.endpoint, "--drafters", "none,lookup,llama-cpp-python",
                          "--kinds", "edit", "-r", "1", "-n", "8", "--json", str(out),
                          "--plot", str(tmp_path / "b.png")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["rpc"] == worker.endpoint
    assert {o["config"] for o in doc["aggregates"]["overall"]} == {"none", "lookup"}
    assert "llama-cpp-python has no RPC" in json.dumps(doc)
    assert all(o["tokens_per_second"] > 0 for o in doc["aggregates"]["overall"])


@pytest.mark.real
def test_verify_through_a_worker_passes_and_names_the_mode(worker):
    res = subprocess.run([sys.executable, "-m", "edgespec", "verify", "--pair", "tiny", "--rpc",
                          worker.endpoint, "--drafters", "model,lookup", "--no-greedy",
                          "--samples", "40", "--tokens", "1", "--temperature", "0.8", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    import json

    report = json.loads(res.stdout)
    assert report["settings"]["rpc"] == [worker.endpoint]
    assert f"target on RPC workers {worker.endpoint}" in report["settings"]["kernels"]
