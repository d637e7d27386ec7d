"""What a user may ask of the engine, each rule checked in one place.

:class:`LoadOptions` is everything :meth:`~edgespec.runtime.engine.Engine.load` needs, checked
and with its defaults filled in when it is made: the command line, the Python API and the
server's loader build the same record, and each model's
:class:`~edgespec.runtime.backend.ModelOptions` comes from it, so no value is copied key by key
on the way down. The rules a generation's own options share among engine, command line and
server live here too (:func:`validate_draft_length`, :func:`one_constraint`), so that a value
one face accepts no other refuses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

from .. import config
from ..errors import ConfigError
from . import sources
from .sources.lookup import check_ngram_sizes
from .rpc import DEFAULT_RPC_TIMEOUT_S

T = TypeVar("T")

#: the name :func:`one_constraint` knows as a tool call a ``tool_choice`` requires
TOOL_CHOICE = "tool_choice"


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


class ConstraintConflict(ConfigError):
    """More than one constraint was asked for; ``name`` is the second one given (the one a
    reply names as the parameter to drop)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


def one_constraint(given: Sequence[tuple[str, T | None]]) -> tuple[str, T] | None:
    """The one constraint among ``given`` (each named as its face calls it: an option, a
    keyword, a request field; ``None`` where not asked), with its name, or None where none
    was asked; :class:`ConstraintConflict` naming two where more than one was. A call that a
    ``tool_choice`` requires is a constraint too, named :data:`TOOL_CHOICE`: a caller that
    has not built it yet may pass any stand-in."""
    asked = [(name, value) for name, value in given if value is not None]
    if len(asked) < 2:
        return asked[0] if asked else None
    (first, _), (second, _) = asked[:2]
    if second == TOOL_CHOICE:
        raise ConstraintConflict(f"a tool_choice that requires a call cannot be combined with "
                                 f"{first}", second)
    names = [name for name, _ in given if name != TOOL_CHOICE]
    raise ConstraintConflict(f"give one of {', '.join(names[:-1])} and {names[-1]}, not {first} "
                             f"and {second} (one constraint at most)", second)


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


#: click's keys (:func:`edgespec.cli.options.model_options`) that are a field's own name
_CLI_FIELDS = ("target", "draft", "pair", "drafter", "draft_length", "max_ngram", "min_ngram",
               "draft_window", "n_gpu_layers", "draft_n_gpu_layers", "rpc", "draft_rpc",
               "rpc_timeout", "tensor_split", "n_ctx", "fixed_width")


@dataclass(frozen=True)
class LoadOptions:
    """Which models to load, how to draft, and where and how each model runs.

    Made, it is checked (a :class:`ConfigError` naming the first bad value, before any model
    is looked for) and its defaults are filled in, so what it holds is what loads; a record
    built from a filled one's fields is equal to it.

    Models: ``target`` and ``draft`` (catalog name, hub reference ``OWNER/REPO[:QUANT]`` or
    ``OWNER/REPO/FILE.gguf``, or a GGUF path); with no ``target``, the catalog pair ``pair``
    gives both. Drafting: ``drafter``; ``draft_length`` (``None``: ``auto`` chooses k each
    round, fixed drafters use DEFAULT_DRAFT_LENGTH); lookup's n-gram sizes; ``draft_window``:
    a sampled draft model proposes from its this many most likely tokens (0: its whole row;
    the output's distribution is the target's either way, see
    :func:`edgespec.core.sampling.draft_distribution`).

    Placement: ``rpc`` (``"HOST:PORT,..."`` or a list) puts the target's offloaded layers on
    those ``edgespec worker`` processes, ``draft_rpc`` the draft's (by default the draft runs
    here); both are kept as tuples. ``n_gpu_layers`` becomes every layer (-1) with ``rpc``,
    else none; ``draft_n_gpu_layers`` every layer with ``draft_rpc``, else none when the target
    is on workers, else ``n_gpu_layers``. ``tensor_split`` (``"3,1"`` or numbers) shares the
    target's offloaded layers among its devices by weight: the workers' devices in ``rpc``
    order, then this machine's GPUs (``edgespec info --rpc``); without it they go to the
    workers only (or, locally, as llama.cpp shares them by free memory). A call to the workers
    that outlives ``rpc_timeout`` seconds ends the process with one ``error:`` line (ggml
    cannot recover from it). ``n_threads`` becomes one per core.

    Exactness: ``batch_consistent`` makes the target's logits independent of how many tokens
    are scored per call on the CPU; ``fixed_width`` (tokens, 0 = off) does so on any device by
    making every target call that reads logits that wide (README, Exactness). ``exact`` asks
    for greedy speculation equal to plain decoding bit for bit wherever the target runs: the
    fixed width becomes :func:`exact_width`'s.
    """

    target: str | None = None
    draft: str | None = None
    pair: str = config.DEFAULT_PAIR
    drafter: str = config.DEFAULT_DRAFTER
    draft_length: int | None = None
    max_ngram: int = config.DEFAULT_MAX_NGRAM
    min_ngram: int = config.DEFAULT_MIN_NGRAM
    draft_window: int = config.DRAFT_WINDOW
    n_gpu_layers: int | None = None
    draft_n_gpu_layers: int | None = None
    rpc: tuple[str, ...] | str | None = None
    draft_rpc: tuple[str, ...] | str | None = None
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S
    tensor_split: tuple[float, ...] | str | None = None
    n_threads: int | None = None
    n_ctx: int = config.DEFAULT_N_CTX
    n_batch: int = config.DEFAULT_N_BATCH
    batch_consistent: bool = True
    fixed_width: int = 0
    exact: bool = False

    def __post_init__(self) -> None:
        self._check_drafting()
        self._place()

    @classmethod
    def from_cli(cls, opts: Mapping[str, Any]) -> "LoadOptions":
        """The record the shared model options ask for (click's keys: ``threads``,
        ``--fast-kernels`` the opposite of ``batch_consistent``; ``exact`` may be absent);
        keys of no model option (``verbose``, a command's own) are not read."""
        return cls(**{name: opts[name] for name in _CLI_FIELDS}, n_threads=opts["threads"],
                   batch_consistent=not opts["fast_kernels"], exact=opts.get("exact", False))

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _check_drafting(self) -> None:
        sources.check_name(self.drafter)
        validate_draft_length(self.draft_length)
        validate_draft_window(self.draft_window)
        check_ngram_sizes(self.max_ngram, self.min_ngram)
        self._set(**{name: os.fspath(value) for name, value in (("target", self.target),
                                                                ("draft", self.draft))
                     if value is not None})

    def _place(self) -> None:
        """Placement checked, its defaults filled in (see the class)."""
        from .backend import parse_tensor_split
        from .rpc import parse_endpoints

        threads = self.n_threads if self.n_threads is not None else config.default_threads()
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        if self.n_ctx < 16:
            raise ConfigError(f"context size must be >= 16 tokens, got {self.n_ctx}")
        rpc, draft_rpc = parse_endpoints(self.rpc), parse_endpoints(self.draft_rpc)
        split = parse_tensor_split(self.tensor_split)
        if not self.rpc_timeout > 0:
            raise ConfigError(f"RPC timeout must be > 0 seconds, got {self.rpc_timeout}")
        ngl = self.n_gpu_layers if self.n_gpu_layers is not None else -1 if rpc else 0
        draft_ngl = self.draft_n_gpu_layers
        if draft_ngl is None:
            draft_ngl = -1 if draft_rpc else (0 if rpc else ngl)
        width = (exact_width(self.fixed_width, self.batch_consistent, ngl, rpc) if self.exact
                 else self.fixed_width)
        self._set(n_threads=threads, rpc=rpc, draft_rpc=draft_rpc, tensor_split=split,
                  n_gpu_layers=ngl, draft_n_gpu_layers=draft_ngl, fixed_width=width)

    def target_options(self, path: Path):
        """How the target at ``path`` loads (:class:`~edgespec.runtime.backend.ModelOptions`),
        its multi-token-prediction layers too where it has some (the ``mtp`` source's)."""
        return self._model(path, self.n_gpu_layers, self.batch_consistent, self.fixed_width,
                           self.rpc, self.tensor_split, mtp=True)

    def draft_options(self, path: Path, same_file: bool):
        """Exactness needs only the target's logits to be batch-independent: the draft's q is
        whatever it samples from, so it keeps the fastest kernels. A draft that is the target's
        own file keeps the target's settings (and, in the Engine, its whole rows): q == p."""
        return self._model(path, self.draft_n_gpu_layers, self.batch_consistent and same_file,
                           self.fixed_width if same_file else 0, self.draft_rpc)

    def _model(self, path: Path, ngl: int, consistent: bool, width: int,
               workers: tuple[str, ...], split: tuple[float, ...] = (), *, mtp: bool = False):
        from .backend import ModelOptions

        # A worker's CPU computes without llama.cpp's repacked weights (the RPC server
        # allocates plain buffers): the pieces then follow the plain kernels (7 rows).
        return ModelOptions(path=path, n_gpu_layers=ngl, n_threads=self.n_threads,
                            n_ctx=self.n_ctx, n_batch=self.n_batch, batch_consistent=consistent,
                            rpc=workers, rpc_timeout=self.rpc_timeout, repack=not workers,
                            tensor_split=split, fixed_width=width, mtp=mtp)
