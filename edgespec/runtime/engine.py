"""The public engine: load a target (and draft), stream exact speculative completions.

Layers, each a generator over the one below (as in mlx-lm):
``loop.rounds`` (tokens per verification round) -> ``Engine.stream`` (text chunks with
provenance, stop conditions and live stats) -> ``Engine.complete`` (joins the stream).
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from .. import config
from ..core.costs import CallCosts, Clock
from ..core.policy import DEFAULT_CONFIG, CostEstimate, Policy, PolicyConfig
from ..core.rejection import Source
from ..core.sampling import SamplingParams, make_rng
from ..core.stats import Stats
from ..core.textstream import TextStream
from ..errors import ConfigError, ContextOverflowError, EdgespecError, IncompatibleDraftError
from .allocator import keep_freed_memory
from .calibration import measure_call_costs, measure_draft_cost, warm_widths
from .capabilities import capabilities
from .constraint import Constraint, Matcher
from .drafters import MODEL_DRAFTERS, check_drafter_name, make_drafter
from .guide import Guide
from .loop import prefill, rounds
from .rpc import DEFAULT_RPC_TIMEOUT_S

log = logging.getLogger(__name__)

Prompt = str | Sequence[dict[str, str]]


def exact_width(fixed_width: int, batch_consistent: bool, n_gpu_layers: int,
                rpc: Sequence[str]) -> int:
    """The fixed width an exact engine needs: ``fixed_width`` if set, else 0 where the target's
    layers all run on this CPU (the pieces of 3 are exact there) and ``EXACT_FIXED_WIDTH``
    where kernels follow the batch width (a local GPU, RPC workers, whose devices are not
    known here). Fast kernels cannot be exact."""
    if not batch_consistent:
        raise ConfigError("exact decoding and fast kernels contradict each other: choose one")
    if fixed_width:
        return fixed_width
    from .backend import offloads_locally

    return config.EXACT_FIXED_WIDTH if rpc or offloads_locally(n_gpu_layers, rpc) else 0


class EngineBusyError(EdgespecError):
    """The engine is already generating (one generation at a time per engine)."""


@dataclass(frozen=True)
class TokenInfo:
    """One emitted token: its id, the text it completed, and where it came from; with
    ``logprobs`` asked, its log-probability under the target's raw logits and the ``top``
    most likely tokens' (id, log-probability), most likely first."""

    id: int
    text: str
    source: Source
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass
class Chunk:
    """A piece of confirmed output. ``finish_reason`` is set on the last chunk only:
    ``"stop"`` (end-of-generation token or stop string), ``"length"`` (max_tokens) or
    ``"context"`` (the context window is full)."""

    text: str
    tokens: list[TokenInfo]
    stats: Stats
    finish_reason: str | None = None


@dataclass
class Completion:
    """A whole completion: the joined text, the reason it ended, its tokens and stats."""

    text: str
    finish_reason: str
    tokens: list[TokenInfo] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    #: with ``tools``: the calls the model made (OpenAI's shape), and the text outside them
    tool_calls: list[dict] = field(default_factory=list)
    content: str | None = None

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "tokens": len(self.tokens),
            "stats": self.stats.to_dict(),
        }
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


class Collector:
    """Joins a stream's chunks into a :class:`Completion`, also part-way (e.g. after Ctrl-C)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tokens: list[TokenInfo] = []
        self.stats: Stats | None = None  #: the last chunk's stats; None before the first

    def add(self, chunk: Chunk) -> None:
        self.parts.append(chunk.text)
        self.tokens.extend(chunk.tokens)
        self.stats = chunk.stats

    def completion(self, finish_reason: str) -> Completion:
        return Completion("".join(self.parts), finish_reason, self.tokens,
                          self.stats if self.stats is not None else Stats())


def validate_draft_length(k: int | None) -> int | None:
    """``None`` (the default: ``auto`` chooses, fixed drafters use DEFAULT_DRAFT_LENGTH) or an
    integer in [0, MAX_DRAFT_LENGTH]."""
    if k is None:
        return None
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= config.MAX_DRAFT_LENGTH:
        raise ConfigError(f"draft length must be an integer in [0, {config.MAX_DRAFT_LENGTH}], got {k!r}")
    return k


def validate_draft_window(window: int) -> int:
    """``window`` if it is a valid draft window (an int >= 0), else a ConfigError."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ConfigError(f"draft_window must be an integer >= 0 (0 = the whole row), got {window!r}")
    return window


def _same_file(target, draft) -> bool:
    """Whether two backends load the same model file (fakes without a ``path``: no)."""
    a, b = getattr(target, "path", None), getattr(draft, "path", None)
    return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()


def validate_logprobs(n: int | None) -> int | None:
    """``None`` (off) or the number of alternatives per token, 0 .. MAX_TOP_LOGPROBS."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= config.MAX_TOP_LOGPROBS:
        raise ConfigError(f"logprobs must be an integer in [0, {config.MAX_TOP_LOGPROBS}] "
                          f"(alternatives per token), got {n!r}")
    return n


def make_constraint(constraint: Constraint | None = None, json_schema: dict | str | None = None,
                    json_object: bool = False, grammar: str | None = None) -> Constraint | None:
    """The one constraint a generation asked for, or None; a ConfigError if it asked for
    more than one."""
    given = [c for c in (constraint,
                         Constraint.json_schema(json_schema) if json_schema is not None else None,
                         Constraint.json_object() if json_object else None,
                         Constraint.grammar(grammar) if grammar is not None else None) if c]
    if len(given) > 1:
        raise ConfigError("give one constraint: a JSON schema, JSON object mode or a grammar")
    return given[0] if given else None


def check_prompt(prompt: Prompt) -> None:
    """Raise :class:`ConfigError` for an empty prompt: blank text, or no messages. Cheap, so
    callers can check before loading any model."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError("the prompt is empty")
    elif not prompt:
        raise ConfigError("the conversation is empty")


def effective_draft_length(drafter: str, k: int | None) -> int:
    """The per-round cap: ``auto`` chooses up to AUTO_MAX_DRAFT_LENGTH, others draft exactly
    DEFAULT_DRAFT_LENGTH, unless the user set k."""
    if k is not None:
        return k
    return config.AUTO_MAX_DRAFT_LENGTH if drafter == "auto" else config.DEFAULT_DRAFT_LENGTH


def _note(progress: bool, message: str) -> None:
    """A one-line note: logged, and on stderr when progress output is wanted."""
    log.info(message)
    if progress:
        print(f"note: {message}", file=sys.stderr, flush=True)


def _pick_draft(target: str, target_path: Path, download: bool, progress: bool):
    """The draft picked for a target given without one, and its file (``None``: lookup drafting
    only), said on stderr with ``progress``."""
    from ..models.drafts import DraftChoice, choose_draft
    from ..models.resolve import resolve_model

    choice = choose_draft(target, target_path)
    if choice.draft is None:
        _note(progress, choice.reason)
        return choice, None
    _note(progress, f"draft {choice.draft} picked: {choice.reason}")
    try:
        return choice, resolve_model(choice.draft, download=download, progress=progress)
    except EdgespecError as err:
        # A draft picked for the user must not cost them the answer: say why and go on.
        reason = f"the picked draft {choice.draft} is not available ({err}): lookup drafting only"
        _note(progress, reason)
        return DraftChoice(None, reason), None


@dataclass(frozen=True)
class _Placement:
    """Where and how each model of :meth:`Engine.load` runs, every value checked before
    anything loads."""

    threads: int
    n_ctx: int
    n_batch: int
    n_gpu_layers: int
    draft_n_gpu_layers: int
    target_rpc: tuple[str, ...]
    draft_rpc: tuple[str, ...]
    rpc_timeout: float
    tensor_split: tuple[float, ...]
    batch_consistent: bool
    fixed_width: int

    @classmethod
    def check(cls, n_threads, n_ctx, n_batch, n_gpu_layers, draft_n_gpu_layers, rpc, draft_rpc,
              rpc_timeout, tensor_split, batch_consistent, fixed_width, exact) -> "_Placement":
        """The defaults filled in (see :meth:`Engine.load`); a ConfigError for a bad value."""
        from .backend import parse_tensor_split
        from .rpc import parse_endpoints

        threads = n_threads if n_threads is not None else config.default_threads()
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        if n_ctx < 16:
            raise ConfigError(f"context size must be >= 16 tokens, got {n_ctx}")
        target_rpc, drafts_rpc = parse_endpoints(rpc), parse_endpoints(draft_rpc)
        split = parse_tensor_split(tensor_split)
        if not rpc_timeout > 0:
            raise ConfigError(f"RPC timeout must be > 0 seconds, got {rpc_timeout}")
        if n_gpu_layers is None:
            n_gpu_layers = -1 if target_rpc else 0
        if draft_n_gpu_layers is None:
            draft_n_gpu_layers = -1 if drafts_rpc else (0 if target_rpc else n_gpu_layers)
        if exact:
            fixed_width = exact_width(fixed_width, batch_consistent, n_gpu_layers, target_rpc)
        return cls(threads, n_ctx, n_batch, n_gpu_layers, draft_n_gpu_layers, target_rpc,
                   drafts_rpc, rpc_timeout, split, batch_consistent, fixed_width)

    def _options(self, path: Path, ngl: int, consistent: bool, width: int,
                 workers: tuple[str, ...], split: tuple[float, ...] = ()):
        from .backend import ModelOptions

        # A worker's CPU computes without llama.cpp's repacked weights (the RPC server
        # allocates plain buffers): the pieces then follow the plain kernels (7 rows).
        return ModelOptions(path=path, n_gpu_layers=ngl, n_threads=self.threads,
                            n_ctx=self.n_ctx, n_batch=self.n_batch, batch_consistent=consistent,
                            rpc=workers, rpc_timeout=self.rpc_timeout, repack=not workers,
                            tensor_split=split, fixed_width=width)

    def target_options(self, path: Path):
        return self._options(path, self.n_gpu_layers, self.batch_consistent, self.fixed_width,
                             self.target_rpc, self.tensor_split)

    def draft_options(self, path: Path, same_file: bool):
        """Exactness needs only the target's logits to be batch-independent: the draft's q is
        whatever it samples from, so it keeps the fastest kernels. A draft that is the target's
        own file keeps the target's settings (and, in the Engine, its whole rows): q == p."""
        return self._options(path, self.draft_n_gpu_layers, self.batch_consistent and same_file,
                             self.fixed_width if same_file else 0, self.draft_rpc)


def _load_draft(target_be, target: str, target_path: Path, draft_path: Path | None,
                place: _Placement, download: bool, progress: bool):
    """The draft backend (or None) and the pick behind it (None where the user named one or
    there was none to pick). Without ``draft_path`` one is picked once the target has loaded
    (a file llama.cpp refuses needs no draft); a picked draft that turns out incompatible is
    said and dropped, the user's own raises."""
    from ..models.drafts import DraftChoice
    from .backend import LlamaBackend, check_compatible

    choice = None
    if draft_path is None:
        choice, draft_path = _pick_draft(target, target_path, download, progress)
        if draft_path is None:
            return None, choice
    same_file = draft_path.resolve() == target_path.resolve()
    draft_be = LlamaBackend(place.draft_options(draft_path, same_file))
    try:
        check_compatible(target_be, draft_be)
    except IncompatibleDraftError as err:
        draft_be.close()
        if choice is None:
            raise  # the user's own --draft: their mistake to hear about
        _note(progress, f"{err}: lookup drafting only")
        return None, DraftChoice(None, f"{err}: lookup drafting only")
    return draft_be, choice


@dataclass
class Costs:
    """This machine's measured costs: the target's call costs and the draft model's seconds
    per token, both as calibrated and refined by every round that ``auto`` plays, in this
    generation and the next (``draft_per_token`` stays the calibration's figure).

    ``calibrated``: the target's call costs as calibrated, never refined: its points were all
    measured at one moment, so their ratios (its shape) convert a call of any width to plain
    calls for the same-moment speedup. The refined costs mix moments: after the machine slows
    down, the widths ``auto`` plays follow it before S(1) does."""

    target: CallCosts
    draft_per_token: float | None
    calibration_seconds: float
    draft: CostEstimate | None = field(init=False, default=None)
    calibrated: CallCosts = field(init=False)

    def __post_init__(self) -> None:
        self.calibrated = copy.deepcopy(self.target)
        # one estimate for every generation, as the call costs are: a draft call on a GPU costs
        # more in the loop than calibrated (calls of changing width), and each generation
        # starting again from the calibration paid for that lesson again
        if self.draft_per_token is not None:
            self.draft = CostEstimate(self.draft_per_token)


class Engine:
    """Exact speculative decoding over a llama.cpp target and an optional draft model.

    Build one with :meth:`Engine.load`; use :meth:`stream` for live output or :meth:`complete`
    for the whole text. ``clock`` (seconds; default ``time.perf_counter``) times the
    calibration and every generation's stats: tests give a simulated one. One generation runs at a time; a second concurrent call raises
    :class:`EngineBusyError`. Close the engine (or use it as a context manager) to free memory.
    """

    def __init__(
        self,
        target,
        draft=None,
        *,
        drafter: str = config.DEFAULT_DRAFTER,
        draft_length: int | None = None,
        max_ngram: int = config.DEFAULT_MAX_NGRAM,
        min_ngram: int = config.DEFAULT_MIN_NGRAM,
        draft_window: int = config.DRAFT_WINDOW,
        clock: Clock | None = None,
    ) -> None:
        keep_freed_memory()  # (row-sized temporaries every token: no page faults for them)
        self.target = target
        self.draft = draft
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.draft_window = validate_draft_window(draft_window)
        if draft is not None and _same_file(target, draft):
            self.draft_window = 0  # a self-draft's q must stay its target's p, bit for bit
        self.drafter_name = check_drafter_name(drafter)
        if drafter in ("model", "hybrid") and draft is None:
            raise ConfigError(f"drafter {drafter!r} needs a draft model (--draft)")
        self.draft_length = validate_draft_length(draft_length)
        self.costs: Costs | None = None
        #: the ``auto`` drafter's tunables (an experiment is another config)
        self.policy_config: PolicyConfig = DEFAULT_CONFIG
        #: call widths each model has run once (:meth:`_warm`): (target's, draft's)
        self._warmed: tuple[set[int], set[int]] = (set(), set())
        #: the draft :meth:`load` picked for the target, and why (``None``: none was picked)
        self.draft_choice = None
        self._lock = threading.Lock()
        self._owner: int | None = None  #: the thread generating (holding _lock), if any
        #: what times calibration and generation (tests pass a simulated clock that their fake
        #: models advance; the virtual GPU its own)
        self.clock: Clock = clock or time.perf_counter

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        target: str | os.PathLike | None = None,
        draft: str | os.PathLike | None = None,
        *,
        pair: str = config.DEFAULT_PAIR,
        drafter: str = config.DEFAULT_DRAFTER,
        draft_length: int | None = None,
        max_ngram: int = config.DEFAULT_MAX_NGRAM,
        min_ngram: int = config.DEFAULT_MIN_NGRAM,
        draft_window: int = config.DRAFT_WINDOW,
        n_gpu_layers: int | None = None,
        draft_n_gpu_layers: int | None = None,
        rpc: str | Sequence[str] | None = None,
        draft_rpc: str | Sequence[str] | None = None,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S,
        tensor_split: str | Sequence[float] | None = None,
        n_threads: int | None = None,
        n_ctx: int = config.DEFAULT_N_CTX,
        n_batch: int = config.DEFAULT_N_BATCH,
        batch_consistent: bool = True,
        fixed_width: int = 0,
        exact: bool = False,
        download: bool = True,
        progress: bool = True,
    ) -> "Engine":
        """Load models by catalog name, hub reference (``OWNER/REPO[:QUANT]``,
        ``OWNER/REPO/FILE.gguf``) or GGUF path; catalog and hub models are fetched on first use.

        With no ``target``, the catalog pair ``pair`` gives target and draft. With an explicit
        ``target`` and no ``draft``, a drafter that uses a draft model (``auto``, ``model``,
        ``hybrid``) gets one picked for the target (:func:`edgespec.models.drafts.choose_draft`:
        the catalog's pair, else the smallest catalog draft with the target's tokenizer); when
        none fits, drafting is by lookup only. The pick and why are in :attr:`draft_choice`
        (``None`` when no pick was made) and, with ``progress``, said on stderr.
        The draft model is only loaded when the drafter uses it (``auto``, ``model``, ``hybrid``).
        ``rpc`` (``"HOST:PORT,..."`` or a list) puts the target's offloaded layers on those
        ``edgespec worker`` processes, ``draft_rpc`` the draft's (by default the draft runs here).
        ``n_gpu_layers`` defaults to every layer with ``rpc``, else none;
        ``draft_n_gpu_layers`` to every layer with ``draft_rpc``, else none when the target is on
        workers, else ``n_gpu_layers``. ``tensor_split`` (``"3,1"`` or numbers) shares the target's
        offloaded layers among its devices by weight: the workers' devices in ``rpc`` order, then
        this machine's GPUs (``edgespec info --rpc`` lists them in that order); without it they
        go to the workers only (or, locally, as llama.cpp shares them by free memory).
        A call to the workers that outlives ``rpc_timeout``
        seconds, a worker that dies or answers nonsense, ends the process with one ``error:``
        line (ggml cannot recover from it). ``batch_consistent`` makes the
        target's logits independent of how many tokens are scored per call on the CPU;
        ``fixed_width`` (tokens, 0 = off) does so on any device by making every target call
        that reads logits that wide (see README, Exactness). ``exact`` asks for greedy
        speculation equal to plain decoding bit for bit wherever the target runs: nothing more
        on this machine's CPU (already exact), ``config.EXACT_FIXED_WIDTH`` as the fixed width
        with layers on a GPU or on RPC workers (unless ``fixed_width`` names one).
        ``draft_length=None`` lets ``auto`` choose k each round (fixed drafters then use
        DEFAULT_DRAFT_LENGTH). ``draft_window``: a sampled draft model proposes from its this
        many most likely tokens (0: its whole row; the output's distribution is the target's
        either way, see :func:`edgespec.core.sampling.draft_distribution`); a draft that is
        the target's own file always drafts from its whole rows, so that q == p. With drafter ``auto`` the costs are measured right after loading
        (:meth:`calibrate`).
        """
        from ..models.catalog import resolve_pair
        from ..models.resolve import check_model_argument, resolve_model
        from .backend import LlamaBackend

        check_drafter_name(drafter)
        validate_draft_length(draft_length)
        validate_draft_window(draft_window)
        make_drafter("lookup", max_ngram=max_ngram, min_ngram=min_ngram)  # validates n-gram sizes
        if draft is not None and drafter not in MODEL_DRAFTERS:
            check_model_argument(str(draft))  # not loaded, but a typo still deserves an error
        place = _Placement.check(n_threads, n_ctx, n_batch, n_gpu_layers, draft_n_gpu_layers, rpc,
                                 draft_rpc, rpc_timeout, tensor_split, batch_consistent,
                                 fixed_width, exact)
        if target is None:
            chosen = resolve_pair(pair)
            target, draft = chosen.target, draft if draft is not None else chosen.draft
        target_path = resolve_model(str(target), download=download, progress=progress)
        draft_path = None
        if draft is not None and drafter in MODEL_DRAFTERS:  # fetched before anything loads
            draft_path = resolve_model(str(draft), download=download, progress=progress)
        target_be = LlamaBackend(place.target_options(target_path))
        draft_be = None
        try:
            if drafter in MODEL_DRAFTERS:
                draft_be, choice = _load_draft(target_be, str(target), target_path, draft_path,
                                               place, download, progress)
            else:
                choice = None
            if draft_be is None and drafter in ("model", "hybrid"):
                drafter = "lookup"  # said when it was found: no draft model for this target
            engine = cls(target_be, draft_be, drafter=drafter, draft_length=draft_length,
                         max_ngram=max_ngram, min_ngram=min_ngram, draft_window=draft_window)
            engine.draft_choice = choice
            if drafter == "auto":
                engine.calibrate()
            return engine
        except BaseException:
            if draft_be is not None:
                draft_be.close()
            target_be.close()
            raise

    @property
    def draft_window_mode(self) -> str:
        """Where sampled drafts take their window: ``off`` (whole rows, or no draft model),
        ``host`` (edgespec's threshold pass) or ``device`` (llama.cpp's top-k in the draft's
        graph, where its output layer is on a local GPU)."""
        if not self.draft_window or self.draft is None:
            return "off"
        return "device" if capabilities(self.draft).device_window else "host"

    def calibrate(self, *, force: bool = False) -> Costs:
        """Measure the target's call costs (:class:`~edgespec.core.costs.CallCosts`: S(n) at
        CALIBRATION_POINTS as the time budget allows; on a device with a graph per width, U and
        C) and the draft model's per-token cost: about a second on a small CPU. Done once per
        engine (``force`` re-measures); ``auto`` refines them as it runs."""
        if self.costs is not None and not force:
            return self.costs
        clock = self.clock
        with self._exclusive():
            self._warm(config.AUTO_MAX_DRAFT_LENGTH + 1, draft=True)
            start = clock()
            # at a fixed width every call up to that width costs the same: one price to measure
            caps = capabilities(self.target)
            target = measure_call_costs(
                self.target, config.CALIBRATION_POINTS, width=caps.fixed_width,
                graphs=caps.graph_shapes,
                repeats=config.CALIBRATION_REPEATS, budget_s=config.CALIBRATION_BUDGET_S,
                clock=clock)
            draft_cost = (measure_draft_cost(self.draft, n=3, repeats=config.CALIBRATION_REPEATS,
                                             budget_s=config.DRAFT_CALIBRATION_BUDGET_S,
                                             clock=clock)
                          if self.draft is not None else None)
            self.costs = Costs(target, draft_cost, clock() - start)
        return self.costs

    def _warm(self, upto: int, *, draft: bool) -> None:
        """Run every call width 1 .. ``upto`` once on each model whose calls keep CUDA graphs
        per width (``graph_shapes``: a GPU), and the draft model's too with ``draft``, unless
        that width ran before; elsewhere nothing. On a GPU the first call of a width in a
        process is dear: in the H200 lease of 2026-11-27, an answer's llama.cpp time ran
        ~40-50 ms over what its calls cost later for each width the calibration had not run
        (the first bench prompt's `auto` repeats: 2 new widths, +96 ms; 1, +40 ms), which
        made `auto` 0.88x of `none` on that prompt where its second repeat ran 1.14x. Paid
        here, once per engine, it is not paid inside an answer or a timed calibration."""
        for model, warmed, wanted in ((self.target, self._warmed[0], True),
                                      (self.draft, self._warmed[1], draft)):
            if not wanted or not capabilities(model).graph_shapes:
                continue
            todo = [n for n in range(1, upto + 1) if n not in warmed]
            if todo:
                warmed.update(warm_widths(model, todo))

    def _policy(self) -> Policy:
        costs = self.costs if self.costs is not None else self.calibrate()
        return Policy(costs.target, costs.draft, self.policy_config)

    def close(self) -> None:
        """Free both models.

        Raises :class:`EngineBusyError` while another thread is generating with this engine
        (freeing the models under it would crash the process): stop that generation first. A
        stream left open in the calling thread does not prevent closing; it cannot be resumed.
        """
        if not self._lock.acquire(blocking=False):
            if self._owner != threading.get_ident():
                raise EngineBusyError("cannot close this engine while another thread is generating "
                                      "with it; stop that generation first")
            self._free()
            return
        try:
            self._free()
        finally:
            self._lock.release()

    def _free(self) -> None:
        for model in (self.draft, self.target):
            if model is not None and hasattr(model, "close"):
                model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- prompts ---------------------------------------------------------------------------

    def prompt_tokens(self, prompt: Prompt, *, chat: bool = True, system: str | None = None,
                      tools: list[dict] | None = None) -> list[int]:
        """Tokenize a prompt. ``chat=True`` wraps a string as one user message and applies the
        model's chat template; a list of ``{"role", "content"}`` messages is always templated
        (with ``tools``, the template is given them)."""
        check_prompt(prompt)
        if isinstance(prompt, str):
            if not chat:
                return self.target.tokenize(prompt, add_special=True, parse_special=False)
            messages = [{"role": "user", "content": prompt}]
            if system:
                messages.insert(0, {"role": "system", "content": system})
        else:
            messages = list(prompt)
        text = (self.target.chat_prompt(messages, tools=tools) if tools
                else self.target.chat_prompt(messages))
        return self.target.tokenize(text, add_special=True, parse_special=True)

    # ---- generation ------------------------------------------------------------------------

    def stream(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = config.DEFAULT_MAX_TOKENS,
        sampling: SamplingParams | None = None,
        stop: str | Sequence[str] = (),
        drafter: str | None = None,
        draft_length: int | None = None,
        chat: bool = True,
        system: str | None = None,
        constraint: Constraint | None = None,
        json_schema: dict | str | None = None,
        json_object: bool = False,
        grammar: str | None = None,
        logprobs: int | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
    ) -> Iterator[Chunk]:
        """Generate, yielding confirmed text as each verification round ends.

        Constrained output: ``json_schema`` (a dict or JSON text), ``json_object`` (any JSON
        object), ``grammar`` (GBNF, llama.cpp's format) or a ready ``constraint``
        (:class:`~edgespec.runtime.constraint.Constraint`); one at most. The text then matches
        it (unless ``max_tokens`` or a stop string ends it first), and is still exactly what
        the target samples under it, every drafter alike. ``tools`` (OpenAI function tools) are
        given to the chat template, and ``tool_choice`` (``"auto"``, ``"none"``,
        ``"required"`` or ``{"type": "function", "function": {"name": ...}}``) constrains the
        answer to a call where it requires one; :meth:`complete` parses the calls.
        ``logprobs``: each token's log-probability (``0``) and its top alternatives (``n``).

        Each chunk carries its tokens with their provenance and the live :class:`Stats`.
        Closing the generator early (``break``, ``.close()``, Ctrl-C) leaves the engine ready
        for the next call.

        Text is exact UTF-8 (:class:`~edgespec.core.textstream.TextStream`): only committed tokens'
        bytes are decoded (never a draft's before it is accepted), and a character split across
        tokens appears with the token that completes it, never as U+FFFD meanwhile. If
        generation ends inside a character (``max_tokens``, an end-of-generation token, a full
        context), its incomplete bytes show as one U+FFFD at the very end of the last chunk.
        """
        sampling = sampling or SamplingParams()
        if isinstance(stop, str):
            stop = [stop]
        logprobs = validate_logprobs(logprobs)
        constraint = make_constraint(constraint, json_schema, json_object, grammar)
        if tools is not None or tool_choice is not None:
            from . import tools as tooling

            tooling.check_tools(tools, tool_choice)
            # (llguidance's tokenizer says whether <tool_call> is a token of its own)
            requires = tool_choice == "required" or isinstance(tool_choice, dict)
            called = tooling.tool_constraint(
                tools, tool_choice, self._tool_family(),
                tokenizer=self.target.constraint_tokenizer if requires else None)
            if called is not None:
                if constraint is not None:
                    raise ConfigError("a tool_choice that requires a call cannot be combined "
                                      "with another constraint")
                constraint = called
            if tool_choice == "none":
                tools = None
        n_vocab = self.target.n_vocab
        for token, _ in sampling.logit_bias:
            if token >= n_vocab:
                raise ConfigError(f"logit_bias names token {token}, past the vocabulary "
                                  f"({n_vocab} tokens)")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        name = check_drafter_name(drafter or self.drafter_name)
        k = effective_draft_length(
            name, validate_draft_length(self.draft_length if draft_length is None else draft_length))
        matcher = (Matcher(constraint, self.target.constraint_tokenizer, n_vocab)
                   if constraint is not None else None)
        guide = (Guide(sampling, matcher, logprobs=logprobs, is_eog=self.target.is_eog)
                 if matcher is not None or sampling.shaped or logprobs is not None else None)
        policy = self._policy() if name == "auto" else None
        drafter_obj = make_drafter(name, self.draft, n_vocab, policy=policy,
                                   max_ngram=self.max_ngram, min_ngram=self.min_ngram,
                                   draft_window=self.draft_window, guide=guide)
        tokens = self.prompt_tokens(prompt, chat=chat, system=system, tools=tools)
        if len(tokens) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(tokens)} tokens but the context holds {self.target.n_ctx}: "
                "shorten it or raise --ctx"
            )
        with self._exclusive():
            if name != "auto":  # (auto's widths, up to its longest draft, warm in calibrate)
                self._warm(1 if name == "none" else k + 1, draft=name in ("model", "hybrid"))
            yield from self._generate(tokens, drafter_obj, k, sampling, max_tokens, stop, guide)

    def complete(self, prompt: Prompt, **kwargs) -> Completion:
        """Generate the whole completion (same arguments as :meth:`stream`). With ``tools``,
        the calls the model made are parsed into :attr:`Completion.tool_calls` (OpenAI's
        shape; ``finish_reason`` ``"tool_calls"``) and the text outside them is
        :attr:`Completion.content`."""
        collected = Collector()
        chunk = None
        for chunk in self.stream(prompt, **kwargs):
            collected.add(chunk)
        assert chunk is not None and chunk.finish_reason is not None
        done = collected.completion(chunk.finish_reason)
        if kwargs.get("tools") and kwargs.get("tool_choice") != "none":
            from . import tools as tooling

            done.content, done.tool_calls = tooling.parse_tool_calls(done.text, self._tool_family())
            if done.tool_calls and done.finish_reason == "stop":  # (a cut call stays "length")
                done.finish_reason = "tool_calls"
        return done

    def _tool_family(self) -> str:
        """How the target's chat template writes tool calls (:func:`~edgespec.runtime.tools.tool_family`)."""
        from .tools import tool_family

        metadata = getattr(self.target, "metadata", None)
        return tool_family(metadata().get("tokenizer.chat_template", "") if metadata else "")

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise EngineBusyError("this engine is already generating; wait for it or use another engine")
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._lock.release()

    def _generate(self, prompt, drafter, k, sampling, max_tokens, stop, guide) -> Iterator[Chunk]:
        target = self.target
        clock = self.clock
        stats = Stats(prompt_tokens=len(prompt))
        start = clock()
        stats.cached_prompt_tokens = prefill(target, prompt)
        wants = getattr(drafter, "wants_prompt_cached", None)
        if self.draft is not None and wants is not None and wants(k):
            prefill(self.draft, prompt)  # the draft's prefill is prefill too, not drafting time
        stats.time_prefill = clock() - start
        llama_start = self._llama_seconds()
        text = TextStream(stop)
        rng = make_rng(sampling.seed)
        finish = None
        costs = self.costs.calibrated if self.costs is not None else None
        played = rounds(target, drafter, prompt, sampling, rng, k, stats, max_tokens, costs, clock,
                        guide)
        try:
            for rnd in played:
                infos: list[TokenInfo] = []
                lps = rnd.logprobs
                for j, (tok, src) in enumerate(zip(rnd.tokens, rnd.sources)):
                    if target.is_eog(tok):
                        finish, stats.eog = "stop", True
                        break
                    stats.generated += 1
                    piece = text.push(target.token_bytes(tok))
                    infos.append(TokenInfo(tok, piece, src) if lps is None
                                 else TokenInfo(tok, piece, src, lps[j][0], lps[j][1]))
                    if text.stopped:
                        finish = "stop"
                        break
                    if stats.generated >= max_tokens:
                        finish = "length"
                        break
                stats.time_total = clock() - start
                stats.time_llama = self._llama_seconds() - llama_start
                if finish:
                    tail = text.flush()
                    if tail and infos:
                        last = infos[-1]
                        infos[-1] = TokenInfo(last.id, last.text + tail, last.source, last.logprob,
                                              last.top_logprobs)
                        tail = ""
                    yield Chunk("".join(i.text for i in infos) + tail, infos, stats, finish)
                    return
                yield Chunk("".join([i.text for i in infos]), infos, stats)  # (no generator)
            stats.time_total = clock() - start
            stats.time_llama = self._llama_seconds() - llama_start
            yield Chunk(text.flush(), [], stats, "context")
        finally:
            played.close()  # at once when the caller stops: a round launched ahead is waited for

    def _llama_seconds(self) -> float:
        # (asked every round: no generator, which costs several µs in the cold caches after
        # a decode)
        seconds = getattr(self.target, "decode_seconds", 0.0)
        if self.draft is not None:
            seconds += getattr(self.draft, "decode_seconds", 0.0)
        return seconds
