"""`edgespec serve` on real llama.cpp models, through the official openai client: the tiny
SmolLM2 (streamed == plain text, a JSON schema'd answer, logprobs, a bounded load test, the
CLI in a subprocess with a clean Ctrl-C/SIGTERM stop) and short exchanges with the default
pair (plain text, tool calls)."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import jsonschema
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


VERDICT = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "confidence": {"type": "integer", "minimum": 0,
                                                          "maximum": 100}},
           "required": ["answer", "confidence"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris right now, in Celsius?"}]


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_tiny_response_format_json_schema(tiny_server, sampling):
    client = api(tiny_server.url)
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}
    ask = [{"role": "user", "content": "Is Paris the capital of France? Answer in JSON."}]
    plain = client.chat.completions.create(model="tiny", messages=ask, response_format=fmt,
                                           max_tokens=40, **sampling)
    answer = plain.choices[0].message.content
    jsonschema.validate(json.loads(answer), VERDICT)
    assert plain.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model="tiny", messages=ask, response_format=fmt,
                                            max_tokens=40, stream=True, **sampling)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    with pytest.raises(openai.BadRequestError, match="bad JSON schema"):
        client.chat.completions.create(model="tiny", messages=ask, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}})


def test_tiny_logprobs_with_top_logprobs(tiny_server):
    client = api(tiny_server.url)
    args = dict(model="tiny", messages=QUESTION, max_tokens=12, temperature=0, logprobs=True,
                top_logprobs=3)
    plain = client.chat.completions.create(**args)
    content = plain.choices[0].logprobs.content
    assert len(content) == plain.usage.completion_tokens
    assert b"".join(bytes(t.bytes) for t in content).decode() == plain.choices[0].message.content
    for t in content:
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert t.token == t.top_logprobs[0].token and t.logprob == pytest.approx(tops[0])  # greedy
    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]
    text = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8,
                                     temperature=0, logprobs=2).choices[0]
    assert "".join(text.logprobs.tokens) == text.text and len(text.logprobs.token_logprobs) == 8
    assert all(len(top) == 2 for top in text.logprobs.top_logprobs)  # the chosen one is the top one
    assert text.logprobs.text_offset[0] == 0 and text.logprobs.text_offset == sorted(text.logprobs.text_offset)


def test_tiny_has_no_tool_format(tiny_server):
    with pytest.raises(openai.BadRequestError) as err:
        api(tiny_server.url).chat.completions.create(model="tiny", messages=WEATHER_ASK,
                                                     tools=[WEATHER])
    assert err.value.body["param"] == "tools" and "no tool-call format" in err.value.body["message"]


def test_default_pair_tool_calls_over_openai(default_engine):
    """The default target calls a tool: a named call (constrained) whole and streamed, the
    free (auto) answer read as a call, and the tool's result answered in words."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    with running_server(default_engine, model_id="qwen2.5-coder-1.5b-instruct") as served:
        client = api(served.url)
        args = dict(model="q", messages=WEATHER_ASK, tools=[WEATHER], max_tokens=32, temperature=0)
        plain = client.chat.completions.create(**args, tool_choice=named)
        choice = plain.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        assert call.function.name == "get_weather" and arguments["city"] == "Paris"
        chunks = list(client.chat.completions.create(**args, tool_choice=named, stream=True))
        deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
        assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

        free = client.chat.completions.create(**{**args, "max_tokens": 56}).choices[0]  # auto
        assert free.finish_reason == "tool_calls"
        assert [c.function.name for c in free.message.tool_calls] == ["get_weather"]
        assert json.loads(free.message.tool_calls[0].function.arguments)["city"] == "Paris"

        history = [*WEATHER_ASK, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius, sunny"}]
        # (with the tools still on offer, this small model calls again: "none" asks for words)
        answer = client.chat.completions.create(model="q", messages=history, tools=[WEATHER],
                                                tool_choice="none", max_tokens=20,
                                                temperature=0).choices[0]
        assert answer.message.tool_calls is None and "18" in answer.message.content


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
