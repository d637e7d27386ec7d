"""Real llama.cpp on the tiny SmolLM2-135M model: fast end-to-end checks of the engine and CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams
from edgespec.errors import ContextOverflowError
from edgespec.runtime.backend import LlamaBackend, ModelOptions
from edgespec.runtime.engine import Engine

from .real_util import GREEDY, ids

pytestmark = pytest.mark.real

STORY = "Once upon a time, in a small village by the sea, there lived"


def test_self_draft_accepts_every_token_even_when_sampling(tiny_engine):
    # Draft and target are the same model scoring the same tokens: with batch-consistent logits
    # q == p bit for bit, so min(1, p/q) == 1 and every draft must pass, also at temperature 1.
    # A sampled story may end early (where depends on the seed and the CPU's kernels), so
    # seeds are added until at least 100 drafted tokens have been checked.
    for sampled in (False, True):
        drafted = 0
        for seed in range(20):
            params = SamplingParams(temperature=1.0, seed=seed) if sampled else GREEDY
            out = tiny_engine.complete(STORY, max_tokens=200, chat=False, draft_length=5,
                                       sampling=params)
            assert out.stats.accepted == out.stats.drafted, params
            drafted += out.stats.drafted
            if drafted > 100:
                break
        assert drafted > 100, sampled


def test_chat_template_from_gguf_is_applied(tiny_engine):
    target = tiny_engine.target
    tokens = tiny_engine.prompt_tokens("Hello there")
    [im_start] = target.tokenize("<|im_start|>", add_special=False)  # one special token
    [im_end] = target.tokenize("<|im_end|>", add_special=False)
    assert tokens.count(im_start) == 3 and tokens.count(im_end) == 2  # system, user, assistant
    text = b"".join(target.token_bytes(t) for t in tokens).decode()  # specials render empty
    assert "user\nHello there" in text and text.endswith("assistant\n")
    # raw mode: the text as is, special-looking text not parsed as special tokens
    raw = tiny_engine.prompt_tokens("<|im_start|>", chat=False)
    assert im_start not in raw


def test_chat_template_is_compiled_once(tiny_engine, monkeypatch):
    # Compiling a template costs milliseconds a request (~10 ms for the default target's), so
    # the backend keeps the compiled one; a later conversation must render as a fresh one would.
    from llama_cpp import llama_chat_format

    target = tiny_engine.target
    target.chat_prompt([{"role": "user", "content": "warm"}])
    built = []
    real = llama_chat_format.Jinja2ChatFormatter
    init = real.__init__
    monkeypatch.setattr(real, "__init__", lambda self, **kw: built.append(kw) or init(self, **kw))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    got = target.chat_prompt(messages)
    assert built == []
    monkeypatch.undo()
    fresh = real(template=target.metadata()["tokenizer.chat_template"],
                 eos_token=target.token_text(target.eos), bos_token=target.token_text(target.bos))
    assert got == fresh(messages=messages).prompt
    assert got.count("<|im_start|>") == 5 and "Bye" in got


def test_long_generation_does_not_drift(tiny_engine):
    """Fill a 1024-token context: every drafter gives the same greedy text to the last token."""
    with Engine.load(pair="tiny", drafter="hybrid", n_ctx=1024, progress=False) as engine:
        outs = {d: engine.complete(STORY, max_tokens=5000, chat=False, drafter=d, sampling=GREEDY)
                for d in ("none", "model", "hybrid")}
    n_prompt = outs["none"].stats.prompt_tokens
    for name, out in outs.items():
        assert out.finish_reason == "context", name
        assert out.stats.generated == 1024 - n_prompt, name
        assert ids(out) == ids(outs["none"]), name


def test_kv_cache_matches_a_fresh_decode_after_sampled_run_with_rollbacks(tiny_engine):
    """After ~600 sampled tokens with many rejections, the engine's cache must hold exactly the
    committed text: the next-token logits equal those of a fresh context fed the same tokens."""
    engine = tiny_engine
    # Lookup's one-hot drafts are often rejected at temperature 1 (the self-draft never is).
    song = "la la la, the sun is up, la la la, the sea is blue, " * 4
    out = engine.complete(song, max_tokens=600, chat=False, drafter="lookup", draft_length=4,
                          sampling=SamplingParams(temperature=1.0, seed=11))
    assert out.stats.drafted > 100 and out.stats.accepted_hist[0] > 20  # many rollbacks
    assert out.stats.accepted > 20
    prompt = engine.prompt_tokens(song, chat=False)
    committed = prompt + ids(out)
    engine.target.sync(committed[:-1])
    assert engine.target.tokens == committed[:-1]
    ours = engine.target.decode(committed[-1:], 1)[0].copy()  # rows are valid until the next decode

    fresh = LlamaBackend(ModelOptions(path=engine.target.path, n_threads=engine.target.options.n_threads,
                                      n_ctx=engine.target.n_ctx))
    try:
        fresh.decode(prompt[:-1], 0)  # same prefill as the engine did
        theirs = fresh.decode(committed[len(prompt) - 1:], len(committed) - len(prompt) + 1)[-1]
        theirs = theirs.copy()  # (and only while the backend is open)
    finally:
        fresh.close()
    np.testing.assert_array_equal(ours, theirs)


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("edgespec")
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_cli_complete_streams_text_and_stats():
    res = run_cli("complete", "What is the capital of France?", "--pair", "tiny", "-n", "24", "--stats")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert "tok/s" in res.stderr and "accepted" in res.stderr
    assert "x vs target-only (" in res.stderr  # the same-moment speedup, with its basis
    assert "Traceback" not in res.stderr


def test_cli_json_from_stdin():
    res = run_cli("complete", "--pair", "tiny", "-n", "16", "--json", "--temperature", "0.7",
                  "--seed", "3", stdin="Tell me a joke.")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) == {"text", "finish_reason", "tokens", "stats"}
    assert data["finish_reason"] in ("stop", "length") and 0 < data["tokens"] <= 16
    for key in ("rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted",
                "accepted_hist", "tokens_per_second"):
        assert key in data["stats"]
    assert set(data["stats"]["time"]) >= {"drafting", "target", "sampling"}
    speedup = data["stats"]["speedup"]
    assert speedup["basis"] in ("measured", "curve") and speedup["samples"] >= 1
    assert speedup["ratio"] > 0 and speedup["target_only_tokens_per_second"] > 0


BUSY = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def test_plain_decoding_reads_1x_under_a_load_started_after_calibration():
    """The issue's case: the machine gets busier after the engine measured its costs. A figure
    against a start-up measurement moves with the load; the same-moment one reads plain
    decoding as what it is."""
    with Engine.load(pair="tiny", drafter="auto", n_ctx=1024, progress=False) as engine:
        busy = [subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=60)])
                for _ in range(os.cpu_count() or 2)]
        try:
            stats = engine.complete("Write a short story about a lighthouse.", drafter="none",
                                    max_tokens=48, sampling=GREEDY).stats
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
    speedup = stats.speedup
    assert stats.drafted == 0 and speedup.basis == "measured"
    assert abs(speedup.ratio - 1.0) <= 0.05


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--temperature", "-1"], 2, "temperature"),
        (["--top-p", "0"], 2, "top_p"),
        (["--drafter", "magic"], 2, "magic"),
        (["--target", "/no/such/model.gguf"], 1, "not found"),
        (["--target", str(Path(__file__).parent)], 1, "directory"),
        (["--ctx", "64"], 1, "context"),
    ],
)
def test_cli_user_errors_are_clear_and_traceback_free(args, code, message):
    prompt = "word " * 80  # longer than a 64-token context
    res = run_cli("complete", prompt, "--pair", "tiny", "-n", "4", *args)
    assert res.returncode == code, res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr


#: A libstdc++ function the CUDA load crash ran from the wrong copy (see edgespec/_native.py)
_CXX_PROBE = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>


@pytest.mark.parametrize("numpy_first", [False, True])
def test_cxx_runtime_is_global_before_llama_loads(numpy_first):
    """The CUDA crashes (issue 11: at load when NumPy came first, at exit in bench) were
    llama.cpp's libraries binding two copies of the C++ runtime. ``import edgespec`` makes
    ``libstdc++.so.6`` global before libllama loads, whatever NumPy's order: then a symbol looked
    up in the global scope resolves into libstdc++.so.6 (with NumPy first and no fix it is not
    found there at all). And a model loads and generates in that interpreter (on the CPU)."""
    from edgespec.models.resolve import resolve_model

    code = ("import sys, ctypes\n" + ("import numpy\n" if numpy_first else "") +
            "import edgespec\n"
            f"addr = ctypes.cast(ctypes.CDLL(None).{_CXX_PROBE}, ctypes.c_void_p).value\n"
            "owner = [l.split()[-1] for l in open('/proc/self/maps')\n"
            "         if int(l.split('-')[0], 16) <= addr < int(l.split()[0].split('-')[1], 16)]\n"
            "maps = open('/proc/self/maps').read()\n"
            "print(edgespec.PRELOAD, owner[0].rsplit('/', 1)[-1].startswith('libstdc++.so.6'),\n"
            "      'libllama.so' in maps, '_multiarray_umath' in maps)\n"
            "from edgespec import Engine, SamplingParams\n"
            "with Engine.load(target=sys.argv[1], drafter='none', progress=False) as e:\n"
            "    print(e.complete('Hi', max_tokens=4, sampling=SamplingParams(temperature=0))"
            ".stats.generated)\n")
    path = str(resolve_model("smollm2-135m-instruct-q4_1"))
    res = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    how, in_libstdcxx, llama_mapped, numpy_mapped, generated = res.stdout.split()
    assert how == "loaded"
    assert in_libstdcxx == "True"
    assert llama_mapped == "True" and numpy_mapped == str(numpy_first)
    assert generated == "4"


def test_numpy_first_still_gives_one_llama_cpp_bound_only_to_itself(tmp_path):
    """The structure the CUDA load crash (issue 11) may hinge on, checked on the CPU: with NumPy
    imported first, every llama.cpp library is mapped from one file only (the wheel's
    ``libggml.so`` beside ``libggml.so.0`` would be a second ggml with its own backend
    registry; the sampler's exp kernel comes from ``libggml-cpu.so.0``), and no symbol of llama.cpp's libraries resolves into NumPy's files."""
    from edgespec.models.resolve import resolve_model

    code = ("import sys, numpy, edgespec\n"
            "from edgespec import Engine, SamplingParams\n"
            "from edgespec.runtime import rpc\n"
            "rpc.local_devices()\n"  # edgespec's own ctypes routes to ggml
            "assert edgespec._native.exp_kernel() is not None\n"
            "with Engine.load(target=sys.argv[1], drafter='none', progress=False) as e:\n"
            "    e.complete('Hi', max_tokens=2, sampling=SamplingParams(temperature=0))\n"
            "    e.complete('Hi', max_tokens=2, sampling=SamplingParams(temperature=1))\n"
            "print(open('/proc/self/maps').read())\n")
    path = str(resolve_model("smollm2-135m-instruct-q4_1"))
    env = dict(os.environ, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(tmp_path / "ld"))
    res = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    files: dict[str, set[str]] = {}
    for line in res.stdout.splitlines():
        name = line.rsplit("/", 1)[-1] if "/llama_cpp/lib/" in line else ""
        if name.startswith(("libllama", "libggml", "libmtmd")):
            files.setdefault(name.split(".so")[0], set()).add(name)
    assert {"libllama", "libggml", "libggml-base", "libggml-cpu"} <= set(files)
    assert all(len(names) == 1 for names in files.values()), files
    (log,) = tmp_path.glob("ld.*")
    crossing = [ln for ln in log.read_text(errors="replace").splitlines()
                if "binding file" in ln and "/llama_cpp/lib/" in ln.split(" to ")[0]
                and "numpy" in ln.split(" to ")[-1]]
    assert not crossing, crossing[:5]


def _cache(be, prefix):
    """Bring ``be``'s KV cache to ``prefix`` (no rows read)."""
    be.decode(prefix[be.sync(prefix):], 0)


def test_backend_picks_equal_the_argmax_of_the_rows(tiny_engine):
    # decode_argmax (llama.cpp's greedy sampler in the graph) against NumPy's argmax of the
    # rows of the same batch, switching between the two modes both ways: 7 rows span three
    # batch-consistent pieces, so the picks of every piece are read.
    be = tiny_engine.target
    ctx = be.tokenize(STORY)
    batch = ctx[-7:]

    assert be.backend_argmax
    for _ in range(2):
        _cache(be, ctx[:-7])
        picks = be.decode_argmax(batch, 7)
        assert be._argmax_on  # the backend sampler answered, not the NumPy fallback
        _cache(be, ctx[:-7])
        rows = be.decode(batch, 7)
        assert not be._argmax_on
        assert picks == np.argmax(rows, axis=1).tolist()
    _cache(be, ctx[:-1])
    assert be.decode_argmax(ctx[-1:], 0) == [] and not be._argmax_on  # no rows: no switch
    assert be.tokens == ctx


def test_one_call_picks_equal_the_general_paths(tiny_engine, monkeypatch):
    """A plain step's or a short round's picks (one llama_decode, the batch filled token by
    token: ``_decode_picks``) are the general path's and NumPy's; a call past the context
    raises before it touches the cache; a prefill between them resets the output flags."""
    be = tiny_engine.target
    ctx = be.tokenize(STORY)
    one_call = []
    lean = be._decode_picks
    monkeypatch.setattr(be, "_decode_picks", lambda t, n: one_call.append(n) or lean(t, n))
    for n in range(1, be._picks_per_call + 1):
        _cache(be, ctx[:-n])
        picks = be.decode_argmax(ctx[-n:], n)
        assert one_call[-1:] == [n]
        _cache(be, ctx[:-n])
        general = be._decode(ctx[-n:], n, "argmax").tolist()
        _cache(be, ctx[:-n])
        assert picks == general == np.argmax(be.decode(ctx[-n:], n), axis=1).tolist()
        assert be.tokens == ctx
    _cache(be, ctx[:-2])
    assert be.decode_argmax(ctx[-2:], 2) == general[-2:]  # (through the public call)
    _cache(be, ctx)
    monkeypatch.setattr(be, "n_ctx", len(ctx) + 1)  # room for one more token: not two
    with pytest.raises(ContextOverflowError):
        be.decode_argmax(ctx[-2:], 2)
    assert be.tokens == ctx
    assert len(be.decode_argmax(ctx[-1:], 1)) == 1 and be.tokens == ctx + ctx[-1:]  # (fits)


def test_an_interrupt_in_a_one_call_decode_forgets_the_cache(tiny_engine, monkeypatch):
    """Ctrl-C just after llama.cpp took a plain step's token, before the backend recorded it:
    the cache holds a token its record lacks, so it is forgotten whole (never silently
    wrong), and the next call decodes the prompt again to the same picks."""
    import llama_cpp

    be = tiny_engine.target
    ctx = be.tokenize(STORY)
    _cache(be, ctx[:-1])
    expected = be.decode_argmax(ctx[-1:], 1)
    _cache(be, ctx[:-1])
    real = llama_cpp.llama_decode

    def interrupted(c, batch):
        real(c, batch)
        raise KeyboardInterrupt

    monkeypatch.setattr(llama_cpp, "llama_decode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        be.decode_argmax(ctx[-1:], 1)
    monkeypatch.setattr(llama_cpp, "llama_decode", real)
    assert be.tokens == []
    _cache(be, ctx[:-1])
    assert be.decode_argmax(ctx[-1:], 1) == expected


def test_a_started_decode_finishes_to_what_decode_gives(tiny_engine, monkeypatch):
    """start_decode + finish_decode, as the loop runs them on a GPU, against decode and
    decode_argmax of the same calls, bit for bit: launched (one llama_decode call: picks, or
    rows with the batch-dependent kernels), or computed at once where one call cannot take
    them (the CPU's exact pieces). In between, the record of the cache holds the tokens, and
    any other call waits for the device first. An interrupt just after the launch forgets
    the cache, as a one-call decode does."""
    import llama_cpp

    path = tiny_engine.target.path
    fast = LlamaBackend(ModelOptions(path=path, n_ctx=256, n_threads=2, batch_consistent=False))
    wide = LlamaBackend(ModelOptions(path=path, n_ctx=256, n_threads=2, fixed_width=8))
    try:
        for be in (tiny_engine.target, fast, wide):
            ctx = be.tokenize(STORY)
            for n, picks in ((1, True), (3, True), (7, True), (1, False), (5, False)):
                _cache(be, ctx[:-n])
                want = be.decode_argmax(ctx[-n:], n) if picks else be.decode(ctx[-n:], n).copy()
                _cache(be, ctx[:-n])
                be.start_decode(ctx[-n:], n, picks=picks)
                launched = be._launched is not None
                # the exact pieces launch what one call takes (picks of up to 3); the others all
                assert launched == (be is not tiny_engine.target or picks and n <= 3)
                assert be.tokens == ctx and be._in_flight == launched
                got = be.finish_decode()
                assert not be._in_flight
                if picks:
                    assert got == want
                else:
                    assert np.array_equal(got, want)
            _cache(be, ctx[:-2])
            be.start_decode(ctx[-2:], 2, picks=True)
            assert be.sync(ctx[:-1]) == len(ctx) - 1 and not be._in_flight  # waited, then cut
            # the next call sees the started one's tokens and nothing else (no pads)
            _cache(be, ctx[:-2])
            be.start_decode(ctx[-2:], 2)
            be.finish_decode()
            after = be.decode(ctx[:1], 1).copy()
            be.reset()
            _cache(be, ctx)
            assert np.array_equal(be.decode(ctx[:1], 1), after)
        be = fast
        ctx = be.tokenize(STORY)
        real = llama_cpp.llama_decode

        def interrupted(c, batch):
            real(c, batch)
            raise KeyboardInterrupt

        _cache(be, ctx[:-1])
        monkeypatch.setattr(llama_cpp, "llama_decode", interrupted)
        with pytest.raises(KeyboardInterrupt):
            be.start_decode(ctx[-1:], 1, picks=True)
        monkeypatch.setattr(llama_cpp, "llama_decode", real)
        assert be.tokens == [] and not be._in_flight
        with pytest.raises(RuntimeError):
            be.finish_decode()
    finally:
        fast.close()
        wide.close()


@pytest.mark.parametrize("drafter", ["none", "lookup", "model"])
def test_rounds_launched_ahead_on_a_real_model_give_the_same_tokens(tiny_engine, monkeypatch,
                                                                    drafter):
    """The target made asynchronous (as on a GPU; here its decode is synchronous, so only the
    order changes): the same tokens, greedy and sampled, and a stream closed while a round is
    in flight leaves the engine ready for the next one."""
    played = []

    def run(**kw):
        out = tiny_engine.complete(STORY, max_tokens=60, chat=False, drafter=drafter,
                                   draft_length=3, **kw)
        played.append(out.stats.rounds)
        return [t.id for t in out.tokens]

    cases = (dict(sampling=GREEDY), dict(sampling=SamplingParams(temperature=0.8, seed=5)),
             dict(sampling=GREEDY, stop="the"))
    want = [run(**kw) for kw in cases]
    monkeypatch.setattr(tiny_engine.target, "asynchronous", True)
    started = []
    real_start = tiny_engine.target.start_decode
    monkeypatch.setattr(tiny_engine.target, "start_decode",
                        lambda *a, **k: started.append(1) or real_start(*a, **k))
    del played[:]
    assert [run(**kw) for kw in cases] == want
    assert len(started) >= sum(played)  # every round's call was started (and some not read)
    gen = tiny_engine.stream(STORY, max_tokens=60, chat=False, drafter=drafter, sampling=GREEDY)
    next(gen)
    assert tiny_engine.target._launched is not None or tiny_engine.target._ready is not None
    gen.close()
    assert not tiny_engine.target._in_flight
    assert run(sampling=GREEDY) == want[0]


def test_rounds_launched_ahead_at_a_fixed_width_give_the_same_tokens(tiny_engine):
    """The exact mode's padded calls launched ahead (pads out of the cache's cells while the
    call runs): the same tokens as in order, greedy and sampled, with lookup drafts."""
    be = LlamaBackend(ModelOptions(path=tiny_engine.target.path, n_ctx=512, n_threads=2,
                                   fixed_width=8))
    engine = Engine(be, drafter="lookup")
    try:
        def run(params):
            out = engine.complete(STORY, max_tokens=60, chat=False, sampling=params)
            return [t.id for t in out.tokens]

        cases = (GREEDY, SamplingParams(temperature=0.8, seed=5))
        want = [run(p) for p in cases]
        be.asynchronous = True
        launched = []
        real_start = be.start_decode

        def start(*a, **k):
            real_start(*a, **k)
            launched.append(be._launched is not None)

        be.start_decode = start
        assert [run(p) for p in cases] == want
        assert len(launched) > 40 and all(launched)
    finally:
        engine.close()


def test_backend_picks_without_backend_sampling_are_numpys(tiny_engine):
    path = tiny_engine.target.path
    be = LlamaBackend(ModelOptions(path=path, n_ctx=256, n_threads=2, backend_sampling=False))
    try:
        ctx = be.tokenize(STORY)
        picks = be.decode_argmax(ctx, 4)
        assert not be._argmax_on and not be.backend_argmax
        be.sync([])
        assert picks == np.argmax(be.decode(ctx, 4), axis=1).tolist()
    finally:
        be.close()


def test_a_context_that_cannot_run_the_sampler_falls_back_to_numpy(tiny_engine, monkeypatch):
    # llama.cpp refuses a backend sampler on some contexts (split mode "tensor"): the picks
    # then come from NumPy, and stay right.
    import llama_cpp

    real = llama_cpp.llama_set_sampler
    monkeypatch.setattr(llama_cpp, "llama_set_sampler",
                        lambda ctx, seq, smpl: False if smpl is not None else real(ctx, seq, smpl))
    be = LlamaBackend(ModelOptions(path=tiny_engine.target.path, n_ctx=256, n_threads=2))
    try:
        ctx = be.tokenize(STORY)
        picks = be.decode_argmax(ctx, 4)
        assert not be.backend_argmax and not be._argmax_on
        be.sync([])
        assert picks == np.argmax(be.decode(ctx, 4), axis=1).tolist()
    finally:
        be.close()


def _host_window(rows: np.ndarray, w: int) -> list[dict[int, float]]:
    """Each row's w largest logits, by id (the rows of these tests have no tie at the edge)."""
    out = []
    for row in rows:
        ids = np.argsort(-row, kind="stable")[:w]
        assert row[ids[-1]] > np.sort(row)[row.size - w - 1], "a tie at the window's edge"
        out.append({int(i): float(row[i]) for i in ids})
    return out


def test_backend_window_equals_the_rows_largest_logits(tiny_engine):
    # decode_window (llama.cpp's top-k sampler in the graph: the draft window on a GPU) against
    # the largest logits of decode's rows for the same batch, switching between window, rows
    # and picks both ways; 5 rows span two batch-consistent pieces.
    be = tiny_engine.target
    ctx = be.tokenize(STORY)
    batch = ctx[-5:]

    for w in (64, 7):
        _cache(be, ctx[:-5])
        ids, logits = be.decode_window(batch, 5, w)
        assert be._attached == w  # the backend sampler answered, not the NumPy fallback
        assert ids.shape == logits.shape == (5, w)
        _cache(be, ctx[:-5])
        rows = be.decode(batch, 5)
        assert be._attached is None
        want = _host_window(rows, w)
        got = [dict(zip(i.tolist(), v.tolist())) for i, v in zip(ids, logits)]
        assert got == want
        _cache(be, ctx[:-5])
        picks = be.decode_argmax(batch, 5)
        assert picks == np.argmax(rows, axis=1).tolist()
    assert be.tokens == ctx


def test_backend_window_without_backend_sampling_is_numpys(tiny_engine):
    be = LlamaBackend(ModelOptions(path=tiny_engine.target.path, n_ctx=256, n_threads=2,
                                   backend_sampling=False))
    try:
        assert not be.device_window  # (nor on this CPU with it: ggml's top-k costs more there)
        ctx = be.tokenize(STORY)
        ids, logits = be.decode_window(ctx, 3, 16)
        assert be._attached is None
        be.sync([])
        want = _host_window(be.decode(ctx, 3), 16)
        assert [dict(zip(i.tolist(), v.tolist())) for i, v in zip(ids, logits)] == want
    finally:
        be.close()


def test_drafts_from_the_device_window_equal_the_host_windows(tiny_engine, monkeypatch):
    # The model drafter forced onto the device window (as on a GPU) proposes what the host
    # window proposes, with the same draws: one q per token, from 64 logits each.
    from edgespec.core.sampling import SamplingParams, make_rng
    from edgespec.runtime.drafters import ModelDrafter

    be = tiny_engine.draft or tiny_engine.target
    ctx = be.tokenize(STORY)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    drafts = {}
    for on_device in (False, True):
        monkeypatch.setattr(be, "device_window", on_device)
        be.sync([])
        drafts[on_device] = ModelDrafter(be, be.n_vocab, 64).propose(ctx, 6, params, make_rng(5))
    assert be._attached == 64
    assert drafts[True].tokens == drafts[False].tokens and len(drafts[True].tokens) == 6
    for a, b in zip(drafts[True].q, drafts[False].q):
        np.testing.assert_allclose(a.dense(), b.dense(), rtol=1e-12, atol=0)


def test_a_self_draft_has_no_draft_window(tiny_engine):
    # (the tiny pair drafts for itself: q must stay the target's own p, bit for bit)
    assert tiny_engine.draft_window == 0


def _most_rounds(alpha: float, k: int, n: int, delta: float = 1e-6) -> int:
    """Rounds that emitting ``n`` tokens with ``k`` drafts a round exceeds with probability
    under ``delta`` when every draft passes with probability at least ``alpha`` given what
    came before. Such a run's tokens dominate a sum of independent rounds of Y = 1 + A, A a
    geometric run of passes cut at k (P(A = j) = alpha^j (1 - alpha), P(A = k) = alpha^k),
    whose distribution is convolved here exactly. Rounds drafting fewer than k (the
    budget's last tokens) only come once n - k tokens are out, and at most k more follow."""
    y = np.array([alpha ** j * (1 - alpha) for j in range(k)] + [alpha ** k])
    total = np.zeros(n - k)  # P(sum of r rounds' tokens = s) for s < n - k (the rest: done)
    total[0] = 1.0
    r = 0
    while total.sum() > delta:
        r += 1
        total = np.convolve(total, np.concatenate(([0.0], y)))[: n - k]
    return r + k


def test_recorded_rows_pair_each_target_row_with_the_drafts(tiny_engine, tmp_path):
    # bench --overhead --recorded: rows of the real model at positions of its own text. The
    # tiny pair drafts for itself, so each draft row must equal its target row bit for bit,
    # and the bench's draft model on them is accepted as often as those rows allow: a draft's
    # window (its 64 largest logits at most, none under 1e-4 of its top one) leaves out some
    # of p's mass, so a draft from row r passes with sum(min(p, q)), computed below (0.89 to
    # 1.0 for these rows on this project's CPUs: flat rows at T 0.8 lose the most)
    from edgespec.bench.overhead import (SAMPLINGS, load_pools, make_prompt, measure,
                                         record_pools, save_pools)
    from edgespec.bench.prompts import load_prompts
    from edgespec.config import DRAFT_WINDOW
    from edgespec.core.sampling import distribution, draft_distribution

    target, draft = record_pools(tiny_engine, load_prompts()[:2], n_rows=12)
    assert target.shape == draft.shape == (12, tiny_engine.target.n_vocab)
    assert target.dtype == np.float32 and np.isfinite(target).all()
    np.testing.assert_array_equal(target, draft)
    assert len({row.tobytes() for row in target}) == 12  # twelve positions, not one
    save_pools(tmp_path / "rows.npz", target, draft)
    pools = load_pools(tmp_path / "rows.npz")
    r = measure("model", 4, "t0.8", pools, make_prompt(pools[2]), 96)
    params = SAMPLINGS["t0.8"]
    alpha = min(np.minimum(distribution(p, params).dense(),
                           draft_distribution(p, params, window=DRAFT_WINDOW).dense()).sum()
                for p in target)
    assert r.tokens == 96 and 96 / 5 <= r.rounds <= _most_rounds(alpha, 4, 96)
