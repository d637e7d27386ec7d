"""Scripted fake models for the loop and engine tests: no llama.cpp, no files.

:class:`FakeLM` implements the backend surface the loop, the drafters and the engine use
(``n_ctx``, ``n_vocab``, ``tokens``, ``sync``, ``decode``, ``tokenize``, ``chat_prompt``,
``token_bytes``, ``is_eog``, ``close``), with the semantics of
:class:`edgespec.runtime.backend.LlamaBackend`: ``tokens`` mirrors the KV cache, ``sync`` trims it to the
longest common prefix, ``decode`` appends and raises past ``n_ctx``.

Its logits come from a *table*: a deterministic function of the whole prefix in the fake's own
cache (not only of the last token). So a loop that decodes at the wrong position, forgets to
roll back rejected drafts or re-feeds a token gets different logits, and different results.
Every ``decode`` and ``sync`` call is recorded for the tests to inspect.

Tables compose: :class:`Table` (Markov part + whole-prefix hash part), :class:`Perturbed`
(another table plus hash noise: a draft that mostly agrees with its target), :class:`Scripted`
(forces a given continuation after a given position: scripted text for the engine tests).

Time: :class:`Clock` is a simulated clock for ``Engine(clock=...)`` (or a module's
``time.perf_counter``: :func:`use_clock`), and :class:`TimedLM` a FakeLM whose calls advance it
by a given cost of their width (with a GPU's graph rule where asked); nothing else takes time on
it, so every timing in the stats (and the speedup made of them) is exact.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Iterable, Sequence

import numpy as np

from edgespec.core.lookup import common_prefix
from edgespec.errors import ContextOverflowError


def _prefix_normal(salt: int, prefix: tuple[int, ...], n: int) -> np.ndarray:
    """Standard normals that depend on every token of ``prefix`` (and on ``salt``)."""
    h = hashlib.blake2b(np.asarray(prefix, dtype=np.int64).tobytes(), digest_size=8,
                        salt=salt.to_bytes(8, "little"))
    return np.random.default_rng(int.from_bytes(h.digest(), "little")).normal(size=n)


class LogitTable:
    """A cached function ``prefix -> float32 logits`` over ``n_vocab`` tokens."""

    n_vocab: int

    def __init__(self) -> None:
        self._cache: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, prefix: Sequence[int]) -> np.ndarray:
        key = tuple(int(t) for t in prefix)
        row = self._cache.get(key)
        if row is None:
            row = self._cache[key] = np.asarray(self._compute(key), dtype=np.float32)
            row.flags.writeable = False
        return row

    def _compute(self, prefix: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError


class Table(LogitTable):
    """``markov * M[prefix[-1]] + context * H(prefix)``, minus infinity on ``banned`` tokens.

    ``M`` is a random transition matrix (it makes greedy text repeat, so prompt lookup finds
    matches); ``H`` is a hash of the whole prefix (it makes every position's logits depend on
    everything before it).
    """

    def __init__(self, n_vocab: int, seed: int = 0, *, markov: float = 2.0, context: float = 1.0,
                 banned: Iterable[int] = ()) -> None:
        super().__init__()
        self.n_vocab = n_vocab
        self.seed = seed
        self.markov = markov
        self.context = context
        self.banned = sorted(set(banned))
        self.M = np.random.default_rng(seed).normal(size=(n_vocab + 1, n_vocab))

    def _compute(self, prefix):
        last = prefix[-1] if prefix else self.n_vocab  # row n_vocab: the empty prefix
        row = self.markov * self.M[last] + self.context * _prefix_normal(self.seed, prefix, self.n_vocab)
        row[self.banned] = -np.inf
        return row


class Perturbed(LogitTable):
    """``base(prefix) + scale * H'(prefix)``: a draft that agrees with ``base`` only partly."""

    def __init__(self, base: LogitTable, seed: int, scale: float) -> None:
        super().__init__()
        self.base, self.seed, self.scale = base, seed, scale
        self.n_vocab = base.n_vocab

    def _compute(self, prefix):
        return self.base(prefix) + self.scale * _prefix_normal(10_000 + self.seed, prefix, self.n_vocab)


class Scripted(LogitTable):
    """``base`` with a large bonus on ``script[i]`` for a prefix of length ``start + i``.

    Greedy decoding from a prompt of ``start`` tokens then follows ``script`` exactly (and
    ``base`` after it). Each position depends on the prefix length, so decoding at the wrong
    position derails the script.
    """

    def __init__(self, base: LogitTable, script: Sequence[int], start: int, margin: float = 40.0) -> None:
        super().__init__()
        self.base, self.script, self.start, self.margin = base, list(script), start, margin
        self.n_vocab = base.n_vocab

    def _compute(self, prefix):
        row = np.array(self.base(prefix), dtype=np.float64)
        i = len(prefix) - self.start
        if 0 <= i < len(self.script):
            row[self.script[i]] = max(row[np.isfinite(row)].max(), 0.0) + self.margin
        return row


@dataclass(frozen=True)
class DecodeCall:
    """One recorded ``decode``: where it started, what it fed, how many rows it returned,
    and what the cache held before it."""

    pos: int
    tokens: tuple[int, ...]
    n_logits: int
    cache: tuple[int, ...]


def default_vocab(n_vocab: int) -> list[bytes]:
    """Token i is one printable character (distinct for up to 94 tokens)."""
    return [bytes([33 + i % 94]) for i in range(n_vocab)]


class FakeLM:
    """A scripted fake of :class:`edgespec.runtime.backend.LlamaBackend` (see the module docstring)."""

    def __init__(self, table: LogitTable, *, n_ctx: int = 256, vocab: Sequence[bytes] | None = None,
                 eog: Iterable[int] = (), bos: int | None = None) -> None:
        self.table = table
        self.n_vocab = table.n_vocab
        self.n_ctx = n_ctx
        self.vocab = list(vocab) if vocab is not None else default_vocab(self.n_vocab)
        if len(self.vocab) != self.n_vocab:
            raise ValueError(f"vocab has {len(self.vocab)} entries for n_vocab={self.n_vocab}")
        self.eog = frozenset(eog)
        self.bos = bos
        self.tokens: list[int] = []
        self.calls: list[DecodeCall] = []
        self.syncs: list[tuple[int, ...]] = []
        self.closed = False

    # ---- KV cache ---------------------------------------------------------------------------

    def sync(self, prefix: Sequence[int]) -> int:
        self.syncs.append(tuple(prefix))
        n = common_prefix(self.tokens, prefix)
        del self.tokens[n:]
        return n

    def trim(self, n: int) -> int:
        """Keep the first ``n`` cached tokens (a :class:`~edgespec.runtime.cache.Follower`'s
        cut: it knows those are the ones it wants); logged as the sync it stands for."""
        del self.tokens[n:]
        self.syncs.append(tuple(self.tokens))
        return len(self.tokens)

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        if not 0 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits={n_logits} for {len(tokens)} tokens")
        if any(not 0 <= t < self.n_vocab for t in tokens):
            raise ValueError(f"token out of range in {tokens}")
        start = len(self.tokens)
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"{start + len(tokens)} tokens do not fit in {self.n_ctx}")
        self.calls.append(DecodeCall(start, tuple(tokens), n_logits, tuple(self.tokens)))
        self.tokens.extend(tokens)
        first = start + len(tokens) - n_logits
        out = np.empty((n_logits, self.n_vocab), dtype=np.float32)
        for j in range(n_logits):
            out[j] = self.table(self.tokens[: first + j + 1])
        return out

    @property
    def decoded(self) -> int:
        """Tokens fed to ``decode`` so far (all calls)."""
        return sum(len(c.tokens) for c in self.calls)

    def reset_log(self) -> None:
        self.calls.clear()
        self.syncs.clear()

    # ---- vocabulary -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Deterministic, not invertible: byte b becomes token ``b % n_vocab`` (never BOS/EOG)."""
        plain = [t for t in range(self.n_vocab) if t not in self.eog and t != self.bos]
        ids = [plain[b % len(plain)] for b in text.encode("utf-8")]
        return ([self.bos] if add_special and self.bos is not None else []) + ids

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"

    def token_bytes(self, token: int) -> bytes:
        return self.vocab[token]

    def is_eog(self, token: int) -> bool:
        return token in self.eog

    def close(self) -> None:
        self.closed = True


class RecurrentLM(FakeLM):
    """A target with recurrent layers, as llama.cpp's snapshots let it be taken back: a cut
    may drop at most ``reach`` tokens, all of them fed by the last decode call and not its
    first, once (:mod:`edgespec.runtime.recurrent`); anything else fails the test."""

    def __init__(self, table: LogitTable, *, reach: int = 2, **kw) -> None:
        super().__init__(table, **kw)
        self.draft_reach = reach
        self._droppable = 0
        self.rollbacks: list[int] = []

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        out = super().decode(tokens, n_logits)
        self._droppable = min(len(tokens) - 1, self.draft_reach)
        return out

    def trim(self, n: int) -> int:
        drop = len(self.tokens) - n
        if drop > 0:
            assert drop <= self._droppable, f"rolled back {drop} tokens, {self._droppable} reachable"
            self._droppable = 0
            self.rollbacks.append(drop)
        return super().trim(n)

    def sync(self, prefix: Sequence[int]) -> int:
        return self.trim(common_prefix(self.tokens, prefix))


class AheadLM(FakeLM):
    """A FakeLM whose decodes start and finish apart, as LlamaBackend's do where llama.cpp's
    decode is asynchronous (``asynchronous``: a GPU, RPC workers). The work is done at the start
    (the record of the cache holds the tokens at once, as the real one's does); ``events`` logs
    each start and finish, and anything else asked of the model while a call is in flight fails
    the test."""

    asynchronous = True

    def __init__(self, table: LogitTable, **kw) -> None:
        super().__init__(table, **kw)
        self.events: list[tuple] = []
        self.in_flight = False
        self._result = None

    def _idle(self) -> None:
        assert not self.in_flight, "the model was used while a launched call was in flight"

    def sync(self, prefix: Sequence[int]) -> int:
        self._idle()
        return super().sync(prefix)

    def trim(self, n: int) -> int:
        self._idle()
        return super().trim(n)

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        self._idle()
        return super().decode(tokens, n_logits)

    def decode_argmax(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        return np.argmax(self.decode(tokens, n_logits), axis=1).tolist()

    def start_decode(self, tokens: Sequence[int], n_logits: int, *, picks: bool = False) -> None:
        rows = self.decode(tokens, n_logits)
        self._result = np.argmax(rows, axis=1).tolist() if picks else rows
        self.in_flight = True
        self.events.append(("start", len(tokens)))

    def finish_decode(self):
        assert self.in_flight, "finish_decode without start_decode"
        self.in_flight = False
        self.events.append(("finish",))
        return self._result


class Clock:
    """Simulated seconds (call it for the time): they pass only where a fake call moves them on
    (:class:`TimedLM`), or the test does (:meth:`advance`)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def use_clock(monkeypatch, clock: Clock, *modules) -> Clock:
    """Make ``clock`` the ``time.perf_counter`` of each module (those that ``import time`` and
    read only ``time.perf_counter``: runtime.calibration, runtime.loop, the sources' modules)."""
    for module in modules:
        monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=clock))
    return clock


class TimedLM(FakeLM):
    """A FakeLM whose calls take time on a :class:`Clock`, as on a device that keeps one
    captured graph per call width (llama.cpp's CUDA backend): a call of width w (the tokens
    it feeds) costs ``steady(w)``, plus ``changed`` where the call before it had another width
    (no graph yet), plus ``second`` where it is the second call of its width in a row (the
    capture); from the third on, ``steady(w)`` alone (a replay). With ``changed = second = 0``
    a CPU. ``prefill``: what a call that reads no logits costs instead of ``steady`` (None:
    the same rule). All of it times ``slowdown`` (set it to make the machine slower or faster
    mid-test). ``graph_shapes`` (what the engine reads to know a GPU) is true where
    ``changed`` or ``second`` is nonzero unless given. ``fixed_width``: every call is that
    wide (n tokens take ceil(n / width) calls), as a backend at a fixed width pads them."""

    def __init__(self, table: LogitTable, clock: Clock, steady: Callable[[int], float], *,
                 changed: float = 0.0, second: float = 0.0, prefill: float | None = None,
                 graph_shapes: bool | None = None, fixed_width: int = 0, **kw) -> None:
        super().__init__(table, **kw)
        self.clock = clock
        self.steady, self.changed, self.second, self.prefill = steady, changed, second, prefill
        self.slowdown = 1.0
        self.graph_shapes = bool(changed or second) if graph_shapes is None else graph_shapes
        if fixed_width:
            self.fixed_width = fixed_width
        self.last: int | None = None  #: the last call's width
        self.run = 0  #: calls of that width in a row
        self.widths: list[int] = []  #: every call's width, in order

    def _call(self, width: int, reads: bool) -> None:
        extra = (self.changed if width != self.last else self.second if self.run == 1 else 0.0)
        base = self.steady(width) if reads or self.prefill is None else self.prefill
        self.clock.now += self.slowdown * (base + extra)
        self.run = self.run + 1 if width == self.last else 1
        self.last = width
        self.widths.append(width)

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        out = super().decode(tokens, n_logits)
        fixed = getattr(self, "fixed_width", 0)
        if fixed:
            for _ in range(-(-max(len(tokens), 1) // fixed)):
                self._call(fixed, bool(n_logits))
        else:
            self._call(len(tokens), bool(n_logits))
        return out

    def decode_argmax(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        return np.argmax(self.decode(tokens, n_logits), axis=1).tolist()


def pair(n_vocab: int = 8, *, seed: int = 1, draft: str = "perturbed", scale: float = 1.5,
         n_ctx: int = 256, draft_n_ctx: int | None = None, **table_kw) -> tuple[FakeLM, FakeLM]:
    """A target fake and a draft fake: ``draft`` is ``"same"`` (the target's own table),
    ``"perturbed"`` (target + noise of ``scale``: partial agreement) or ``"independent"``."""
    t = Table(n_vocab, seed, **table_kw)
    if draft == "same":
        d = t
    elif draft == "perturbed":
        d = Perturbed(t, seed, scale)
    elif draft == "independent":
        d = Table(n_vocab, seed + 1000, **table_kw)
    else:
        raise ValueError(draft)
    return FakeLM(t, n_ctx=n_ctx), FakeLM(d, n_ctx=draft_n_ctx or n_ctx)


class FakeMatcher:
    """A stand-in for :class:`edgespec.runtime.constraint.Matcher` over a fake's vocabulary:
    a "grammar" whose allowed tokens are a deterministic function of every token consumed.
    After a quarter of the prefixes exactly one token is allowed (so runs of forced tokens
    occur), after the others a hashed subset of about half the vocabulary (never empty).
    :meth:`allows` answers for any prefix, for tests to check a text against it."""

    def __init__(self, n_vocab: int, seed: int = 0) -> None:
        self.n_vocab = n_vocab
        self.seed = seed
        self.consumed: list[int] = []
        self.log: list[tuple[str, int]] = []  #: ("push" | "pop", count)

    def allowed_after(self, prefix: Sequence[int]) -> np.ndarray:
        h = hashlib.blake2b(np.asarray(prefix, dtype=np.int64).tobytes(), digest_size=8,
                            salt=self.seed.to_bytes(8, "little")).digest()
        value = int.from_bytes(h, "little")
        out = np.zeros(self.n_vocab, bool)
        if value % 4 == 0:
            out[(value >> 8) % self.n_vocab] = True
        else:
            bits = value >> 2
            for t in range(self.n_vocab):
                out[t] = (bits >> t) & 1
            if not out.any():
                out[value % self.n_vocab] = True
        return out

    def allows(self, prefix: Sequence[int], token: int) -> bool:
        return bool(self.allowed_after(prefix)[token])

    def push(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            if not self.allows(self.consumed, t):
                raise RuntimeError(f"token {t} not allowed after {self.consumed}")
            self.consumed.append(t)
        self.log.append(("push", len(tokens)))

    def pop(self, n: int) -> None:
        del self.consumed[len(self.consumed) - n:]
        self.log.append(("pop", n))

    def valid(self, tokens: Sequence[int]) -> int:
        return self.valid_after(self.consumed, tokens)

    def valid_after(self, prefix: Sequence[int], tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows after ``prefix``, from the first."""
        prefix = list(prefix)
        for i, t in enumerate(tokens):
            if not self.allows(prefix, t):
                return i
            prefix.append(t)
        return len(tokens)

    def forced(self) -> list[int]:
        prefix, out = list(self.consumed), []
        while len(out) < 6:
            allowed = np.flatnonzero(self.allowed_after(prefix))
            if allowed.size != 1:
                break
            out.append(int(allowed[0]))
            prefix.append(out[-1])
        return out

    def only(self) -> int | None:
        allowed = np.flatnonzero(self.allowed_after(self.consumed))
        return int(allowed[0]) if allowed.size == 1 else None

    def apply(self, row: np.ndarray) -> np.ndarray:
        out = np.array(row, dtype=np.float32, copy=True)
        out[~self.allowed_after(self.consumed)[: out.size]] = -np.inf
        return out

    @property
    def stopped(self) -> bool:
        return False


#: a chat template with Qwen's tool-call format (what :func:`edgespec.runtime.tools.tool_family`
#: reads as ``hermes``)
HERMES_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                   "{% if tools %}<tools>{{ tools | tojson }}</tools> Call with <tool_call>\n"
                   "{\"name\": ..., \"arguments\": ...}\n</tool_call>{% endif %}")


class ScriptedEngine:
    """An engine stand-in for the server's tests: every ``stream`` yields ``pieces``, one chunk
    and one token each (the last with ``finish``), and records its prompt and arguments in
    ``calls``. With ``logprobs`` asked, token ``i`` of the script has log-probability
    ``-0.1 * (i + 1)`` and its alternatives are the next tokens of the script. The target
    reports ``template`` as its chat template."""

    def __init__(self, pieces: Sequence[str], *, finish: str = "stop",
                 template: str = HERMES_TEMPLATE) -> None:
        self.pieces = list(pieces)
        self.finish = finish
        self.calls: list[tuple[object, dict]] = []
        vocab = [p.encode("utf-8") for p in dict.fromkeys(self.pieces)]
        self._ids = {p: i for i, p in enumerate(dict.fromkeys(self.pieces))}
        self.target = SimpleNamespace(
            n_ctx=4096, n_vocab=len(vocab), token_bytes=vocab.__getitem__,
            metadata=lambda: {"tokenizer.chat_template": template})
        self.draft = None
        self.drafter_name = "none"
        self.draft_length = 0

    def stream(self, prompt, **kwargs):
        from edgespec.core.stats import Stats
        from edgespec.runtime.engine import Chunk, TokenInfo

        self.calls.append((prompt, kwargs))
        logprobs = kwargs.get("logprobs")
        stats = Stats(prompt_tokens=7)
        ids = [self._ids[p] for p in self.pieces]
        for i, piece in enumerate(self.pieces):
            stats.generated += 1
            token = TokenInfo(ids[i], piece, "target")
            if logprobs is not None:
                top = [(t, -0.1 * (j + 1)) for j, t in enumerate(ids[i:], start=i)][:logprobs]
                token = TokenInfo(ids[i], piece, "target", -0.1 * (i + 1), tuple(top))
            last = i == len(self.pieces) - 1
            yield Chunk(piece, [token], stats, self.finish if last else None)
