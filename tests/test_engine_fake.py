"""Engine over scripted fakes: stop conditions, errors, reentrancy, stats, provenance, UTF-8.

The target follows a script (tests/fakes.Scripted: a large logit bonus on script[i] at
generated position i, a random whole-prefix table after it, with BOS/EOG banned there), so greedy
text is known in advance. Draft models are the target's own table ("same": every draft
accepted), a script with typos (rejections at known positions) or a perturbed table.
"""

from __future__ import annotations

import json

import pytest

from edgespec import config
from edgespec.core.rejection import Source
from edgespec.core.sampling import SamplingParams
from edgespec.errors import ConfigError, ContextOverflowError
from edgespec.runtime.engine import Completion, Engine, EngineBusyError

from .fakes import AheadLM, Clock, FakeLM, Perturbed, Scripted, Table, TimedLM, use_clock

BOS, EOG = 0, 1
VOCAB = [b"<s>", b"</s>", b"a", b"b", b"c", b" ", b"h", b"e", b"l", b"o", b"w", b"r", b"d", b"lo",
         b"\n", b"\xc3", b"\xa9", b"\xe2", b"\x82\xac", b"\xf0\x9f", b"\x98\x80", b"!"]
V = len(VOCAB)
PROMPT = "hi"
GREEDY = SamplingParams(temperature=0)


def ids(*pieces) -> list[int]:
    return [VOCAB.index(p if isinstance(p, bytes) else p.encode()) for p in pieces]


HELLO = ids("h", "e", "l", "lo", " ", "w", "o", "r", "l", "d", "!")  # "hello world!"


def prompt_len(prompt=PROMPT) -> int:
    return len(FakeLM(Table(V), vocab=VOCAB, bos=BOS, eog=[EOG]).tokenize(prompt))


def fake(table, n_ctx) -> FakeLM:
    return FakeLM(table, n_ctx=n_ctx, vocab=VOCAB, eog=[EOG], bos=BOS)


def build(script=(), *, draft="same", typos=None, drafter="model", n_ctx=128, k=4, seed=0,
          prompt=PROMPT, ahead=False, timed=None) -> Engine:
    """An engine whose greedy target text is ``script`` (then free text without EOG).

    ``draft``: "same", "typos" (the script with ``typos`` {position: token} changed),
    "perturbed", or None (no draft model). ``ahead``: the target's decodes are asynchronous
    (:class:`~tests.fakes.AheadLM`), as on a GPU. ``timed``: (clock, the target's
    :class:`~tests.fakes.TimedLM` arguments, the draft's): both models' calls take time on
    that fake clock, which is the engine's too.
    """
    start = prompt_len(prompt)
    base = Table(V, seed, banned=[BOS, EOG])
    table = Scripted(base, script, start)
    if timed is not None:
        clock, target_kw, draft_kw = timed
        target = TimedLM(table, clock, **target_kw, n_ctx=n_ctx, vocab=VOCAB, eog=[EOG], bos=BOS)

        def model(table, n_ctx):
            return TimedLM(table, clock, **draft_kw, n_ctx=n_ctx, vocab=VOCAB, eog=[EOG], bos=BOS)
    else:
        target = (AheadLM(table, n_ctx=n_ctx, vocab=VOCAB, eog=[EOG], bos=BOS) if ahead
                  else fake(table, n_ctx))
        model = fake
    if draft is None:
        dm = None
    elif draft == "same":
        dm = model(table, n_ctx)
    elif draft == "typos":
        wrong = list(script)
        for i, t in (typos or {}).items():
            wrong[i] = t
        dm = model(Scripted(base, wrong, start), n_ctx)
    elif draft == "perturbed":
        dm = model(Perturbed(table, seed, 2.0), n_ctx)
    else:
        raise ValueError(draft)
    return Engine(target, dm, drafter=drafter, draft_length=k,
                  clock=timed[0] if timed is not None else None)


def complete(engine, prompt=PROMPT, **kw) -> Completion:
    kw.setdefault("chat", False)
    kw.setdefault("sampling", GREEDY)
    return engine.complete(prompt, **kw)


def stream(engine, prompt=PROMPT, **kw):
    kw.setdefault("chat", False)
    kw.setdefault("sampling", GREEDY)
    return engine.stream(prompt, **kw)


DRAFTERS = {  # name -> build() arguments
    "none": dict(drafter="none", draft=None),
    "lookup": dict(drafter="lookup", draft=None),
    "model-same": dict(drafter="model", draft="same"),
    "model-perturbed": dict(drafter="model", draft="perturbed"),
    "hybrid": dict(drafter="hybrid", draft="perturbed"),
}


# ---- stop conditions ---------------------------------------------------------------------------


@pytest.mark.parametrize("setup", DRAFTERS)
@pytest.mark.parametrize("k", [1, 4])
def test_stops_on_eog_without_emitting_it(setup, k):
    # EOG in the middle of what a k = 4 round drafts: the tokens after it are not emitted
    script = ids("h", "e", "l") + [EOG] + ids("a", "b", "c")
    out = complete(build(script, k=k, **DRAFTERS[setup]))
    assert (out.text, out.finish_reason) == ("hel", "stop")
    assert [t.id for t in out.tokens] == script[:3]
    assert out.stats.generated == 3


@pytest.mark.parametrize("setup", ["none", "model-same"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_stop_string_split_across_tokens_and_rounds(setup, k):
    # "lo w" spans the tokens "lo", " ", "w": with drafter none (or k = 1 with every draft
    # accepted: 2 tokens a round) it spans rounds too.
    engine = build(HELLO, k=k, **DRAFTERS[setup])
    chunks = list(stream(engine, stop=["lo w"]))
    assert "".join(c.text for c in chunks) == "hel"
    assert chunks[-1].finish_reason == "stop"
    assert all(c.finish_reason is None for c in chunks[:-1])
    # the tokens up to the one completing the stop string are counted, none after it
    assert chunks[-1].stats.generated == 6 == sum(len(c.tokens) for c in chunks)


def test_earliest_stop_string_wins_and_text_before_it_in_the_same_token_is_kept():
    out = complete(build(HELLO), stop=["world", "o w", "zzz"])
    assert (out.text, out.finish_reason) == ("hell", "stop")


@pytest.mark.parametrize("end", ["eog", "length", "context"])
def test_held_back_stop_prefix_is_released_when_generation_ends(end):
    # "lo" could start the stop string "lo!" and is held back; when generation ends for
    # another reason it is real output and must appear.
    script = ids("h", "e", "lo") + ([EOG] if end == "eog" else [])
    n_ctx = prompt_len() + 3 if end == "context" else 128
    engine = build(script, drafter="none", draft=None, n_ctx=n_ctx)
    out = complete(engine, stop=["lo!"], max_tokens=3 if end == "length" else 50)
    assert out.text == "helo"
    assert out.finish_reason == {"eog": "stop", "length": "length", "context": "context"}[end]


@pytest.mark.parametrize("setup", ["none", "lookup", "model-same", "model-perturbed", "hybrid"])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 7, 12, 30])
def test_max_tokens_is_exact(setup, max_tokens):
    out = complete(build(**DRAFTERS[setup]), max_tokens=max_tokens)
    assert out.finish_reason == "length"
    assert out.stats.generated == len(out.tokens) == max_tokens
    assert out.text == "".join(t.text for t in out.tokens)
    # no round drafted past the budget: every emitted token was delivered
    assert out.stats.accepted + out.stats.rounds == max_tokens


@pytest.mark.parametrize("setup", DRAFTERS)
def test_context_full(setup):
    n_ctx = 24
    engine = build(n_ctx=n_ctx, **DRAFTERS[setup])
    out = complete(engine, max_tokens=1000)
    assert out.finish_reason == "context"
    # the whole context is used, whatever the drafter (see test_loop.py)
    assert out.stats.generated == n_ctx - prompt_len()
    assert max(c.pos + len(c.tokens) for c in engine.target.calls) <= n_ctx


# ---- errors before any work --------------------------------------------------------------------


def test_prompt_too_long_raises_before_any_decode():
    engine = build(n_ctx=16)
    long_prompt = "x" * 15  # BOS + 15 = 16 tokens: no room for an answer
    gen = stream(engine, long_prompt)
    with pytest.raises(ContextOverflowError, match="16 tokens"):
        next(gen)
    assert engine.target.calls == [] and engine.target.syncs == []
    assert engine.draft.calls == [] and engine.draft.syncs == []
    # the longest prompt that fits (n_ctx - 1 tokens) still gets an answer
    out = complete(engine, "x" * 14)
    assert out.finish_reason == "context" and out.stats.generated >= 1


@pytest.mark.parametrize("prompt,chat", [("", False), ("  \n", False), ("", True), ([], True)])
def test_empty_prompt_is_a_config_error(prompt, chat):
    engine = build()
    with pytest.raises(ConfigError):
        next(engine.stream(prompt, chat=chat))
    assert engine.target.calls == []


@pytest.mark.parametrize("kwargs", [dict(draft_length=-1), dict(draft_length=config.MAX_DRAFT_LENGTH + 1),
                                    dict(draft_length=True), dict(draft_length=2.0),
                                    dict(drafter="nope"), dict(drafter="model", draft=None),
                                    dict(drafter="hybrid", draft=None)])
def test_bad_engine_settings_are_config_errors(kwargs):
    kwargs = {"drafter": "model", "draft": "same", **kwargs}
    k = kwargs.pop("draft_length", 4)
    with pytest.raises(ConfigError):
        build(k=k, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(draft_length=-1), dict(draft_length=65), dict(drafter="nope"),
                                    dict(max_tokens=0), dict(max_tokens=1.5)])
def test_bad_call_settings_are_config_errors(kwargs):
    engine = build()
    with pytest.raises(ConfigError):
        next(stream(engine, **kwargs))
    assert engine.target.calls == []
    assert complete(engine, max_tokens=3).stats.generated == 3  # the engine is still fine


@pytest.mark.parametrize("window", [-1, True, 2.5, "64"])
def test_a_bad_draft_window_is_a_config_error_before_any_model_loads(window):
    e = build(draft="perturbed")
    with pytest.raises(ConfigError, match="draft_window"):
        Engine(e.target, e.draft, drafter="model", draft_window=window)
    with pytest.raises(ConfigError, match="draft_window"):  # not a missing-file ModelError
        Engine.load("/nonexistent/model.gguf", draft_window=window, download=False, progress=False)


def test_the_engines_draft_window_reaches_the_draft_model(monkeypatch):
    from edgespec.runtime.sources import model as model_source

    windows = []
    real = model_source.draft_distribution

    def recording(logits, params, n_vocab=None, window=0):
        windows.append(window)
        return real(logits, params, n_vocab, window)

    monkeypatch.setattr(model_source, "draft_distribution", recording)
    e = build(draft="perturbed")
    engine = Engine(e.target, e.draft, drafter="model", draft_length=4, draft_window=3)
    out = complete(engine, max_tokens=12, sampling=SamplingParams(temperature=1.0, seed=3))
    assert out.stats.generated == 12 and out.stats.drafted > 0
    assert windows and set(windows) == {3}
    assert Engine(e.target, e.draft).draft_window == config.DRAFT_WINDOW


def test_the_draft_window_mode_says_where_the_window_is_taken():
    e = build(draft="perturbed")
    assert Engine(e.target, e.draft).draft_window_mode == "host"
    assert Engine(e.target, e.draft, draft_window=0).draft_window_mode == "off"
    assert Engine(e.target, None, drafter="lookup").draft_window_mode == "off"
    e.draft.device_window = True
    assert Engine(e.target, e.draft).draft_window_mode == "device"


def test_a_draft_that_is_the_targets_own_file_has_no_window(tmp_path):
    # (however the engine is made: its q must stay the target's p, bit for bit)
    e = build(draft="perturbed")
    e.target.path = tmp_path / "m.gguf"
    e.draft.path = tmp_path / "." / "m.gguf"
    assert Engine(e.target, e.draft, draft_window=16).draft_window == 0
    e.draft.path = tmp_path / "other.gguf"
    assert Engine(e.target, e.draft, draft_window=16).draft_window == 16


def test_model_drafter_on_an_engine_without_draft_is_a_config_error():
    engine = build(drafter="lookup", draft=None)
    with pytest.raises(ConfigError, match="draft model"):
        next(stream(engine, drafter="model"))


def test_draft_length_zero_is_plain_decoding():
    out = complete(build(HELLO), draft_length=0, max_tokens=11)
    assert out.text == "hello world!" and out.stats.drafted == 0
    assert {t.source for t in out.tokens} == {Source.TARGET}


@pytest.mark.parametrize("setup", ["model-perturbed", "hybrid"])
def test_the_draft_models_prompt_prefill_is_prefill_not_drafting(setup):
    engine = build(HELLO, **DRAFTERS[setup])
    gen = stream(engine, max_tokens=11)
    next(gen)
    first = engine.draft.calls[0]
    # The prompt (but its last token) went into the draft's cache before the first round, in
    # one call with no logits, like the target's own prefill.
    assert first.pos == 0 and first.n_logits == 0 and len(first.tokens) == prompt_len() - 1
    gen.close()


def test_auto_without_a_draft_model_runs_on_lookup_and_plain_steps():
    engine = build(HELLO * 3, draft=None, drafter="auto")
    out = complete(engine, max_tokens=30)
    assert out.text == complete(build(HELLO * 3, draft=None, drafter="none"), max_tokens=30).text
    assert set(out.stats.by_drafter) <= {"lookup", "none"}
    assert engine.costs is not None and engine.costs.draft_per_token is None


# ---- reentrancy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", ["model-perturbed", "hybrid", "lookup"])
def test_closing_the_stream_early_leaves_the_engine_usable(setup):
    engine = build(**DRAFTERS[setup])
    want = complete(build(**DRAFTERS[setup]), max_tokens=40)
    gen = stream(engine, max_tokens=40)
    first = next(gen)
    assert first.text and first.finish_reason is None
    gen.close()  # the cache now holds a half-finished generation's tokens and drafts
    again = complete(engine, max_tokens=40)
    assert again.text == want.text
    assert [t.id for t in again.tokens] == [t.id for t in want.tokens]
    assert again.stats.cached_prompt_tokens == prompt_len() - 1  # the prompt was reused


@pytest.mark.parametrize("setup", DRAFTERS)
def test_an_asynchronous_target_gives_the_same_text_and_every_end_waits_for_its_call(setup):
    """Rounds launched before the last is yielded (a GPU): the same tokens, and whatever ends
    the generation (EOG, a stop string, max_tokens, the caller), nothing is left in flight."""
    script = HELLO + ids("a", "b") + [EOG]
    sync, ahead = build(script, **DRAFTERS[setup]), build(script, ahead=True, **DRAFTERS[setup])
    for kw in (dict(), dict(max_tokens=5), dict(stop="wor"), dict(stop="!"),
               dict(sampling=SamplingParams(temperature=1.0, seed=3), max_tokens=30)):
        want, got = complete(sync, **kw), complete(ahead, **kw)
        assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
        assert [(t.id, t.source) for t in got.tokens] == [(t.id, t.source) for t in want.tokens]
        assert not ahead.target.in_flight
    gen = stream(ahead, max_tokens=40)
    next(gen)
    assert ahead.target.in_flight  # the next round's call runs while the caller has this one
    gen.close()
    assert not ahead.target.in_flight
    assert complete(ahead).text == complete(sync).text == "hello world!ab"


def test_an_exception_thrown_into_the_stream_leaves_the_engine_usable():
    engine = build(**DRAFTERS["model-perturbed"])
    want = complete(build(**DRAFTERS["model-perturbed"]), max_tokens=30)
    gen = stream(engine, max_tokens=30)
    next(gen)
    next(gen)
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)
    assert complete(engine, max_tokens=30).text == want.text


def test_second_stream_while_one_is_open_is_refused_and_the_first_continues():
    engine = build(**DRAFTERS["hybrid"])
    want = complete(build(**DRAFTERS["hybrid"]), max_tokens=40)
    first = stream(engine, max_tokens=40)
    chunks = [next(first)]
    n_calls = len(engine.target.calls), len(engine.target.syncs)
    with pytest.raises(EngineBusyError):
        next(stream(engine, "another prompt", max_tokens=40))
    with pytest.raises(EngineBusyError):
        complete(engine, max_tokens=5)
    assert (len(engine.target.calls), len(engine.target.syncs)) == n_calls  # nothing touched
    chunks += list(first)
    assert "".join(c.text for c in chunks) == want.text
    assert chunks[-1].finish_reason == "length"
    assert complete(engine, max_tokens=40).text == want.text  # and the lock was released


def test_seeded_sampling_is_reproducible_on_a_reused_engine():
    params = SamplingParams(temperature=1.0, seed=123)
    engine = build(**DRAFTERS["hybrid"])
    a = complete(engine, sampling=params, max_tokens=40)
    gen = stream(engine, sampling=params, max_tokens=40)
    next(gen)
    gen.close()
    b = complete(engine, sampling=params, max_tokens=40)
    c = complete(build(**DRAFTERS["hybrid"]), sampling=params, max_tokens=40)
    assert a.text == b.text == c.text
    assert a.stats.drafted and a.stats.accepted < a.stats.drafted


# ---- stats -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", DRAFTERS)
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0, top_p=0.9, seed=3)],
                         ids=["greedy", "sampled"])
def test_stats_invariants(setup, params):
    engine = build(**DRAFTERS[setup])
    chunks, delivered = [], 0
    for chunk in stream(engine, sampling=params, max_tokens=60, stop=["zzz"]):
        delivered += len(chunk.tokens)
        assert chunk.stats.generated == delivered  # live stats, updated as chunks stream
        chunks.append(chunk)
    s = chunks[-1].stats
    assert s.generated == sum(len(c.tokens) for c in chunks) == 60
    assert s.prompt_tokens == prompt_len() and s.cached_prompt_tokens == 0
    assert 0 <= s.accepted <= s.drafted
    assert sum(s.accepted_hist) == s.rounds
    assert sum(n * c for n, c in enumerate(s.accepted_hist)) == s.accepted
    assert sum(v.rounds for v in s.by_drafter.values()) == s.rounds
    assert sum(v.drafted for v in s.by_drafter.values()) == s.drafted
    assert sum(v.accepted for v in s.by_drafter.values()) == s.accepted
    assert s.acceptance_rate == (s.accepted / s.drafted if s.drafted else 0.0)
    assert s.mean_accepted == s.accepted / s.rounds
    assert s.rounds == len(engine.target.calls) - 1  # one target call per round, plus prefill
    assert s.time_total >= s.time_prefill >= 0
    assert min(s.time_drafting, s.time_target, s.time_sampling) >= 0
    assert s.time_drafting + s.time_target + s.time_sampling <= s.time_total
    if setup == "none":
        assert s.drafted == 0 and set(s.by_drafter) == {"none"}
    if setup == "hybrid":
        assert {"lookup", "model"} <= set(s.by_drafter)
    # a second run reuses the prompt's cache
    assert complete(engine, max_tokens=2).stats.cached_prompt_tokens == prompt_len() - 1


def test_completion_to_dict_names():
    out = complete(build(**DRAFTERS["hybrid"]), max_tokens=20)
    d = out.to_dict()
    assert set(d) == {"text", "finish_reason", "tokens", "stats"}
    assert (d["text"], d["finish_reason"], d["tokens"]) == (out.text, "length", 20)
    st = d["stats"]
    for name in ("rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted",
                 "accepted_hist", "tokens_per_second", "generated", "prompt_tokens", "by_drafter"):
        assert name in st
    assert {"drafting", "target", "sampling"} <= set(st["time"])
    assert (st["rounds"], st["drafted"], st["accepted"]) == (out.stats.rounds, out.stats.drafted,
                                                              out.stats.accepted)
    assert st["acceptance_rate"] == round(out.stats.accepted / out.stats.drafted, 4)
    assert st["accepted_hist"] == out.stats.accepted_hist
    json.dumps(d)  # JSON-ready


# ---- provenance ------------------------------------------------------------------------------------


def test_plain_decoding_is_all_target():
    out = complete(build(HELLO, drafter="none", draft=None), max_tokens=30)
    assert {t.source for t in out.tokens} == {Source.TARGET}


def test_draft_equal_to_target_gives_draft_and_bonus_only():
    k = 4
    out = complete(build(k=k), max_tokens=50)  # 10 rounds of k drafts + 1 bonus
    assert [t.source for t in out.tokens] == ([Source.DRAFT] * k + [Source.BONUS]) * 10


def test_corrections_land_exactly_on_the_drafts_typos():
    typos = {2: ids("a")[0], 9: ids("b")[0]}
    out = complete(build(HELLO, draft="typos", typos=typos, k=4), max_tokens=len(HELLO))
    assert out.text == "hello world!"
    corrected = [i for i, t in enumerate(out.tokens) if t.source == Source.CORRECTED]
    assert corrected == [2, 9]
    # rounds: 2 drafts + correction | 4 drafts + bonus | 2 drafts (budget) with the second
    # corrected | nothing left to draft: one plain target token
    D, B, C, T = Source.DRAFT, Source.BONUS, Source.CORRECTED, Source.TARGET
    assert [t.source for t in out.tokens] == [D, D, C, D, D, D, D, B, D, C, T]


def test_lookup_provenance():
    # "abcabc..." script: lookup has nothing to copy at first (TARGET), then copies (DRAFT,
    # BONUS); the script then changes, so a copied draft is rejected once (CORRECTED).
    script = ids(*"abcabcabcabcabc") + ids("h", "e", "l", "lo", "w", "o", "r", "d")
    out = complete(build(script, drafter="lookup", draft=None, k=4), max_tokens=len(script))
    sources = [t.source for t in out.tokens]
    assert [t.id for t in out.tokens] == script
    assert sources[:4] == [Source.TARGET] * 4  # no bigram recurs before "abca" + "b"
    assert {Source.DRAFT, Source.BONUS, Source.CORRECTED, Source.TARGET} == set(sources)
    assert sources[15] == Source.CORRECTED  # "h" replaces the copied "a"


# ---- UTF-8 ---------------------------------------------------------------------------------------

UTF8_SCRIPT = ids("a", b"\xc3", b"\xa9", "b", b"\xe2", b"\x82\xac", b"\xf0\x9f", b"\x98\x80", "c")


@pytest.mark.parametrize("setup,k", [("none", 4), ("model-same", 1), ("model-same", 2),
                                     ("model-same", 3), ("model-same", 4)])
def test_multibyte_characters_split_across_tokens(setup, k):
    engine = build(UTF8_SCRIPT + [EOG], k=k, **DRAFTERS[setup])
    chunks = list(stream(engine))
    assert "".join(c.text for c in chunks) == "aéb€😀c"
    assert all("\ufffd" not in c.text for c in chunks)
    texts = [t.text for c in chunks for t in c.tokens]
    # the token that completes a character carries it; the partial ones carry nothing
    assert texts == ["a", "", "é", "b", "", "€", "", "😀", "c"]


def test_multibyte_character_in_a_stop_string():
    out = complete(build(UTF8_SCRIPT), stop=["€"])
    assert (out.text, out.finish_reason) == ("aéb", "stop")


def test_length_cut_inside_a_character_shows_one_replacement_character():
    # Documented (TextStream.flush): incomplete bytes at the end become U+FFFD, not lost silently.
    out = complete(build(UTF8_SCRIPT), max_tokens=5)
    assert out.text == "aéb\ufffd"


# ---- prompts and lifecycle ------------------------------------------------------------------------


def test_chat_prompts_go_through_the_template():
    engine = build()
    t = engine.target
    want = t.tokenize(t.chat_prompt([{"role": "system", "content": "S"},
                                     {"role": "user", "content": "hi"}]))
    assert engine.prompt_tokens("hi", system="S") == want
    msgs = [{"role": "user", "content": "hi"}]
    assert engine.prompt_tokens(msgs) == t.tokenize(t.chat_prompt(msgs))
    assert engine.prompt_tokens("hi", chat=False) == t.tokenize("hi")
    out = engine.complete("hi", system="S", max_tokens=3, sampling=GREEDY)
    assert out.stats.prompt_tokens == len(want)


def test_close_frees_both_models():
    engine = build()
    with engine as e:
        complete(e, max_tokens=2)
    assert engine.target.closed and engine.draft.closed


def test_a_single_stop_string_passed_as_str():
    # Either fix passes: take the str as one stop string, or refuse it with a ConfigError.
    try:
        out = complete(build(HELLO), stop="wor")  # the text has an 'o' before 'wor'
    except ConfigError:
        return
    assert out.text == "hello "


def test_exact_asks_for_a_fixed_width_only_where_kernels_follow_the_batch(monkeypatch):
    """``exact``: on this CPU the pieces of 3 already are exact (no width: a plain step stays
    one token); with layers on a GPU, or on RPC workers (whose devices are not known here),
    the fixed width; a width the user named wins; fast kernels cannot be exact."""
    from edgespec.runtime import backend
    from edgespec.runtime.engine import exact_width

    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: False)
    assert exact_width(0, True, 0, ()) == 0
    assert exact_width(0, True, -1, ()) == 0  # nothing to offload to: the CPU runs it
    assert exact_width(0, True, 0, ("10.0.0.2:50052",)) == config.EXACT_FIXED_WIDTH
    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: True)
    assert exact_width(0, True, 0, ()) == 0
    assert exact_width(0, True, -1, ()) == config.EXACT_FIXED_WIDTH
    assert exact_width(0, True, 12, ()) == config.EXACT_FIXED_WIDTH
    assert exact_width(16, True, -1, ()) == 16
    with pytest.raises(ConfigError, match="contradict"):
        exact_width(0, False, -1, ())
    with pytest.raises(ConfigError, match="contradict"):  # before any model is looked for
        Engine.load("/nonexistent/model.gguf", exact=True, batch_consistent=False,
                    download=False, progress=False)


def _gpu_steady(w: int) -> float:  # (a call of a 1.5B target on a fast GPU: nearly flat)
    return 2.0e-3 + 0.05e-3 * (w - 1)


def _draft_steady(w: int) -> float:
    return 0.4e-3 + 0.02e-3 * (w - 1)


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


@pytest.mark.parametrize("device", ["gpu", "cpu", "fixed-width"])
def test_calibration_measures_what_a_change_of_width_costs_where_calls_keep_graphs(
        device, monkeypatch):
    """On a device that keeps a graph per call width (``graph_shapes``: a GPU) the first call
    of a new width costs more (no graph: U) and the second too (it captures one: C): the
    calibration times three calls per width after another width, S(w) from the third, and U
    and C apart. Elsewhere (a CPU) one call per width and pass, and U = C = 0; at a fixed
    width every call is that wide (one price, and no change of width to pay for). The draft
    model's price is its steady single-token calls'."""
    from edgespec.runtime import calibration

    clock = use_clock(monkeypatch, Clock(), calibration)
    gpu = device != "cpu"
    graphs = dict(changed=3e-3, second=6e-3) if gpu else {}
    target_kw = dict(steady=_gpu_steady, **graphs)
    if device == "fixed-width":
        target_kw["fixed_width"] = 8
    engine = build(drafter="auto", timed=(clock, target_kw, dict(steady=_draft_steady, **graphs)))
    assert engine.target.graph_shapes is gpu
    costs = engine.calibrate(force=True)
    target, widths = costs.target, engine.target.widths
    points = sorted(config.CALIBRATION_POINTS)
    if device == "gpu":
        assert target.graphs and target.steady.width == 0
        assert target.changed == pytest.approx(3e-3) and target.second == pytest.approx(6e-3)
        assert sorted(target.steady.points) == points
        assert all(target.steady(w) == pytest.approx(_gpu_steady(w)) for w in points)
        assert _contains(widths, [w for w in config.CALIBRATION_POINTS for _ in range(3)])
    elif device == "cpu":
        assert not target.graphs and target.changed == target.second == 0.0
        assert sorted(target.steady.points) == points
        assert all(target.steady(w) == pytest.approx(_gpu_steady(w)) for w in points)
        assert _contains(widths, list(config.CALIBRATION_POINTS) * 2)
    else:
        assert target.steady.width == 8 and not target.graphs
        assert target.changed == target.second == 0.0
        assert target.steady(1) == target.steady(8) == pytest.approx(_gpu_steady(8))
        assert target.steady(9) == pytest.approx(2 * _gpu_steady(8))
    assert costs.draft_per_token == pytest.approx(_draft_steady(1))


def _widths_read(lm, skip=0):
    return [len(c.tokens) for c in lm.calls[skip:] if c.n_logits]


def test_on_a_gpu_calibration_first_runs_every_width_auto_may_call_once():
    """On a GPU the first call of a width in a process is dear (~45 ms more on the H200): the
    calibration runs each width auto may call, 1 .. AUTO_MAX_DRAFT_LENGTH + 1, once on both
    models before it times anything, and once per engine. On a CPU it runs none of them."""
    from edgespec import config

    top = config.AUTO_MAX_DRAFT_LENGTH + 1
    gpu = build(drafter="auto")
    gpu.target.graph_shapes = gpu.draft.graph_shapes = True
    gpu.calibrate(force=True)
    for lm in (gpu.target, gpu.draft):
        assert _widths_read(lm)[:top] == list(range(1, top + 1))
    seen = [len(gpu.target.calls), len(gpu.draft.calls)]
    gpu.calibrate(force=True)  # a second calibration times again, warms nothing again
    assert 23 not in _widths_read(gpu.target, seen[0]) + _widths_read(gpu.draft, seen[1])
    cpu = build(drafter="auto")
    cpu.calibrate(force=True)
    assert 23 not in _widths_read(cpu.target) + _widths_read(cpu.draft)  # (not a timed point)


@pytest.mark.parametrize("drafter, draft_too", [("lookup", False), ("hybrid", True), ("none", False)])
def test_on_a_gpu_a_fixed_drafters_widths_run_once_before_its_first_answer(drafter, draft_too,
                                                                          monkeypatch):
    """A fixed drafter calls widths 1 .. k + 1: on a GPU the engine runs each once before the
    first answer (the draft model's too where the drafter uses it), never again, and the
    answers are the same as without it."""
    from edgespec.runtime import engine as engine_mod

    script = HELLO * 3
    calls = []
    real = engine_mod.warm_widths
    monkeypatch.setattr(engine_mod, "warm_widths",
                        lambda model, widths: calls.append((model, list(widths))) or real(model, widths))
    gpu = build(script, drafter=drafter, k=4)
    gpu.target.graph_shapes = gpu.draft.graph_shapes = True
    first = complete(gpu, max_tokens=20, sampling=GREEDY)
    k1 = 1 if drafter == "none" else 5
    assert calls == [(gpu.target, list(range(1, k1 + 1)))] + (
        [(gpu.draft, list(range(1, k1 + 1)))] if draft_too else [])
    second = complete(gpu, max_tokens=20, sampling=GREEDY)
    assert len(calls) == 1 + draft_too  # once per engine
    plain = complete(build(script, drafter=drafter, k=4), max_tokens=20, sampling=GREEDY)
    assert first.tokens == second.tokens == plain.tokens


def test_the_draft_cost_auto_learns_carries_over_to_the_next_generation():
    """The draft model's cost per token is the engine's, like the target's curve: what one
    generation's rounds measured (on a GPU, more than the calibration's repeated single calls)
    is where the next starts, instead of the calibration again."""
    engine = build(drafter="auto")
    costs = engine.calibrate()
    assert costs.draft is not None and costs.draft.seconds == costs.draft_per_token
    first, second = engine._policy(), engine._policy()
    assert first.draft_cost is costs.draft and second.draft_cost is costs.draft
    first.draft_cost.observe(10 * costs.draft_per_token)
    assert engine._policy().draft_cost.seconds > costs.draft_per_token
    assert costs.draft_per_token == engine.calibrate().draft_per_token  # the calibration's own
    out = engine.complete("x", max_tokens=24)  # auto's rounds feed the engine's estimates
    assert out.stats.generated == 24


def test_auto_on_a_gpu_like_engine_gives_the_plain_text(monkeypatch):
    """``auto`` on an engine whose calls cost what a GPU's do (on a fake clock: a nearly flat
    S(w), a change of width U more, the second call of a width C more), calibrated there and
    learning from its own rounds' times: on a repetitive answer that then goes its own way it
    drafts with lookup and with the model, and greedy output is plain decoding's, token for
    token."""
    from edgespec.runtime import calibration, loop
    from edgespec.runtime.sources import auto as auto_source, model as model_source

    clock = use_clock(monkeypatch, Clock(), calibration, model_source, auto_source, loop)
    graphs = dict(changed=1.5e-3, second=1.0e-3)
    timed = (clock, dict(steady=_gpu_steady, **graphs), dict(steady=_draft_steady, **graphs))
    script = HELLO * 4  # then free text, which lookup has not seen: the model's rounds
    engine = build(script, drafter="auto", draft="typos", typos={30: ids("a")[0]}, timed=timed)
    assert engine.calibrate().target.graphs
    spec = complete(engine, max_tokens=60, sampling=GREEDY)
    plain = complete(build(script, drafter="none"), max_tokens=60, sampling=GREEDY)
    assert [t.id for t in spec.tokens] == [t.id for t in plain.tokens]
    by = spec.stats.by_drafter
    assert by["model"].rounds > 0 and by["lookup"].rounds > 0
