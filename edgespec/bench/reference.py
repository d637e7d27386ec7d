"""llama-cpp-python's own generation paths, measured like edgespec's for ``edgespec bench``.

- ``llama-cpp-python``: ``Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))``,
  the speculative path a Python user would otherwise pick. With a draft model llama-cpp-python
  forces ``logits_all=True``: every decoded position's logits are kept (an n_ctx x n_vocab
  float32 array) and a draft is accepted only where it equals the sampled token. The reference
  passes ``logits_all=True`` itself: llama-cpp-python 0.3.36 sizes its logits buffer from the
  argument (n_batch rows when False) while writing n_ctx rows, so with a draft model and the
  default ``logits_all=False`` any prompt longer than n_batch (512) tokens fails with a NumPy
  broadcast error.
- ``llama-cpp-python-plain``: stock ``Llama`` without drafting. It uses llama.cpp's fastest CPU
  kernels, so against edgespec's ``none`` it shows what batch-consistent kernels cost.

Each ``Llama`` is created on first use and reused (its prompt prefix cache included, as
edgespec reuses its own), with the target's offload setting (``--ngl``): on a GPU both sides run
there, never the reference on the CPU next to edgespec's GPU figures. Generation goes through
``create_chat_completion`` (or ``create_completion`` for raw prompts) with ``stream=True``, as an
application would call it.

On a structured prompt (one with a JSON schema) both run llama-cpp-python's own constrained
path: ``grammar=LlamaGrammar.from_json_schema(schema)``, llama.cpp's GBNF grammar converted
from the schema by llama-cpp-python (made once per prompt and reused; llama.cpp parses it into
a fresh grammar sampler at the start of each generation, before the first token). llama.cpp's
sampler chain then applies the grammar to every token's whole row. The answer is checked as
edgespec's are.

What is measured, by wrapping the instance's own methods (no change to llama-cpp-python):
each ``sample`` call is one sampled token, timestamped; each ``eval`` call is one target call
(round), the first being the prompt prefill; each call of the draft model proposes one round's
drafts; ``_ctx.decode`` is the time inside ``llama_decode``. Tokens per second counts the tokens
after the first over the time from the first sampled token to the last: the first token's time
includes the prompt prefill, which edgespec's speed excludes too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..core.sampling import SamplingParams
from ..errors import ModelError
from .prompts import BenchPrompt
from .run import Config, Measurement

#: llama-cpp-python's default number of tokens its prompt lookup proposes per round.
NUM_PRED_TOKENS = 10
N_BATCH = 512


class _Recorder:
    """Timestamps of one generation's sample / eval / draft / decode calls."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, bool]] = []  # (start, end, is_eog)
        self.evals: list[tuple[float, float]] = []
        self.drafts: list[tuple[float, float, int]] = []  # (start, end, n_proposed)
        self.decodes: list[tuple[float, float]] = []
        self.prompt_tokens = 0


class ReferenceRunner:
    """Creates llama-cpp-python ``Llama`` objects for the target on demand and measures runs."""

    def __init__(self, model_path: str | Path, n_ctx: int, n_threads: int,
                 num_pred_tokens: int = NUM_PRED_TOKENS, *, n_gpu_layers: int = 0) -> None:
        self.model_path = str(model_path)
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.num_pred_tokens = num_pred_tokens
        #: layers offloaded, as edgespec's target (``ModelOptions.n_gpu_layers``; -1 = all)
        self.n_gpu_layers = n_gpu_layers
        self._llamas: dict[str, object] = {}
        self._grammars: dict[str, Any] = {}  #: LlamaGrammar per schema (JSON text)
        self._rec = _Recorder()

    def describe(self) -> dict:
        """Each reference configuration's ``Llama`` settings, for the results' settings."""
        shared = {"n_batch": N_BATCH, "n_gpu_layers": self.n_gpu_layers, "flash_attn": False,
                  "kernels": "fast (llama.cpp defaults)",
                  "structured": "grammar=LlamaGrammar.from_json_schema(schema) (llama.cpp's "
                                "grammar sampler)"}
        return {
            "llama-cpp-python": {
                "draft_model": f"LlamaPromptLookupDecoding(num_pred_tokens={self.num_pred_tokens})",
                "logits_all": True, **shared,
                "note": "a draft_model forces logits_all=True (n_ctx x n_vocab float32 logits kept)",
            },
            "llama-cpp-python-plain": {"draft_model": None, "logits_all": False, **shared},
        }

    def _llama(self, name: str):
        llm = self._llamas.get(name)
        if llm is not None:
            return llm
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        rec_ref = self  # the wrappers read the current recorder at call time

        class CountingLookup(LlamaPromptLookupDecoding):
            def __call__(self, input_ids, /, **kwargs):
                t0 = time.perf_counter()
                out = super().__call__(input_ids, **kwargs)
                rec_ref._rec.drafts.append((t0, time.perf_counter(), len(out)))
                return out

        draft = CountingLookup(num_pred_tokens=self.num_pred_tokens) if name == "llama-cpp-python" else None
        llm = llama_cpp.Llama(model_path=self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads,
                              n_threads_batch=self.n_threads, n_batch=N_BATCH,
                              n_gpu_layers=self.n_gpu_layers, draft_model=draft,
                              logits_all=draft is not None, verbose=False)
        vocab = llm._model.vocab
        sample, evaluate = llm.sample, llm.eval

        def timed_sample(*args, **kwargs):
            rec = rec_ref._rec
            if not rec.samples:
                rec.prompt_tokens = llm.n_tokens
            t0 = time.perf_counter()
            token = sample(*args, **kwargs)
            rec.samples.append((t0, time.perf_counter(), bool(llama_cpp.llama_vocab_is_eog(vocab, token))))
            return token

        def timed_eval(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return evaluate(*args, **kwargs)
            finally:
                rec_ref._rec.evals.append((t0, time.perf_counter()))

        llm.sample = timed_sample  # instance attributes: Llama.generate calls self.sample/self.eval
        llm.eval = timed_eval
        ctx = getattr(llm, "_ctx", None)
        if ctx is not None and hasattr(ctx, "decode"):
            decode = ctx.decode

            def timed_decode(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return decode(*args, **kwargs)
                finally:
                    rec_ref._rec.decodes.append((t0, time.perf_counter()))

            ctx.decode = timed_decode
        self._llamas[name] = llm
        return llm

    def _grammar(self, schema: str):
        """llama-cpp-python's grammar for a JSON schema (its own conversion to GBNF)."""
        grammar = self._grammars.get(schema)
        if grammar is None:
            from llama_cpp import LlamaGrammar

            grammar = self._grammars[schema] = LlamaGrammar.from_json_schema(schema, verbose=False)
        return grammar

    def run(self, config: Config, prompt: BenchPrompt, max_tokens: int,
            sampling: SamplingParams) -> Measurement:
        llm = self._llama(config.drafter)
        self._rec = rec = _Recorder()
        kwargs = dict(max_tokens=max_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                      top_p=sampling.top_p, min_p=sampling.min_p, seed=sampling.seed or 0,
                      repeat_penalty=1.0, stream=True)
        if prompt.schema is not None:
            kwargs["grammar"] = self._grammar(prompt.schema)
        finish = None
        pieces: list[str] = []
        try:
            if prompt.raw:
                chunks = llm.create_completion(prompt.prompt, **kwargs)
            else:
                chunks = llm.create_chat_completion(prompt.as_messages(), **kwargs)
            for chunk in chunks:
                choice = chunk["choices"][0]
                finish = choice.get("finish_reason") or finish
                pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
        except ValueError as err:  # llama-cpp-python's errors, e.g. a prompt over the context
            raise ModelError(f"{config.drafter} on prompt {prompt.id}: {err}") from None
        m = measure(rec, finish or "length", logits_all=config.drafter == "llama-cpp-python")
        return m.check(prompt, "".join(pieces))

    def close(self) -> None:
        for llm in self._llamas.values():
            llm.close()
        self._llamas.clear()


def measure(rec: _Recorder, finish_reason: str, *, logits_all: bool = False) -> Measurement:
    """Turn one generation's recorded calls into a :class:`Measurement` (see module docstring)."""
    samples = rec.samples
    n = len(samples)
    generated = n - 1 if samples and samples[-1][2] else n  # an end-of-generation token is not output
    if n == 0:
        return Measurement(0, 0.0, 0.0, rec.prompt_tokens, 0, 0, 0, 0.0, 0.0, 0.0, finish_reason)
    t_first, t_last = samples[0][1], samples[-1][1]
    decode = t_last - t_first

    def inside(spans):
        return sum(e - s for s, e, *_ in spans if s >= t_first)

    drafted = sum(k for *_, k in rec.drafts)
    rounds = len(rec.evals)
    return Measurement(
        generated=generated,
        tokens_per_second=(n - 1) / decode if n > 1 and decode > 0 else 0.0,
        decode_time=decode, prompt_tokens=rec.prompt_tokens, rounds=rounds, drafted=drafted,
        # every round emits its accepted drafts plus one token of the target's own
        accepted=max(n - rounds, 0) if drafted else 0,
        time_drafting=inside(rec.drafts), time_target=inside(rec.evals),
        time_sampling=inside(samples[1:]), finish_reason=finish_reason,
        time_llama=inside(rec.decodes) if rec.decodes else None,
        detail={"draft_calls": len(rec.drafts), "logits_all": logits_all},
    )
