"""``edgespec`` command line: ``complete``, ``models``, ``info`` (``chat`` and ``serve`` are
registered at the end)."""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from . import config
from .cli_models import models, user_errors
from .drafters import DRAFTER_NAMES
from .errors import ConfigError, EdgespecError

if TYPE_CHECKING:  # the engine imports numpy: only load it when a command needs it
    from .engine import Collector

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="edgespec")
def cli() -> None:
    """edgespec: exact speculative decoding of local GGUF models.

    Faster answers from the same model: a cheap drafter proposes tokens, the target model
    checks them in one batch, and an exact rejection sampler keeps the output distribution
    identical to the target's.
    """


cli.add_command(models)


def model_options(func):
    """Options shared by every command that loads models."""
    options = [
        click.option("--pair", default=config.DEFAULT_PAIR, show_default=True,
                     help="Catalog pair giving target and draft (see `edgespec models list`)."),
        click.option("--target", "-m", metavar="NAME|PATH",
                     help="Target model: catalog name or GGUF path (overrides --pair)."),
        click.option("--draft", "-d", "draft", metavar="NAME|PATH",
                     help="Draft model: catalog name or GGUF path (default: the pair's draft)."),
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
        click.option("--ngl", "n_gpu_layers", type=click.IntRange(-1), default=0, show_default=True,
                     help="Target layers offloaded to the GPU (-1 = all)."),
        click.option("--draft-ngl", "draft_n_gpu_layers", type=click.IntRange(-1), default=None,
                     help="Draft layers offloaded to the GPU (default: same as --ngl)."),
        click.option("--threads", "-t", type=click.IntRange(1), default=None,
                     help=f"CPU threads (default: {config.default_threads()}, one per core)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(16), default=config.DEFAULT_N_CTX,
                     show_default=True, help="Context window in tokens (prompt + answer)."),
        click.option("--fast-kernels", is_flag=True,
                     help="Use llama.cpp's fastest CPU kernels even though their logits depend on "
                          "batch size (greedy output may then differ from plain decoding at "
                          "near-ties)."),
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
    from .backend import set_verbose
    from .engine import Engine

    set_verbose(opts["verbose"])
    return Engine.load(
        opts["target"],
        opts["draft"],
        pair=opts["pair"],
        drafter=opts["drafter"],
        draft_length=opts["draft_length"],
        max_ngram=opts["max_ngram"],
        min_ngram=opts["min_ngram"],
        n_gpu_layers=opts["n_gpu_layers"],
        draft_n_gpu_layers=opts["draft_n_gpu_layers"],
        n_threads=opts["threads"],
        n_ctx=opts["n_ctx"],
        batch_consistent=not opts["fast_kernels"],
        progress=progress,
    )


def make_sampling(opts: dict):
    from .sampling import SamplingParams

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


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("prompt", required=False)
@model_options
@sampling_options
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=config.DEFAULT_MAX_TOKENS,
              show_default=True, help="Stop after this many generated tokens.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chat/--raw", default=True, show_default=True,
              help="Apply the model's chat template, or send the prompt as is.")
@click.option("--system", default=None, help="System message (chat mode).")
@click.option("--stats", "show_stats", is_flag=True, help="Print a stats line to stderr.")
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object {"text", "finish_reason", "tokens", "stats"}.')
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@user_errors
def complete(prompt, max_tokens, stop, chat, system, show_stats, as_json, debug, **opts) -> None:
    """Complete PROMPT (or standard input) and stream the answer to stdout."""
    run = _Run()
    try:
        _complete(run, prompt, max_tokens, stop, chat, system, show_stats, as_json, opts)
    except EdgespecError:
        if debug:
            traceback.print_exc()
        raise  # user_errors prints the one-line message and exits with its code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        # The text already printed stays; with --json, the object says what there was.
        collected = run.collected
        if as_json and collected is not None:
            click.echo(_json(collected.completion("interrupted").to_dict()))
        sys.stdout.flush()
        summary = (f" {collected.stats.summary()}"
                   if show_stats and collected is not None and collected.stats is not None else "")
        click.echo(f"\n[interrupted]{summary}", err=True)
        sys.exit(130)


def _json(obj: dict) -> str:
    """One JSON line, ASCII-escaped where stdout cannot carry UTF-8, so nothing is lost there."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return json.dumps(obj, ensure_ascii=encoding != "utf8")


@dataclass
class _Run:
    """What one ``complete`` has produced so far, so that Ctrl-C can report it."""

    collected: Collector | None = None  #: set once the models are loaded


def _complete(run: _Run, prompt, max_tokens, stop, chat, system, show_stats, as_json, opts) -> None:
    from .engine import Collector, check_prompt

    text = read_prompt(prompt)
    check_prompt(text)  # validate before loading models
    sampling = make_sampling(opts)
    with load_engine(opts, progress=not as_json) as engine:
        kwargs = dict(max_tokens=max_tokens, sampling=sampling, stop=list(stop), chat=chat,
                      system=system)
        collected = run.collected = Collector()
        chunk = None
        for chunk in engine.stream(text, **kwargs):
            collected.add(chunk)
            if not as_json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        assert chunk is not None and chunk.finish_reason is not None
        if as_json:
            click.echo(_json(collected.completion(chunk.finish_reason).to_dict()))
            return
        sys.stdout.write("\n")
        if show_stats or chunk.finish_reason == "context":
            note = "" if chunk.finish_reason != "context" else " [context window full]"
            click.echo(f"[{chunk.finish_reason}] {chunk.stats.summary()}{note}", err=True)


@cli.command(context_settings=CONTEXT_SETTINGS)
def info() -> None:
    """Show the llama.cpp build, batch consistency, GPU offload and cache location."""
    from .backend import consistent_build, gpu_offload_supported, system_info

    features = system_info()
    click.echo(f"cache dir:        {config.cache_dir()}")
    click.echo(f"threads:          {config.default_threads()}")
    click.echo(f"GPU offload:      {'yes' if gpu_offload_supported() else 'no (CPU-only build)'}")
    click.echo(
        "batch-consistent: "
        + ("yes (llamafile sgemm not compiled in)" if consistent_build()
           else "no: this llama.cpp has llamafile's sgemm; rebuild with `make setup`")
    )
    click.echo("features:         " + " ".join(k for k, v in features.items() if v == "1"))


# `edgespec chat` lives in tui/; registered last because it reuses this module's options.
from tui.cli import add_chat_command  # noqa: E402

add_chat_command(cli)

# `edgespec bench` (edgespec/bench_cli.py) reuses the shared options too.
from .bench_cli import add_bench_command  # noqa: E402

add_bench_command(cli)

# `edgespec serve` lives in edgespec/server/ (registered the same way as chat).
from edgespec.server.cli import add_serve_command  # noqa: E402

add_serve_command(cli)

# `edgespec verify` (edgespec/verify_cli.py): the exactness audit.
from .verify_cli import add_verify_command  # noqa: E402

add_verify_command(cli)


def main() -> None:
    # A terminal or pipe that is not UTF-8 (a latin-1 locale, a Windows console) shows what it
    # can of the model's text instead of crashing on its first emoji.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    cli(prog_name="edgespec")


if __name__ == "__main__":
    main()
