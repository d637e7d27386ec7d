"""The ``edgespec`` command group: ``complete`` and ``info`` here, and the one place that
registers every other subcommand (each in its own module beside this one)."""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from .. import config
from ..errors import EdgespecError
from .bench import bench
from .chat import chat
from .models import models
from .options import (
    CONTEXT_SETTINGS,
    constraint_options,
    load_engine,
    make_constraint,
    make_sampling,
    model_options,
    penalty_options,
    read_prompt,
    sampling_options,
    user_errors,
)
from .serve import serve
from .verify import verify
from .worker import worker

if TYPE_CHECKING:  # the engine imports numpy: only load it when a command needs it
    from ..runtime.engine import Collector


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="edgespec")
def cli() -> None:
    """edgespec: exact speculative decoding of local GGUF models.

    Faster answers from the same model: a cheap drafter proposes tokens, the target model
    checks them in one batch, and an exact rejection sampler keeps the output distribution
    identical to the target's.
    """


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("prompt", required=False)
@model_options
@sampling_options
@penalty_options
@constraint_options
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=config.DEFAULT_MAX_TOKENS,
              show_default=True, help="Stop after this many generated tokens.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--logprobs", type=click.IntRange(0, config.MAX_TOP_LOGPROBS), default=None,
              metavar="N",
              help="Each token's log-probability under the target's raw logits and its N most "
                   f"likely alternatives' (0-{config.MAX_TOP_LOGPROBS}): in the --json object, "
                   "else a table on stderr after the answer.")
@click.option("--chat/--raw", default=True, show_default=True,
              help="Apply the model's chat template, or send the prompt as is.")
@click.option("--system", default=None, help="System message (chat mode).")
@click.option("--stats", "show_stats", is_flag=True, help="Print a stats line to stderr.")
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object {"text", "finish_reason", "tokens", "stats"}.')
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@user_errors
def complete(prompt, max_tokens, stop, chat, system, show_stats, as_json, debug, **opts) -> None:
    """Complete PROMPT (or standard input) and stream the answer to stdout.

    With --schema, --json-object or --grammar the answer matches it (unless --max-tokens or
    a stop string ends it first), and is still exactly what the target samples under it.
    """
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
            click.echo(_json(run.output(collected.completion("interrupted"))))
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
    #: with --logprobs: one entry per token so far (:func:`_logprob_entry`)
    logprobs: list[dict] | None = None

    def output(self, completion) -> dict:
        """The --json object of ``completion``, with the tokens' log-probabilities if asked."""
        out = completion.to_dict()
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs[: len(completion.tokens)]
        return out


def _logprob_entry(info, target) -> dict:
    """One token of --json's ``logprobs``: its id, text (its own bytes, any broken UTF-8
    replaced; a special token that renders as nothing, its vocabulary entry such as
    ``<|im_end|>``), log-probability, and the alternatives' (OpenAI's shape, plus ids)."""
    vocab_text = getattr(target, "token_text", None)

    def text(token: int) -> str:
        piece = target.token_bytes(token).decode("utf-8", "replace")
        return piece or (vocab_text(token) if vocab_text is not None else "")

    return {"id": info.id, "token": text(info.id), "logprob": info.logprob,
            "top_logprobs": [{"id": t, "token": text(t), "logprob": lp}
                             for t, lp in info.top_logprobs]}


def _logprob_table(entries: list[dict]) -> str:
    """--logprobs without --json: one line per token, its log-probability, then the
    alternatives'."""
    lines = [f"{'token':>16} {'logprob':>8}  alternatives"]
    for e in entries:
        alts = "  ".join(f"{a['token']!r} {a['logprob']:.3f}" for a in e["top_logprobs"])
        lines.append(f"{e['token']!r:>16} {e['logprob']:8.3f}  {alts}".rstrip())
    return "\n".join(lines)


def _complete(run: _Run, prompt, max_tokens, stop, chat, system, show_stats, as_json, opts) -> None:
    from ..runtime.engine import Collector, check_prompt

    text = read_prompt(prompt)
    check_prompt(text)  # validate before loading models
    sampling = make_sampling(opts)
    constraint = make_constraint(opts)
    logprobs = opts["logprobs"]
    with load_engine(opts, progress=not as_json) as engine:
        kwargs = dict(max_tokens=max_tokens, sampling=sampling, stop=list(stop), chat=chat,
                      system=system, constraint=constraint, logprobs=logprobs)
        collected = run.collected = Collector()
        entries = run.logprobs = [] if logprobs is not None else None
        if as_json:  # a worker fault ends the process: the object so far goes out first
            from ..runtime.rpc import on_fatal

            on_fatal(lambda message: click.echo(_json(
                {**run.output(collected.completion("error")), "error": message})))
        chunk = None
        for chunk in engine.stream(text, **kwargs):
            collected.add(chunk)
            if entries is not None:
                entries.extend(_logprob_entry(i, engine.target) for i in chunk.tokens)
            if not as_json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        assert chunk is not None and chunk.finish_reason is not None
        if as_json:
            out = run.output(collected.completion(chunk.finish_reason))
            choice = engine.draft_choice
            if choice is not None:  # the draft edgespec picked for --target, and why
                out["draft_choice"] = {"draft": choice.draft, "reason": choice.reason}
            click.echo(_json(out))
            return
        sys.stdout.write("\n")
        if entries is not None:
            sys.stdout.flush()
            click.echo(_logprob_table(entries), err=True)
        if show_stats or chunk.finish_reason == "context":
            note = "" if chunk.finish_reason != "context" else " [context window full]"
            click.echo(f"[{chunk.finish_reason}] {chunk.stats.summary()}{note}", err=True)


def _sampler_passes() -> str:
    """Which whole-row passes the sampler runs, and how to get the compiled ones."""
    from ..core import rowpass

    if rowpass.rows() is not None:
        return "compiled row passes (edgespec/core/_rows.c)"
    if rowpass.switched_off():
        return f"NumPy row passes ({rowpass.NO_ROWS} is set)"
    return "NumPy row passes (not compiled: install a C compiler, then `make setup`)"


def _hybrid_support() -> str:
    """What this llama.cpp offers hybrid and MTP models (docs/hybrid.md), in words."""
    import llama_cpp

    rollback = hasattr(llama_cpp, "llama_n_rs_seq")
    mtp = hasattr(llama_cpp, "LLAMA_CONTEXT_TYPE_MTP")
    return ("recurrent-state rollback " + ("yes (n_rs_seq snapshots)" if rollback else
                                           "no: hybrid models decode plainly")
            + "; MTP drafting " + ("yes (--drafter mtp)" if mtp else "no"))


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.option("--rpc", metavar="HOST:PORT[,...]", default=None,
              help="Also list the devices these `edgespec worker` processes serve.")
@user_errors
def info(rpc: str | None) -> None:
    """Show the llama.cpp build, batch consistency, GPU offload, RPC, devices and cache location."""
    from ..runtime import rpc as rpc_backend
    from ..runtime.backend import gpu_offload_supported, inconsistent_features, system_info

    features = system_info()
    shaped = inconsistent_features(features)
    click.echo(f"cache dir:        {config.cache_dir()}")
    click.echo(f"threads:          {config.default_threads()}")
    click.echo(f"GPU offload:      {'yes' if gpu_offload_supported() else 'no (CPU-only build)'}")
    click.echo(
        "batch-consistent: "
        + ("yes (neither llamafile's sgemm nor AMX compiled in)" if not shaped
           else f"no: this llama.cpp has {' and '.join(shaped)} (2+ rows only); "
                "rebuild with `make setup`")
    )
    click.echo("kernel modes:     CPU layers exact (logit-reading calls in pieces of 3); "
               + ("offloaded layers batch-dependent, exact with --exact "
                  f"(--fixed-width {config.EXACT_FIXED_WIDTH}) or --fixed-width W"
                  if gpu_offload_supported() else "--fixed-width W exact on any device"))
    click.echo("hybrid models:    " + _hybrid_support())
    click.echo("features:         " + " ".join(k for k, v in features.items() if v == "1"))
    click.echo("sampler:          " + _sampler_passes())
    has_rpc = rpc_backend.available()
    click.echo("RPC:              " + ("yes (`edgespec worker`, --rpc)" if has_rpc
                                       else "no: rebuild with `make setup` (-DGGML_RPC=ON)"))
    for dev in rpc_backend.local_devices():
        click.echo(f"device:           {dev.name} ({dev.kind}): {dev.description}, "
                   f"{dev.free / 2**30:.1f} of {dev.total / 2**30:.1f} GiB free")
    if rpc:
        endpoints = rpc_backend.parse_endpoints(rpc)
        for dev in rpc_backend.connect(endpoints):
            click.echo(f"remote device:    {dev.name} at {dev.description}: "
                       f"{dev.free / 2**30:.1f} of {dev.total / 2**30:.1f} GiB free")
        from ..runtime.backend import offload_devices

        order = offload_devices(endpoints, with_local=True)
        click.echo("--tensor-split:   one weight per device, in this order: "
                   + ", ".join(f"{d.name} ({d.description})" for d in order))


for command in (models, bench, chat, serve, verify, worker):
    cli.add_command(command)


def main() -> None:
    # A terminal or pipe that is not UTF-8 (a latin-1 locale, a Windows console) shows what it
    # can of the model's text instead of crashing on its first emoji.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    cli(prog_name="edgespec")


if __name__ == "__main__":
    main()
