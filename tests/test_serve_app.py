"""The HTTP server over a fake engine (tests/fakes.py models, real Engine, real uvicorn on
loopback): the official openai client, errors, API key, queue full, disconnects, shutdown."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from .serve_util import MODEL_ID, fake_engine, running_server

HELLO = [{"role": "user", "content": "Say hello"}]


def client(served, key: str = "no-key", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.v1, api_key=key, max_retries=0, timeout=20, **kw)


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def streamed_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    texts = []
    for c in chunks:
        for choice in c.choices:
            texts.append(choice.delta.content or "" if hasattr(choice, "delta") else choice.text)
    return "".join(texts), chunks


@pytest.fixture(scope="module")
def served():
    with running_server(fake_engine()) as s:
        yield s


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, seed=7, top_p=0.9)])
def test_openai_client_streamed_text_equals_plain_text(served, sampling):
    api = client(served)
    plain = api.completions.create(model="whatever", prompt="Once", max_tokens=20, **sampling)
    text, chunks = streamed_text(api.completions.create(model="whatever", prompt="Once",
                                                        max_tokens=20, stream=True, **sampling))
    assert text == plain.choices[0].text and len(text) == 20  # one printable char per token
    assert plain.model == MODEL_ID and plain.object == "text_completion"
    assert plain.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "length"
    assert plain.usage.completion_tokens == 20 and plain.usage.prompt_tokens > 0
    stats = plain.model_extra["edgespec"]
    assert stats["generated"] == 20 and stats["acceptance_rate"] == 1.0  # self-draft
    assert {"mean_accepted", "tokens_per_second", "finish_reason", "speedup"} <= set(stats)

    chat = api.chat.completions.create(model="x", messages=HELLO, max_tokens=12, **sampling)
    text, chunks = streamed_text(api.chat.completions.create(
        model="x", messages=HELLO, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, **sampling))
    assert text == chat.choices[0].message.content and chat.choices[0].message.role == "assistant"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-2].model_extra["edgespec"]["generated"] == 12
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chat.object == "chat.completion" and chunks[1].object == "chat.completion.chunk"


def test_extra_body_fields_reach_the_engine(served):
    api = client(served)
    out = api.completions.create(model="x", prompt="Once", max_tokens=10,
                                 extra_body={"drafter": "lookup", "draft_length": 2, "top_k": 3,
                                             "min_p": 0.05, "temperature": 0.7, "seed": 1})
    assert set(out.model_extra["edgespec"]["by_drafter"]) <= {"lookup", "none"}
    greedy = api.completions.create(model="x", prompt="Once", max_tokens=10).choices[0].text
    stop = api.completions.create(model="x", prompt="Once", max_tokens=10, stop=[greedy[3:5]])
    assert stop.choices[0].finish_reason == "stop" and stop.choices[0].text == greedy[:3]


def test_models_health_and_metrics(served):
    api = client(served)
    [card] = api.models.list().data
    assert card.id == MODEL_ID and card.owned_by == "edgespec"
    assert api.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4")
    http = httpx.Client(base_url=served.url, timeout=10)
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL_ID
    api.completions.create(model="x", prompt="Once", max_tokens=3)
    plain = api.completions.create(model="x", prompt="Once", max_tokens=5,
                                   extra_body={"drafter": "none"}).model_extra["edgespec"]
    assert plain["speedup"]["ratio"] == 1.0 and plain["speedup"]["basis"] == "measured"
    snap = http.get("/metrics", params={"format": "json"}).json()
    assert snap["speedup"]["generations"]["measured"] >= 1 and snap["speedup"]["ratio"] is not None
    assert snap["requests"]["by_endpoint"]["completions"]["200"] >= 1
    assert snap["tokens"]["generated"] >= 3 and snap["acceptance_rate"] == 1.0
    assert snap["queue_depth"] == 0 and snap["resident_memory_bytes"] > 0
    text = http.get("/metrics").text
    assert '# TYPE edgespec_tokens_total counter' in text and "edgespec_queue_depth 0" in text
    assert 'edgespec_tokens_total{kind="generated"}' in text
    assert "# TYPE edgespec_speedup gauge" in text


@pytest.mark.parametrize("method, path, body, status, code", [
    ("POST", "/v1/completions", b"{oops", 400, "invalid_json"),
    ("POST", "/v1/completions", b'{"prompt": ["a", "b"]}', 400, None),
    ("POST", "/v1/completions", b'{"max_tokens": 3}', 422, "invalid_type"),
    ("POST", "/v1/chat/completions", b'{"messages": "hi"}', 422, "invalid_type"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "functions": [{}]}',
     400, "unsupported_parameter"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 99}', 400, None),
    ("POST", "/v1/completions", json.dumps({"prompt": "word " * 300}).encode(), 400,
     "context_length_exceeded"),
    ("POST", "/v1/completions", b'{"prompt": "x", "temperature": -2}', 400, None),
    ("GET", "/v1/nothing", None, 404, "not_found"),
    ("GET", "/v1/chat/completions", None, 405, None),
])
def test_bad_requests_get_openai_error_bodies(served, method, path, body, status, code):
    res = httpx.request(method, served.url + path, content=body, timeout=10)
    assert res.status_code == status
    err = res.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error"
    if code:
        assert err["code"] == code
    assert "Traceback" not in res.text


def test_openai_client_raises_readable_errors(served):
    api = client(served)
    with pytest.raises(openai.BadRequestError, match="temperature must be"):
        api.completions.create(model="x", prompt="hi", temperature=-1)
    with pytest.raises(openai.BadRequestError, match="unknown drafter"):
        api.chat.completions.create(model="x", messages=HELLO, extra_body={"drafter": "magic"})
    with pytest.raises(openai.BadRequestError, match="context holds"):
        api.chat.completions.create(model="x", messages=[{"role": "user", "content": "w " * 300}],
                                    stream=True)
    assert api.completions.create(model="x", prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_api_key_is_required_when_set():
    with running_server(fake_engine(), api_key="s3cret") as s:
        with pytest.raises(openai.AuthenticationError):
            client(s, "wrong").completions.create(model="x", prompt="hi", max_tokens=2)
        for headers in ({}, {"Authorization": "s3cret"}, {"Authorization": "Bearer s3cre"}):
            res = httpx.get(s.url + "/v1/models", headers=headers)
            assert res.status_code == 401 and res.json()["error"]["code"] == "invalid_api_key"
            assert res.headers["www-authenticate"] == "Bearer"
        assert httpx.get(s.url + "/metrics").status_code == 401
        assert httpx.get(s.url + "/health").status_code == 200  # readiness needs no key
        out = client(s, "s3cret").completions.create(model="x", prompt="hi", max_tokens=2)
        assert out.usage.completion_tokens == 2


def post_in_thread(url: str, body: dict, results: list) -> threading.Thread:
    def go():
        try:
            results.append(httpx.post(url, json=body, timeout=20))
        except httpx.HTTPError as err:  # pragma: no cover - reported by the assertions
            results.append(err)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def test_a_full_queue_answers_503_with_retry_after_then_recovers():
    engine = fake_engine()
    gate = engine.target.gate
    with running_server(engine, max_queue=1) as s:
        gate.clear()  # the first request holds the worker
        results: list = []
        url = s.v1 + "/completions"
        first = post_in_thread(url, {"prompt": "a", "max_tokens": 3}, results)
        assert wait_until(lambda: s.worker.busy)
        second = post_in_thread(url, {"prompt": "b", "max_tokens": 3}, results)
        assert wait_until(lambda: s.worker.queue_depth == 1)
        full = httpx.post(url, json={"prompt": "c", "max_tokens": 3}, timeout=10)
        assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
        assert 1 <= int(full.headers["retry-after"]) <= 60
        with pytest.raises(openai.InternalServerError):  # the client's class for a 503
            client(s).completions.create(model="x", prompt="d", max_tokens=3)
        gate.set()
        first.join(20), second.join(20)
        assert [r.status_code for r in results] == [200, 200]
        assert httpx.post(url, json={"prompt": "e", "max_tokens": 3}, timeout=10).status_code == 200
        assert httpx.get(s.url + "/metrics?format=json").json()["requests"]["rejected"] == 2


def test_client_disconnect_mid_stream_stops_the_generation_at_once():
    engine = fake_engine(delay=0.01)
    with running_server(engine) as s:
        api = client(s)
        stream = api.completions.create(model="x", prompt="Once", max_tokens=100_000, stream=True)
        got = [next(iter(stream)) for _ in range(3)]
        assert all(c.choices[0].text for c in got[1:])
        stream.close()  # the client goes away mid-stream
        assert wait_until(lambda: not s.worker.busy, 2.0), "generation still running"
        snap = httpx.get(s.url + "/metrics?format=json").json()
        assert snap["generations"]["cancelled"] == 1 and snap["tokens"]["generated"] < 1000
        out = api.completions.create(model="x", prompt="Once", max_tokens=5, temperature=0)
        assert out.choices[0].finish_reason == "length" and len(out.choices[0].text) == 5


def test_client_disconnect_while_queued_or_waiting_cancels_its_job():
    engine = fake_engine()
    gate = engine.target.gate
    with running_server(engine, max_queue=2) as s:
        gate.clear()
        results: list = []
        holder = post_in_thread(s.v1 + "/completions", {"prompt": "a", "max_tokens": 2}, results)
        assert wait_until(lambda: s.worker.busy)
        with pytest.raises(httpx.ReadTimeout):  # queued, then the client gives up
            httpx.post(s.v1 + "/completions", json={"prompt": "b", "max_tokens": 2}, timeout=0.3)
        assert wait_until(lambda: s.worker.queue_depth == 0, 2.0)
        gate.set()
        holder.join(20)
        assert results[0].status_code == 200
        assert wait_until(lambda: not s.worker.busy)
        snap = httpx.get(s.url + "/metrics?format=json").json()
        assert snap["generations"] == {"completed": 1, "cancelled": 1, "failed": 0}


def test_stopping_the_server_ends_open_streams_promptly():
    engine = fake_engine(delay=0.01)
    events: list[str] = []
    done = threading.Event()
    with running_server(engine) as s:
        def listen():
            with httpx.stream("POST", s.v1 + "/completions", timeout=20,
                              json={"prompt": "x", "max_tokens": 100_000, "stream": True}) as res:
                events.extend(line for line in res.iter_lines() if line)
            done.set()

        threading.Thread(target=listen, daemon=True).start()
        assert wait_until(lambda: len(events) > 4)
        start = time.monotonic()
    assert done.wait(5) and time.monotonic() - start < 5
    assert events[-1] == "data: [DONE]"
    assert "shutting_down" in [e for e in events if e.startswith("data: {")][-1]


def test_a_lost_engine_ends_open_and_queued_requests_with_503_then_refuses_new_ones():
    # What `serve` does when its RPC worker dies: ggml's abort callback (or the --rpc-timeout
    # watchdog) runs the last words, then ends the process. Here only the last words run.
    from edgespec.runtime.rpc import last_words

    engine = fake_engine(delay=0.01)
    events: list[str] = []
    with running_server(engine) as s:
        def listen():
            with httpx.stream("POST", s.v1 + "/completions", timeout=20,
                              json={"prompt": "x", "max_tokens": 100_000, "stream": True}) as res:
                events.extend(line for line in res.iter_lines() if line)

        streaming = threading.Thread(target=listen, daemon=True)
        streaming.start()
        assert wait_until(lambda: len(events) > 4)
        results: list = []
        queued = post_in_thread(s.v1 + "/completions", {"prompt": "b", "max_tokens": 3}, results)
        assert wait_until(lambda: s.worker.queue_depth == 1)
        start = time.monotonic()
        last_words("RPC worker 10.0.0.9:50052: Remote RPC server crashed")
        assert time.monotonic() - start < 3  # the answers went out; the process may now end
        streaming.join(5), queued.join(5)
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == "backend_unavailable" and "10.0.0.9:50052" in error["message"]
        assert any('"text": "' in e and '"text": ""' not in e for e in events[:-2])  # text came first
        assert results[0].status_code == 503
        assert results[0].json()["error"]["code"] == "backend_unavailable"
        late = httpx.post(s.v1 + "/completions", json={"prompt": "c", "max_tokens": 2}, timeout=10)
        assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
