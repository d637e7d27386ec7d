"""``edgespec bench --overhead --structured``: what constrained output costs the host per token.

Each token of a constrained answer needs the set of tokens the constraint allows next, over
the target's whole vocabulary (152k tokens for the default target), and the row of logits
masked by it. This walks a structured prompt's reference answer (its ``answer``, laid out as
the model writes it under edgespec's constraint: ``json.dumps``'s separators, the schema's key
order) token by token and times, at every position:

- llguidance, edgespec's engine (:class:`~edgespec.runtime.constraint.Matcher`): ``bits()``,
  the allowed tokens as a bitmask, and ``apply()``, a row of logits with every disallowed
  token at ``-inf``; their sum is the mask. Then ``push``, consuming the token (advance).
- llama.cpp's own grammar sampler, what llama-cpp-python's ``grammar=`` runs: the same schema
  converted to GBNF by llama-cpp-python (``json_schema_to_gbnf``),
  ``llama_sampler_init_grammar(vocab, gbnf, "root")``, then ``llama_sampler_apply`` on a full
  ``llama_token_data_array`` of the vocabulary (llama-cpp-python's sampler chain applies the
  grammar to every token's whole row, before the greedy pick), and ``llama_sampler_accept``.

Both start from the same row of logits at every position (restored, untimed, before each
apply). Only the model's vocabulary is loaded (``vocab_only``), not its weights. Each walk
starts from a fresh matcher and a fresh sampler, as a request does; each position keeps its
best of the walks (host time is noisy upwards only). The end of the answer counts as a
position: its mask allows only the end of generation.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError, ModelError
from .prompts import STRUCTURED, BenchPrompt

#: the parts timed, per method: (key, label)
LLGUIDANCE_PARTS = (("mask", "mask (bits + apply)"), ("bits", "bits"), ("apply", "apply"),
                    ("advance", "advance (push)"))
GRAMMAR_PARTS = (("mask", "mask (apply)"), ("advance", "advance (accept)"))


class Vocabulary:
    """A GGUF model's vocabulary alone (llama.cpp's ``vocab_only``: no weights, no context)."""

    def __init__(self, path: str | Path) -> None:
        import llama_cpp

        from ..runtime import backend  # (its log callback keeps llama.cpp's log quiet)

        self.path = Path(path)
        backend.check_gguf_file(self.path)
        from ..runtime.llama_model import model_params

        params, _, keep = model_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        del keep  # (read by the load only)
        if not self._model:
            raise ModelError(f"cannot load the vocabulary of {self.path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))

    def tokenize(self, text: str) -> list[int]:
        """``text`` as the model tokenizes it, without BOS or special tokens."""
        import llama_cpp

        data = text.encode("utf-8")
        out = (llama_cpp.llama_token * (len(data) + 16))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, len(out), False, False)
        if n < 0:
            raise ModelError(f"cannot tokenize {len(data)} bytes ({n})")
        return list(out[:n])

    def constraint_tokenizer(self):
        """llguidance's tokenizer, made as the engine makes it for its models."""
        from ..runtime.llama_model import llguidance_tokenizer

        return llguidance_tokenizer(self.vocab, self.n_vocab)

    def close(self) -> None:
        import llama_cpp

        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Vocabulary":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def laid_out(value: Any, schema: Any) -> Any:
    """``value`` with each object's keys in the order of its schema's ``properties`` (others
    after them), through ``properties`` and ``items``: the order the constraint writes them."""
    if isinstance(value, dict):
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        order = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: laid_out(value[k], props.get(k)) for k in order}
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema, dict) else None
        return [laid_out(v, items) for v in value]
    return value


def answer_text(prompt: BenchPrompt, schema: dict) -> str:
    """The prompt's answer as edgespec's constraint lays it out (``schema``: as compiled)."""
    if prompt.answer is None:
        raise ConfigError(f"prompt {prompt.id} has no 'answer' to walk the masks along")
    return json.dumps(laid_out(json.loads(prompt.answer), schema), ensure_ascii=False)


def walk_llguidance(constraint, tokenizer, n_vocab: int, tokens: Sequence[int],
                    row: np.ndarray) -> dict[str, np.ndarray]:
    """Seconds of each part (:data:`LLGUIDANCE_PARTS`) at each position of ``tokens`` and at
    its end; a ConfigError where the constraint does not allow the answer's token."""
    from ..runtime.constraint import Matcher

    matcher = Matcher(constraint, tokenizer, n_vocab)
    n = len(tokens) + 1
    bits_s, apply_s, advance_s = np.zeros(n), np.zeros(n), np.zeros(n)
    clock = time.perf_counter
    for i in range(n):
        t0 = clock()
        bits = matcher.bits()
        t1 = clock()
        matcher.apply(row)
        t2 = clock()
        bits_s[i], apply_s[i] = t1 - t0, t2 - t1
        if i == len(tokens):
            break
        token = tokens[i]
        if not (int(bits[token >> 5]) >> (token & 31)) & 1:
            raise ConfigError(f"the answer's token {i} ({token}) is not allowed by llguidance "
                              "there: the answer does not fit the schema as edgespec lays it out")
        t3 = clock()
        matcher.push([token])
        advance_s[i] = clock() - t3
    return {"mask": bits_s + apply_s, "bits": bits_s, "apply": apply_s, "advance": advance_s[:-1]}


class GrammarSampler:
    """llama.cpp's grammar sampler over a vocabulary, and a full row of candidates for it."""

    def __init__(self, vocabulary: Vocabulary, gbnf: str, row: np.ndarray) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.sampler = llama_cpp.llama_sampler_init_grammar(vocabulary.vocab, gbnf.encode("utf-8"),
                                                            b"root")
        if not self.sampler:
            raise ConfigError("llama.cpp cannot parse the grammar llama-cpp-python made of the schema")
        n = vocabulary.n_vocab
        self._data = (llama_cpp.llama_token_data * n)()
        self.view = np.ctypeslib.as_array(self._data)
        self.fresh = np.zeros_like(self.view)
        self.fresh["id"] = np.arange(n, dtype=np.int32)
        self.fresh["logit"] = row[:n]
        self.candidates = llama_cpp.llama_token_data_array(self._data, n, -1, False)
        self._ref = ctypes.byref(self.candidates)

    def reset_row(self) -> None:
        """Every candidate back, with the row's logits (untimed)."""
        self.view[:] = self.fresh
        self.candidates.size = len(self.fresh)
        self.candidates.selected = -1
        self.candidates.sorted = False

    def apply(self) -> None:
        self._lib.llama_sampler_apply(self.sampler, self._ref)

    def allows(self, token: int) -> bool:
        """After :meth:`apply`: whether ``token`` kept a finite logit (candidates keep their
        places: the grammar only sets logits to ``-inf``)."""
        assert self.view["id"][token] == token
        return bool(np.isfinite(self.view["logit"][token]))

    def accept(self, token: int) -> None:
        self._lib.llama_sampler_accept(self.sampler, token)

    def close(self) -> None:
        if self.sampler:
            self._lib.llama_sampler_free(self.sampler)
            self.sampler = None


def walk_grammar(vocabulary: Vocabulary, gbnf: str, tokens: Sequence[int],
                 row: np.ndarray) -> dict[str, np.ndarray]:
    """Seconds of each part (:data:`GRAMMAR_PARTS`) at each position of ``tokens`` and at its
    end; a ConfigError where the grammar does not allow the answer's token."""
    sampler = GrammarSampler(vocabulary, gbnf, row)
    n = len(tokens) + 1
    apply_s, accept_s = np.zeros(n), np.zeros(n - 1)
    clock = time.perf_counter
    try:
        for i in range(n):
            sampler.reset_row()
            t0 = clock()
            sampler.apply()
            apply_s[i] = clock() - t0
            if i == len(tokens):
                break
            token = tokens[i]
            if not sampler.allows(token):
                raise ConfigError(f"the answer's token {i} ({token}) is not allowed by llama.cpp's "
                                  "grammar there")
            t1 = clock()
            sampler.accept(token)
            accept_s[i] = clock() - t1
    finally:
        sampler.close()
    return {"mask": apply_s, "advance": accept_s}


def summary(seconds: np.ndarray) -> dict[str, float]:
    """µs: median, mean and 90th percentile."""
    us = np.asarray(seconds) * 1e6
    return {"median": float(np.median(us)), "mean": float(us.mean()),
            "p90": float(np.percentile(us, 90))}


@dataclass
class MaskCost:
    """One prompt's walk: each part's µs per position (best of the walks), per method."""

    prompt: str
    tokens: int
    llguidance: dict[str, np.ndarray] = field(default_factory=dict)
    grammar: dict[str, np.ndarray] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "tokens": self.tokens, "positions": self.tokens + 1,
                "llguidance": {k: summary(v) for k, v in self.llguidance.items()},
                "llama_cpp_grammar": {k: summary(v) for k, v in self.grammar.items()}}


def _best(walks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.min([w[k] for w in walks], axis=0) for k in walks[0]}


def measure_prompt(vocabulary: Vocabulary, tokenizer, prompt: BenchPrompt, repeats: int = 3,
                   seed: int = 0) -> MaskCost:
    """Walk ``prompt``'s answer ``repeats`` times with each method (see the module docstring)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from ..runtime.constraint import Constraint

    if prompt.schema is None:
        raise ConfigError(f"prompt {prompt.id} has no schema")
    constraint = Constraint.json_schema(prompt.schema)
    schema = constraint.schema  # as llguidance compiles it: the grammar gets the same key order
    tokens = vocabulary.tokenize(answer_text(prompt, schema))
    gbnf = json_schema_to_gbnf(json.dumps(schema))
    row = np.random.default_rng(seed).normal(0.0, 2.0, vocabulary.n_vocab).astype(np.float32)
    cost = MaskCost(prompt.id, len(tokens))
    cost.llguidance = _best([walk_llguidance(constraint, tokenizer, vocabulary.n_vocab, tokens, row)
                             for _ in range(repeats)])
    cost.grammar = _best([walk_grammar(vocabulary, gbnf, tokens, row) for _ in range(repeats)])
    return cost


def structured_prompts(prompts: Sequence[BenchPrompt]) -> list[BenchPrompt]:
    """The prompts with a schema and an answer to walk; a ConfigError when there are none."""
    chosen = [p for p in prompts if p.kind == STRUCTURED and p.answer is not None]
    if not chosen:
        raise ConfigError("--structured walks the answers of structured prompts: none of the "
                          "chosen prompts has a schema and an 'answer'")
    return chosen


def run_masks(path: str | Path, prompts: Sequence[BenchPrompt], repeats: int = 3,
              progress=None) -> dict:
    """Every structured prompt's walk on the vocabulary of the GGUF at ``path``, and all the
    positions of all the prompts together (``all``)."""
    from ..runtime.allocator import keep_freed_memory

    keep_freed_memory()  # as the engine does (apply's row-sized output: no page faults)
    with Vocabulary(path) as vocabulary:
        t0 = time.perf_counter()
        tokenizer = vocabulary.constraint_tokenizer()
        tokenizer_seconds = time.perf_counter() - t0
        costs = []
        for prompt in structured_prompts(prompts):
            cost = measure_prompt(vocabulary, tokenizer, prompt, repeats)
            costs.append(cost)
            if progress is not None:
                progress(cost)
        n_vocab = vocabulary.n_vocab
    together = MaskCost("all", sum(c.tokens for c in costs))
    for method in ("llguidance", "grammar"):
        parts = getattr(costs[0], method)
        setattr(together, method, {k: np.concatenate([getattr(c, method)[k] for c in costs])
                                   for k in parts})
    return {"model": str(path), "vocab": n_vocab, "repeats": repeats,
            "tokenizer_seconds": tokenizer_seconds,
            "prompts": [c.to_dict() for c in costs], "all": together.to_dict()}


def format_masks(result: dict) -> str:
    """The walks as a table: µs per position for each method and part."""
    lines = [f"constrained output's host cost per token on the vocabulary of "
             f"{Path(result['model']).name} ({result['vocab']:,} tokens), along each structured "
             f"prompt's answer; µs, each position's best of {result['repeats']} walk(s)",
             f"{'prompt':22} {'tokens':>6}  {'method':38} {'median':>9} {'mean':>9} {'p90':>9}"]
    entries = result["prompts"] + ([result["all"]] if len(result["prompts"]) > 1 else [])
    for entry in entries:
        rows = [(f"llguidance {label}", entry["llguidance"][key]) for key, label in LLGUIDANCE_PARTS]
        rows += [(f"llama.cpp grammar {label}", entry["llama_cpp_grammar"][key])
                 for key, label in GRAMMAR_PARTS]
        for j, (label, s) in enumerate(rows):
            head = f"{entry['prompt']:22} {entry['tokens']:>6}" if j == 0 else " " * 29
            lines.append(f"{head}  {label:38} {s['median']:>9.1f} {s['mean']:>9.1f} {s['p90']:>9.1f}")
    every = result["all"]  # (all the positions)
    ours, theirs = every["llguidance"]["mask"], every["llama_cpp_grammar"]["mask"]
    lines.append(f"llama.cpp's grammar sampler takes {theirs['mean'] / ours['mean']:.0f}x "
                 f"llguidance's mask on the mean ({theirs['median'] / ours['median']:.0f}x on "
                 f"the median); llguidance's tokenizer for this vocabulary took "
                 f"{result['tokenizer_seconds']:.1f} s to build (once per model)")
    return "\n".join(lines)
