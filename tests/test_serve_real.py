"""`edgespec serve` on real llama.cpp models, through the official openai client: the tiny
SmolLM2 (streamed == plain text, a bounded load test, the CLI in a subprocess with a clean
Ctrl-C/SIGTERM stop) and one short exchange with the default pair."""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from .serve_util import running_server

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parent.parent
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SAMPLINGS = {"greedy": dict(temperature=0), "seeded": dict(temperature=0.8, top_p=0.95, seed=3)}

#: The load test fails if the server's resident memory grows by more than this.
RSS_GROWTH_BOUND = 64 * 1024 * 1024


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def api(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def chat_both_ways(client: openai.OpenAI, max_tokens: int, **sampling):
    plain = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=max_tokens,
                                           **sampling)
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, stream=True,
                                                 max_tokens=max_tokens, **sampling))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return plain, streamed, chunks


@pytest.fixture(scope="module")
def tiny_server(tiny_engine):
    with running_server(tiny_engine, model_id="tiny", max_queue=4) as served:
        yield served


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_tiny_streamed_text_equals_plain_text(tiny_server, sampling):
    client = api(tiny_server.url)
    plain, streamed, chunks = chat_both_ways(client, 24, **sampling)
    assert plain.choices[0].message.content and streamed == plain.choices[0].message.content
    assert plain.model == "tiny" and plain.usage.completion_tokens <= 24
    stats = plain.model_extra["edgespec"]
    assert stats["acceptance_rate"] == 1.0  # SmolLM2 drafting for itself accepts every draft
    assert stats["tokens_per_second"] > 0 and chunks[-1].model_extra["edgespec"]["generated"] == stats["generated"]

    text = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=24, **sampling)
    pieces = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=24,
                                       stream=True, **sampling)
    assert "".join(c.choices[0].text for c in pieces) == text.choices[0].text
    assert text.usage.completion_tokens == 24 and text.choices[0].finish_reason == "length"


def test_tiny_bounded_load(tiny_server):
    """8 clients, 32 short requests, a queue of 4: each completes or gets a 503, none hangs,
    and memory stays flat."""
    load = load_script("serve_load")
    report = load.run_load(tiny_server.url, clients=8, requests=32, max_tokens=8, timeout=60)
    print("\n" + "\n".join(report.lines()))
    assert report.failures == []
    assert report.completed + report.rejected == 32 and report.completed >= 5
    assert report.rss_after - report.rss_before < RSS_GROWTH_BOUND
    snap = httpx.get(tiny_server.url + "/metrics?format=json").json()
    assert snap["queue_depth"] == 0 and not snap["busy"]


def test_default_pair_over_openai(default_engine):
    """One short exchange with the default pair (Qwen2.5-Coder 1.5B + 0.5B)."""
    with running_server(default_engine, model_id="qwen2.5-coder-1.5b-instruct") as served:
        client = api(served.url)
        for sampling in SAMPLINGS.values():
            plain, streamed, _ = chat_both_ways(client, 12, **sampling)
            assert streamed == plain.choices[0].message.content
        assert "Paris" in chat_both_ways(client, 12, temperature=0)[1]
        stats = plain.model_extra["edgespec"]
        assert stats["drafted"] > 0 and 0 <= stats["acceptance_rate"] <= 1


class ServeProcess:
    """`edgespec serve` in a subprocess; its ready line gives the URL."""

    def __init__(self, *args: str) -> None:
        exe = Path(sys.executable).with_name("edgespec")
        self.proc = subprocess.Popen([str(exe), "serve", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def ready_url(self, timeout: float = 120) -> str:
        line = self.lines.get(timeout=timeout)
        assert "listening on http://" in line, line
        return line.split("listening on ", 1)[1].split()[0]

    def stop(self, sig: int, timeout: float = 20) -> tuple[int, str]:
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return code, self.proc.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cli_serve_answers_then_stops_cleanly_mid_stream(sig):
    server = ServeProcess("--pair", "tiny", "--port", "0", "--api-key", "k", "--ctx", "1024")
    try:
        url = server.ready_url()
        assert httpx.get(url + "/health").json()["status"] == "ok"
        client = api(url, key="k")
        answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8)
        assert answer.choices[0].message.content
        stream = client.completions.create(model="tiny", prompt="Count: 1, 2, 3,", stream=True,
                                           max_tokens=2000)
        next(iter(stream))
        start = time.monotonic()
        code, stderr = server.stop(sig)
        assert code == 0, stderr
        assert time.monotonic() - start < 10
        assert "Traceback" not in stderr and "edgespec serve: stopped" in stderr
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
