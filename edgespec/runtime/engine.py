"""The public engine: load a target (and draft), stream exact speculative completions.

Layers, each a generator over the one below (as in mlx-lm):
``loop.speculate`` (tokens per verification round) -> ``Engine.stream`` (text chunks with
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

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
from . import sources
from .guide import Guide
from .loop import Generation, prefill, speculate
from .options import (  # (exact_width: also the engine's for its callers)
    TOOL_CHOICE,
    LoadOptions,
    exact_width,  # noqa: F401
    one_constraint,
    validate_draft_length,
    validate_draft_window,
)

log = logging.getLogger(__name__)

Prompt = str | Sequence[dict[str, str]]


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
                    json_object: bool = False, grammar: str | None = None, *,
                    tool_call: Constraint | None = None) -> Constraint | None:
    """The one constraint a generation asked for (``tool_call``: the call its tool_choice
    requires), or None; a ConfigError if it asked for more than one."""
    chosen = one_constraint([
        ("constraint", constraint),
        ("json_schema", Constraint.json_schema(json_schema) if json_schema is not None else None),
        ("json_object", Constraint.json_object() if json_object else None),
        ("grammar", Constraint.grammar(grammar) if grammar is not None else None),
        (TOOL_CHOICE, tool_call)])
    return chosen[1] if chosen is not None else None


def check_prompt(prompt: Prompt) -> None:
    """Raise :class:`ConfigError` for an empty prompt: blank text, or no messages. Cheap, so
    callers can check before loading any model."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError("the prompt is empty")
    elif not prompt:
        raise ConfigError("the conversation is empty")


def effective_draft_length(drafter: str, k: int | None) -> int:
    """The per-round cap: ``k`` if the user set it, else the source's default
    (:func:`~edgespec.runtime.sources.default_length`)."""
    return k if k is not None else sources.default_length(drafter)


def _note(progress: bool, message: str) -> None:
    """A one-line note: logged, and on stderr when progress output is wanted."""
    log.info(message)
    if progress:
        print(f"note: {message}", file=sys.stderr, flush=True)


def _mtp_head(target):
    """(the MTP head, its hidden rows) on a target loaded with its MTP layers, the rows hooked
    to the target's calls; None for any other target."""
    if not getattr(target, "load_mtp", False):
        return None
    from .mtp import MtpHead
    from .sources.mtp import HiddenRows

    head = MtpHead(target.model, target.context._ctx.ctx)
    rows = HiddenRows(head)
    target.context.on_call = rows
    return head, rows


def _note_reach(target, progress: bool) -> None:
    """Say once, at load, how far a target with recurrent layers lets a round draft."""
    reach = getattr(target, "draft_reach", None)
    if reach == 0:
        _note(progress, "this model's recurrent layers keep no snapshots to roll back a "
                        "rejected draft (model or build): it decodes plainly")
    elif reach is not None and capabilities(target).asynchronous:
        _note(progress, f"hybrid model (recurrent layers): drafts of at most {reach} tokens, "
                        "what one call's snapshots take back")
    elif reach is not None:
        _note(progress, f"hybrid model (recurrent layers): a round's drafts are judged "
                        f"{reach + 1} a call, whose snapshots take back {reach}")


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
class _Files:
    """The models a load found: the target's name and file, and the draft's file (``None``:
    none named, or the drafter uses no draft model)."""

    target: str
    target_path: Path
    draft_path: Path | None


def _load_options(target, draft, options: LoadOptions | None, keywords: dict) -> LoadOptions:
    """The record a load asked for: ``options``, or one built from the keywords; a ``target``
    or ``draft`` given beside it wins over its own. Keywords beside a record are refused (which
    would win, and over which filled-in default, is not for a caller to guess)."""
    named = {key: value for key, value in (("target", target), ("draft", draft))
             if value is not None}
    if options is None:
        return LoadOptions(**named, **keywords)
    if keywords:
        raise TypeError(f"Engine.load takes options or keywords, not both: {', '.join(keywords)}")
    return replace(options, **named) if named else options


def _find_models(options: LoadOptions, download: bool, progress: bool) -> _Files:
    """The files to load, fetched before anything loads. A draft the drafter will not use is
    checked all the same (not fetched): a typo still deserves an error."""
    from ..models.catalog import resolve_pair
    from ..models.resolve import check_model_argument, resolve_model

    target, draft = options.target, options.draft
    uses_draft = sources.spec(options.drafter).uses_draft_model
    if draft is not None and not uses_draft:
        check_model_argument(draft)
    if target is None:
        chosen = resolve_pair(options.pair)
        target, draft = chosen.target, draft if draft is not None else chosen.draft
    target_path = resolve_model(str(target), download=download, progress=progress)
    draft_path = None
    if draft is not None and uses_draft:
        draft_path = resolve_model(str(draft), download=download, progress=progress)
    return _Files(str(target), target_path, draft_path)


def _load_draft(target_be, files: _Files, options: LoadOptions, download: bool, progress: bool):
    """The draft backend (or None) and the pick behind it (None where the user named one or
    there was none to pick). Without a draft file one is picked once the target has loaded
    (a file llama.cpp refuses needs no draft); a picked draft that turns out incompatible is
    said and dropped, the user's own raises."""
    from ..models.drafts import DraftChoice
    from .backend import LlamaBackend, check_compatible

    choice, draft_path = None, files.draft_path
    if draft_path is None:
        choice, draft_path = _pick_draft(files.target, files.target_path, download, progress)
        if draft_path is None:
            return None, choice
    same_file = draft_path.resolve() == files.target_path.resolve()
    draft_be = LlamaBackend(options.draft_options(draft_path, same_file))
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
        #: the target's MTP head and the hidden rows it reads, where its GGUF has MTP layers
        #: (loaded with them): the ``mtp`` source's (:mod:`edgespec.runtime.sources.mtp`)
        self.mtp: tuple | None = _mtp_head(target)
        sources.check_usable(drafter, draft is not None, self.mtp is not None)
        self.drafter_name = drafter
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
    def load(cls, target: str | os.PathLike | None = None, draft: str | os.PathLike | None = None,
             *, options: LoadOptions | None = None, download: bool = True, progress: bool = True,
             **keywords: Any) -> "Engine":
        """Load the models ``options`` names (or the keywords, :class:`LoadOptions`' fields,
        checked before any model is looked for); catalog and hub models are fetched on first
        use (``download``), with progress on stderr (``progress``).

        With an explicit target and no draft, a drafter that uses a draft model (``auto``,
        ``model``, ``hybrid``) gets one picked for the target
        (:func:`edgespec.models.drafts.choose_draft`: the catalog's pair, else the smallest
        catalog draft with the target's tokenizer); when none fits, drafting is by lookup only.
        The pick and why are in :attr:`draft_choice` (``None`` when no pick was made) and, with
        ``progress``, said on stderr. The draft model is only loaded when the drafter uses it.
        A draft that is the target's own file always drafts from its whole rows, so that
        q == p. With drafter ``auto`` the costs are measured right after loading
        (:meth:`calibrate`).
        """
        from .backend import LlamaBackend

        options = _load_options(target, draft, options, keywords)
        files = _find_models(options, download, progress)
        target_be = LlamaBackend(options.target_options(files.target_path))
        draft_be = None
        try:
            _note_reach(target_be, progress)
            if sources.spec(options.drafter).uses_draft_model:
                draft_be, choice = _load_draft(target_be, files, options, download, progress)
            else:
                choice = None
            engine = cls._around(target_be, draft_be, options)
            engine.draft_choice = choice
            if sources.spec(engine.drafter_name).chooser:  # (it plays by measured costs)
                engine.calibrate()
            return engine
        except BaseException:
            if draft_be is not None:
                draft_be.close()
            target_be.close()
            raise

    @classmethod
    def _around(cls, target_be, draft_be, options: LoadOptions) -> "Engine":
        """The engine over loaded models, drafting as ``options`` asks; ``model`` and ``hybrid``
        draft by lookup where no draft model was found (said when it was found missing)."""
        drafter = options.drafter if draft_be is not None else \
            sources.without_draft_model(options.drafter)
        return cls(target_be, draft_be, drafter=drafter, draft_length=options.draft_length,
                   max_ngram=options.max_ngram, min_ngram=options.min_ngram,
                   draft_window=options.draft_window)

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
            draft_cost = self._paid_cost(clock)
            self.costs = Costs(target, draft_cost, clock() - start)
        return self.costs

    def _paid_cost(self, clock: Clock) -> float | None:
        """Seconds per token of ``auto``'s paid source: the MTP head's where the target has
        one (the registry offers it first), else the draft model's; None without either."""
        if self.mtp is not None:
            from .sources.mtp import measure_step

            return measure_step(self.mtp[0], n=3, repeats=config.CALIBRATION_REPEATS)
        if self.draft is None:
            return None
        return measure_draft_cost(self.draft, n=3, repeats=config.CALIBRATION_REPEATS,
                                  budget_s=config.DRAFT_CALIBRATION_BUDGET_S, clock=clock)

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
        return Policy(costs.target, costs.draft, self.policy_config, max_ngram=self.max_ngram)

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
        if self.mtp is not None:  # (before the target's context)
            self.target.context.on_call = None
            self.mtp[0].close()
            self.mtp = None
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
        (with ``tools``, the template is given them). A model without a chat template (a base
        model, a synthetic one) takes a string as it is: there is no template to apply."""
        check_prompt(prompt)
        if isinstance(prompt, str):
            if not chat or not getattr(self.target, "has_chat_template", True):
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
        stop = [stop] if isinstance(stop, str) else stop
        logprobs = validate_logprobs(logprobs)
        constraint = make_constraint(constraint, json_schema, json_object, grammar,
                                     tool_call=self._tool_call(tools, tool_choice))
        if tool_choice == "none":
            tools = None
        self._check_request(sampling, max_tokens)
        name = sources.check_name(drafter or self.drafter_name)
        k = effective_draft_length(
            name, validate_draft_length(self.draft_length if draft_length is None else draft_length))
        guide = self._guide(sampling, constraint, logprobs)
        made = self._source(name, guide)
        tokens = self._prompt_in_context(prompt, chat, system, tools)
        with self._exclusive():
            self._warm_for(sources.spec(name), k)
            costs = self.costs.calibrated if self.costs is not None else None
            gen = Generation(sampling, k, max_tokens, costs, self.clock, guide)
            yield from self._generate(tokens, made, gen, stop)

    def _check_request(self, sampling: SamplingParams, max_tokens: int) -> None:
        """A ConfigError for what only this engine's models can judge in a request."""
        n_vocab = self.target.n_vocab
        for token, _ in sampling.logit_bias:
            if token >= n_vocab:
                raise ConfigError(f"logit_bias names token {token}, past the vocabulary "
                                  f"({n_vocab} tokens)")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")

    def _guide(self, sampling: SamplingParams, constraint: Constraint | None,
               logprobs: int | None) -> Guide | None:
        """The generation's row shaping, or None where rows are used as they come."""
        matcher = (Matcher(constraint, self.target.constraint_tokenizer, self.target.n_vocab)
                   if constraint is not None else None)
        if matcher is None and not sampling.shaped and logprobs is None:
            return None
        return Guide(sampling, matcher, logprobs=logprobs, is_eog=self.target.is_eog)

    def _source(self, name: str, guide: Guide | None) -> sources.Drafter:
        """The source ``name`` for one generation (``auto`` with a policy of its own, on the
        engine's costs)."""
        kit = sources.Kit(self.draft, self.target.n_vocab, self.max_ngram, self.min_ngram,
                          self.draft_window, guide,
                          self._policy() if sources.spec(name).chooser else None, mtp=self.mtp)
        return sources.make_source(name, kit)

    def _prompt_in_context(self, prompt: Prompt, chat: bool, system: str | None,
                           tools: list[dict] | None) -> list[int]:
        """The prompt's tokens; a ContextOverflowError where they leave no room to answer."""
        tokens = self.prompt_tokens(prompt, chat=chat, system=system, tools=tools)
        if len(tokens) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(tokens)} tokens but the context holds {self.target.n_ctx}: "
                "shorten it or raise --ctx"
            )
        return tokens

    def _warm_for(self, source: "sources.SourceSpec", k: int) -> None:
        """The call widths a fixed source plays, run once (``auto``'s, up to its longest
        draft, warm in :meth:`calibrate`)."""
        if not source.chooser:
            self._warm(k + 1 if source.drafts else 1, draft=source.requires_draft_model)

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
            done.finish_reason = tooling.call_finish_reason(done.finish_reason, bool(done.tool_calls))
        return done

    def _tool_call(self, tools: list[dict] | None, tool_choice: str | dict | None) -> Constraint | None:
        """The constraint that makes the answer the call ``tool_choice`` requires (None: the
        model is free); llguidance's tokenizer, made only then, says whether ``<tool_call>``
        is a token of its own."""
        if tools is None and tool_choice is None:
            return None
        from . import tools as tooling

        tooling.check_tools(tools, tool_choice)  # (before the tokenizer: a second's work)
        tokenizer = self.target.constraint_tokenizer if tooling.requires_call(tool_choice) else None
        return tooling.tool_constraint(tools, tool_choice, self._tool_family(), tokenizer=tokenizer)

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

    def _generate(self, prompt: list[int], drafter: sources.Drafter, gen: Generation,
                  stop: Sequence[str]) -> Iterator[Chunk]:
        target = self.target
        max_tokens = gen.max_new_tokens
        clock = self.clock
        stats = Stats(prompt_tokens=len(prompt))
        start = clock()
        stats.cached_prompt_tokens = prefill(target, prompt)
        if self.draft is not None and drafter.wants_prompt_cached(gen.draft_length):
            prefill(self.draft, prompt)  # the draft's prefill is prefill too, not drafting time
        stats.time_prefill = clock() - start
        llama_start = self._llama_seconds()
        text = TextStream(stop)
        finish = None
        played = speculate(target, drafter, prompt, gen, make_rng(gen.params.seed), stats)
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
