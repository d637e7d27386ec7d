"""Constrained output: what the text must match, and the matcher that says which tokens may
come next.

The engine is llguidance (the constraint engine llama.cpp offers beside its own): a JSON
schema, JSON object mode, a GBNF grammar (llama.cpp's format) or a Lark grammar is compiled
once per request against the model's vocabulary, and then each position's allowed tokens
are a bitmask over the vocabulary (on the default target's 152k tokens: a median of ~20 µs
and a mean of ~30 µs a token over a schema'd record on this project's CPU VM; llama.cpp's
grammar sampler checks each candidate's text against the grammar's stacks, ms a row).
llguidance also rolls back (a rejected draft's tokens are undone) and computes the tokens the
grammar forces (proposed as drafts that cannot fail).

The constrained target distribution is the target's row with every disallowed token at
``-inf``, then processed as usual; the loop masks each scored row against the state after
the drafts before it (:class:`Matcher`). JSON is laid out in one way (``json.dumps``'s
``", "`` and ``": "``, no other whitespace): the keys, quotes and separators between values
are then forced, and the models write JSON that way when free to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..core.rowpass import rows
from ..errors import ConfigError

_ROWS = rows()

#: llguidance's JSON options: one layout, so that punctuation is forced
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

KINDS = ("json_schema", "json_object", "grammar", "lark")


@dataclass(frozen=True)
class Constraint:
    """What the output must match. ``kind``: ``json_schema`` (``text`` the schema as JSON),
    ``json_object`` (any JSON object), ``grammar`` (GBNF, llama.cpp's format) or ``lark``
    (llguidance's Lark, which can embed JSON schemas: tool calls use it). Build one with the
    class methods; :meth:`grammar_text` is what llguidance compiles."""

    kind: str
    text: str = ""

    @classmethod
    def json_schema(cls, schema: dict | str) -> "Constraint":
        """A JSON schema, as a dict or JSON text; a ConfigError if it is not a JSON object."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as err:
                raise ConfigError(f"the JSON schema is not valid JSON: {err}") from None
        if not isinstance(schema, dict):
            raise ConfigError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))  # (properties keep their order)

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def grammar(cls, gbnf: str) -> "Constraint":
        if not isinstance(gbnf, str) or not gbnf.strip():
            raise ConfigError("the grammar is empty")
        return cls("grammar", gbnf)

    @classmethod
    def lark(cls, text: str) -> "Constraint":
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("the grammar is empty")
        return cls("lark", text)

    @property
    def schema(self) -> dict | None:
        """The JSON schema (``json_schema``; ``{"type": "object"}`` for ``json_object``)."""
        if self.kind == "json_object":
            return {"type": "object"}
        return json.loads(self.text) if self.kind == "json_schema" else None

    def grammar_text(self) -> str:
        """The llguidance grammar; a ConfigError naming what is wrong where it cannot be made
        (compile errors are found by :func:`check`)."""
        import llguidance

        if self.kind in ("json_schema", "json_object"):
            return llguidance.LLMatcher.grammar_from_json_schema(self.schema, defaults=JSON_LAYOUT)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.text)
        if self.kind == "grammar":
            try:
                return llguidance.grammar_from("gbnf", self.text)
            except ValueError as err:
                raise ConfigError(f"bad grammar: {err}") from None
        raise ConfigError(f"unknown constraint kind {self.kind!r}: one of {', '.join(KINDS)}")

    def describe(self) -> str:
        return {"json_schema": "JSON schema", "json_object": "JSON object",
                "grammar": "grammar", "lark": "Lark grammar"}[self.kind]


def check(constraint: Constraint, tokenizer: Any = None) -> str:
    """Compile ``constraint`` (against ``tokenizer`` if given): its llguidance grammar, or a
    ConfigError with llguidance's message (a bad schema or grammar)."""
    import llguidance

    grammar = constraint.grammar_text()
    error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if error:
        raise ConfigError(f"bad {constraint.describe()}: {_first_line(messages[0])}")
    return grammar


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "invalid"


class Matcher:
    """A constraint's state over one generation: the allowed tokens after the text so far.

    ``push`` consumes tokens (each must be allowed: :meth:`valid` says how many of a proposal
    are), ``pop`` undoes the last ones (a rejected draft's), :meth:`forced` lists the tokens
    the grammar forces next, :meth:`apply` masks a row of logits. The mask of the current
    state is computed once and kept until the state changes."""

    def __init__(self, constraint: Constraint, tokenizer: Any, n_vocab: int) -> None:
        import llguidance

        self.constraint = constraint
        # (compiled once: the matcher reports what check() would, through is_error)
        self._m = llguidance.LLMatcher(tokenizer, constraint.grammar_text(), log_level=0)
        if self._m.is_error():
            raise ConfigError(f"bad {constraint.describe()}: {_first_line(self._m.get_error())}")
        self.n_vocab = n_vocab
        self._words = (n_vocab + 31) // 32
        self._bits = np.zeros(self._words, np.int32)
        self._fresh = False  #: whether _bits holds the current state's mask
        self.depth = 0  #: tokens consumed

    # ---- state ---------------------------------------------------------------------------

    def push(self, tokens: Sequence[int]) -> None:
        if tokens:
            if not self._m.consume_tokens(list(tokens)):
                raise RuntimeError(f"constraint refused tokens {list(tokens)}: {self._m.get_error()}")
            self.depth += len(tokens)
            self._fresh = False

    def pop(self, n: int) -> None:
        if n:
            if not self._m.rollback(n):
                raise RuntimeError(f"constraint could not roll back {n}: {self._m.get_error()}")
            self.depth -= n
            self._fresh = False

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the first, the constraint allows next."""
        return self._m.validate_tokens(list(tokens)) if tokens else 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (empty where it allows a choice, or is done)."""
        return self._m.compute_ff_tokens()

    @property
    def stopped(self) -> bool:
        """The constraint is complete and allows nothing more but the end of generation."""
        return self._m.is_stopped()

    # ---- masks ---------------------------------------------------------------------------

    def bits(self) -> np.ndarray:
        """The allowed tokens as llguidance's bitmask (int32 words, bit ``t % 32`` of word
        ``t // 32``), computed once per state."""
        if not self._fresh:
            self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            self._fresh = True
        return self._bits

    def allowed(self) -> np.ndarray:
        """Bool per token of the vocabulary: may it come next."""
        bits = np.unpackbits(self.bits().view(np.uint8), bitorder="little")
        return bits[: self.n_vocab].view(np.bool_)

    def only(self) -> int | None:
        """The one token allowed next, if exactly one is (its row needs no logits)."""
        bits = self.bits()
        words = np.flatnonzero(bits)
        if words.size != 1:
            return None
        word = int(bits[words[0]]) & 0xFFFFFFFF
        if word & (word - 1):
            return None
        return int(words[0]) * 32 + word.bit_length() - 1

    def apply(self, row: np.ndarray) -> np.ndarray:
        """A float32 copy of ``row`` with every disallowed token at ``-inf`` (columns past the
        vocabulary, a draft model's padding, too): one compiled pass where edgespec was built
        with its row passes (on 152k tokens ~30 µs where the mask is mostly whole words of
        allowed or refused tokens, as in JSON, ~90 µs for a random one), else NumPy's
        (~200 µs)."""
        out = np.empty(row.size, np.float32)
        if _ROWS is not None and row.dtype == np.float32 and row.flags.c_contiguous:
            _ROWS.masked(row, self.bits(), out)
            return out
        out[:] = row
        allowed = self.allowed()
        n = min(out.size, allowed.size)
        out[:n][~allowed[:n]] = -np.inf
        out[n:] = -np.inf
        return out
