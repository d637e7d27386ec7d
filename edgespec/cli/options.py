"""What the ``edgespec`` subcommands share: click settings and options, loading an engine from
them, reading the prompt, and turning user errors into one ``error:`` line."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import click

from .. import config
from ..errors import ConfigError, EdgespecError
from ..runtime.drafters import DRAFTER_NAMES
from ..runtime.rpc import DEFAULT_RPC_TIMEOUT_S

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Print :class:`EdgespecError` as ``error: <message>`` and exit with its code, no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EdgespecError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def model_options(func):
    """Options shared by every command that loads models."""
    options = [
        click.option("--pair", default=config.DEFAULT_PAIR, show_default=True,
                     help="Catalog pair giving target and draft (see `edgespec models list`)."),
        click.option("--target", "-m", metavar="MODEL",
                     help="Target model (overrides --pair): a catalog name, a hub reference "
                          "OWNER/REPO[:QUANT] (Q4_K_M by default) or OWNER/REPO/FILE.gguf, or a "
                          "GGUF path."),
        click.option("--draft", "-d", "draft", metavar="MODEL",
                     help="Draft model, given as --target is (default: the pair's draft; with "
                          "--target, the catalog draft that fits it: see `edgespec models drafts`)."),
        click.option("--drafter", type=click.Choice(DRAFTER_NAMES), default=config.DEFAULT_DRAFTER,
                     show_default=True, help="Who proposes tokens: `auto` picks plain decoding, lookup or the draft "
                          "model (and k) each round by measured cost; `none` is plain decoding."),
        click.option("--draft-length", "-k", type=click.IntRange(0, config.MAX_DRAFT_LENGTH),
                     default=None,
                     help=f"Tokens drafted per round [default: auto chooses 0-"
                          f"{config.AUTO_MAX_DRAFT_LENGTH} each round; other drafters "
                          f"{config.DEFAULT_DRAFT_LENGTH}]. With auto, a cap."),
        click.option("--max-ngram", type=click.IntRange(1, 64), default=config.DEFAULT_MAX_NGRAM,
                     show_default=True, help="Longest n-gram prompt lookup matches."),
        click.option("--min-ngram", type=click.IntRange(1, 64), default=config.DEFAULT_MIN_NGRAM,
                     show_default=True, help="Shortest n-gram prompt lookup accepts as a match."),
        click.option("--draft-window", type=click.IntRange(0), default=config.DRAFT_WINDOW,
                     show_default=True,
                     help="A sampled draft model proposes from its this many most likely tokens "
                          "(exact for any window; 0 = its whole row, slower)."),
        click.option("--ngl", "n_gpu_layers", type=click.IntRange(-1), default=None,
                     help="Target layers offloaded to the GPU or the --rpc workers (-1 = all) "
                          "[default: 0; all with --rpc]."),
        click.option("--draft-ngl", "draft_n_gpu_layers", type=click.IntRange(-1), default=None,
                     help="Draft layers offloaded (default: all with --draft-rpc, none when the "
                          "target is on workers, else as --ngl)."),
        click.option("--rpc", metavar="HOST:PORT[,...]", default=None,
                     help="Put the target's layers on these `edgespec worker` processes "
                          "(llama.cpp RPC: trusted networks only)."),
        click.option("--draft-rpc", metavar="HOST:PORT[,...]", default=None,
                     help="Put the draft's layers on these workers (default: the draft runs here)."),
        click.option("--tensor-split", metavar="W[,W...]", default=None,
                     help="Share the target's offloaded layers by weight: the --rpc workers' "
                          "devices in order, then this machine's GPUs (see `edgespec info --rpc`)."),
        click.option("--rpc-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULT_RPC_TIMEOUT_S,
                     show_default=True,
                     help="Seconds one call to the workers may take before giving up on them."),
        click.option("--threads", "-t", type=click.IntRange(1), default=None,
                     help=f"CPU threads (default: {config.default_threads()}, one per core)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(16), default=config.DEFAULT_N_CTX,
                     show_default=True, help="Context window in tokens (prompt + answer)."),
        click.option("--fast-kernels", is_flag=True,
                     help="Use llama.cpp's fastest CPU kernels even though their logits depend on "
                          "batch size (greedy output may then differ from plain decoding at "
                          "near-ties)."),
        click.option("--fixed-width", type=click.IntRange(0, config.MAX_FIXED_WIDTH), default=0,
                     metavar="W",
                     help="Make every target call that reads logits exactly W tokens wide (pads "
                          "removed after it): greedy speculation then equals plain decoding bit for "
                          "bit on a GPU too, where kernels depend on batch width; each plain step "
                          "costs a W-wide call. 0 = off [default: 0]."),
        click.option("--exact", is_flag=True,
                     help="Greedy speculation equal to plain decoding bit for bit wherever the "
                          "target runs: on this CPU it already is; with layers on a GPU or RPC "
                          f"workers this is --fixed-width {config.EXACT_FIXED_WIDTH} (a plain "
                          "step then costs a wide call: README, Exactness)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's own log."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def sampling_options(func):
    options = [
        click.option("--temperature", "--temp", type=float, default=config.DEFAULT_TEMPERATURE,
                     show_default=True, help="0 = greedy."),
        click.option("--top-k", type=int, default=config.DEFAULT_TOP_K, show_default=True,
                     help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=config.DEFAULT_TOP_P, show_default=True,
                     help="Nucleus mass in (0, 1] (1 = off)."),
        click.option("--min-p", type=float, default=config.DEFAULT_MIN_P, show_default=True,
                     help="Drop tokens below this fraction of the top probability (0 = off)."),
        click.option("--seed", type=int, default=None, help="Seed for reproducible sampling."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_engine(opts: dict, *, progress: bool = True):
    """Load an Engine from the shared model options."""
    from ..runtime.backend import set_verbose
    from ..runtime.engine import Engine

    set_verbose(opts["verbose"])
    return Engine.load(
        opts["target"],
        opts["draft"],
        pair=opts["pair"],
        drafter=opts["drafter"],
        draft_length=opts["draft_length"],
        max_ngram=opts["max_ngram"],
        min_ngram=opts["min_ngram"],
        draft_window=opts["draft_window"],
        n_gpu_layers=opts["n_gpu_layers"],
        draft_n_gpu_layers=opts["draft_n_gpu_layers"],
        rpc=opts["rpc"],
        draft_rpc=opts["draft_rpc"],
        rpc_timeout=opts["rpc_timeout"],
        tensor_split=opts["tensor_split"],
        n_threads=opts["threads"],
        n_ctx=opts["n_ctx"],
        batch_consistent=not opts["fast_kernels"],
        fixed_width=opts["fixed_width"],
        exact=opts.get("exact", False),
        progress=progress,
    )


def make_sampling(opts: dict):
    from ..core.sampling import SamplingParams

    return SamplingParams(temperature=opts["temperature"], top_k=opts["top_k"],
                          top_p=opts["top_p"], min_p=opts["min_p"], seed=opts["seed"])


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or standard input when it is absent or ``-``."""
    if prompt is not None and prompt != "-":
        return prompt
    if sys.stdin.isatty():
        raise ConfigError("no prompt: pass it as an argument or on standard input")
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"standard input is not valid UTF-8 (byte {err.start})") from None
