"""``edgespec bench``: the click command. It wires options, model loading, the progress bar and
the output files; the measuring is in :mod:`edgespec.bench.run` (and ``reference``, ``memory``,
``anchors`` there), the output in :mod:`edgespec.bench.report`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import click

from .. import config
from ..bench import anchors as anchors_mod
from ..bench.memory import DEFAULT_N_CTX as MEMORY_CTX
from ..bench.memory import DEFAULT_PROMPT_TOKENS as MEMORY_PROMPT_TOKENS
from ..bench.memory import DEFAULT_SIDES as MEMORY_SIDES
from ..bench.memory import SIDES
from ..bench.prompts import KINDS, BenchPrompt, for_model, load_prompts, select_prompts
from ..bench.run import (
    DEFAULT_DRAFTERS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_REPEATS,
    LENGTH_DRAFTERS,
    Config,
    EdgespecRunner,
    Runners,
    build_document,
    execute,
    machine_info,
    parse_drafters,
    parse_lengths,
    parse_list,
    parse_temperatures,
    plan_runs,
    run_sweep,
    warm_up,
)
from ..errors import ConfigError, EdgespecError
from .options import (
    CONTEXT_SETTINGS,
    load_engine,
    model_options,
    sampling_options,
    user_errors,
)

if TYPE_CHECKING:  # the engine imports numpy: only load it when a command needs it
    from ..core.sampling import SamplingParams
    from ..runtime.engine import Engine


@click.command("bench", context_settings=CONTEXT_SETTINGS)
@model_options
@sampling_options
@click.option("--drafters", default=",".join(DEFAULT_DRAFTERS), show_default=True,
              help="Configurations to compare, comma-separated: edgespec drafters and "
                   "llama-cpp-python's own paths (`llama-cpp-python`: its prompt-lookup "
                   "speculation; `llama-cpp-python-plain`: no drafting). `none` is always run.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=None,
              help="JSONL prompt set (fields: id, kind, prompt or messages, max_tokens, raw; "
                   "kind structured: schema, a JSON schema every configuration answers under, "
                   "and answer, a valid answer for --overhead --structured); default: the "
                   "built-in set.")
@click.option("--only", multiple=True, metavar="ID", help="Run only this prompt (repeatable).")
@click.option("--kinds", default=",".join(KINDS), show_default=True,
              help="Prompt kinds to run. On structured prompts edgespec answers under the "
                   "prompt's JSON schema (json_schema=) and llama-cpp-python under its grammar "
                   "made from it; the tables add valid (answers that parse and match the schema) "
                   "and forced (share of the tokens drafted as the grammar forced them).")
@click.option("--repeats", "-r", type=click.IntRange(1), default=DEFAULT_REPEATS, show_default=True,
              help="Runs of every prompt and configuration (interleaved).")
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=DEFAULT_MAX_TOKENS,
              show_default=True, help="Tokens per run (a prompt's own max_tokens wins).")
@click.option("--warmup/--no-warmup", default=True, show_default=True,
              help="One short unrecorded run per configuration first.")
@click.option("--lengths", default=None, metavar="K,K,...",
              help="Also run lookup and model at each fixed draft length on the edit prompts "
                   "(speedup against draft length), e.g. 1,2,4,8,16.")
@click.option("--sweep", is_flag=True,
              help="Measure the target's batch-scoring cost t(k) and the draft's per-token cost.")
@click.option("--memory", is_flag=True,
              help=f"Peak memory with a {MEMORY_PROMPT_TOKENS}-token prompt in a {MEMORY_CTX}-"
                   "token context, each side in a fresh process (about a minute per side).")
@click.option("--memory-sides", default=",".join(MEMORY_SIDES), show_default=True,
              help=f"Sides of --memory, from: {', '.join(SIDES)}.")
@click.option("--memory-ctx", type=click.IntRange(64), default=MEMORY_CTX, show_default=True,
              help="Context window of --memory.")
@click.option("--memory-prompt-tokens", type=click.IntRange(16), default=MEMORY_PROMPT_TOKENS,
              show_default=True, help="Prompt length of --memory.")
@click.option("--runs/--no-runs", default=True, show_default=True,
              help="Run the prompt set (--no-runs: only --sweep and/or --memory).")
@click.option("--overhead", is_flag=True,
              help="Only edgespec's own host work per token: the real loop, drafters, sampler "
                   "and rejection test over a synthetic model that answers instantly (no model "
                   "loads). Every drafter at k=4 and 16, at greedy and temperature 0.8 with "
                   "each truncation; --json writes it too. With --structured: constrained "
                   "output's masks instead.")
@click.option("--vocab", type=click.IntRange(2), default=None, metavar="N",
              help="Vocabulary size of --overhead's synthetic model [default: 151936, the "
                   "default target's].")
@click.option("--recorded", "recorded", type=click.Path(path_type=Path), default=None,
              metavar="PATH",
              help="--overhead on rows recorded from the real pair (--pair, --target, "
                   "--draft) instead of generated ones: read from PATH (.npz) if it exists, "
                   "else recorded there first (the target's own text at temperature 0.8 on "
                   "the bench prompts, scored by both models; about a minute on 2 cores).")
@click.option("--structured", is_flag=True,
              help="--overhead of constrained output instead: the host's cost per token of the "
                   "mask over the target's vocabulary (only the vocabulary of --pair/--target "
                   "loads), along each structured prompt's answer (--prompts, --only): "
                   "llguidance's (edgespec's) bits + apply against llama.cpp's own grammar "
                   "sampler applied to a full row; µs median, mean and p90, each position's "
                   "best of --repeats walks.")
@click.option("--device-window", is_flag=True,
              help="--overhead as on a GPU that holds the draft's output layer: sampled drafts "
                   "get each row's --draft-window largest logits from the device (llama.cpp's "
                   "top-k in its graph), and no draft row reaches the host.")
@click.option("--llama-cpp-bin", type=click.Path(path_type=Path),
              default=None, metavar="DIR",
              help="Also run llama.cpp's own llama-bench, llama-speculative-simple and "
                   "llama-lookup from DIR (built from the same llama.cpp) on the same prompts, "
                   "models and settings, and report their tok/s as anchors.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Results file (default: bench-results/bench-<time>.json).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Plot file (default: next to the JSON, .png).")
@user_errors
def bench(**kw) -> None:
    """Measure speed, acceptance and memory of each drafter on a prompt set.

    Configurations run interleaved (every configuration on a prompt, back to back, in an
    order rotated each repeat). Prints per-prompt and overall tables, writes every run and
    the aggregates as JSON and a plot of the speedups. Ctrl-C stops and still writes what
    was measured.
    """
    _bench(**kw)

# The bench compares drafters (--drafters) and takes several temperatures: it drops the shared
# single-valued --drafter and replaces --temperature with a list.
temperature = click.Option(
    ["--temperature", "--temp"], default="0", show_default=True,
    help="Temperature(s), comma-separated: 0,0.8 runs everything at both, each with its own "
         "`none` baseline.")
bench.params = [temperature if p.name == "temperature" else p
                for p in bench.params if p.name != "drafter"]


def _bench(*, drafters, prompts_file, only, kinds, repeats, max_tokens, warmup, lengths, sweep,
           memory, memory_sides, memory_ctx, memory_prompt_tokens, runs, overhead, vocab,
           recorded, structured, device_window, llama_cpp_bin, json_path, plot_path,
           **opts) -> None:
    if recorded is not None and not overhead:
        raise ConfigError("--recorded is an option of --overhead")
    if device_window and not overhead:
        raise ConfigError("--device-window is an option of --overhead")
    if structured and not overhead:
        raise ConfigError("--structured is an option of --overhead")
    if structured:
        if recorded is not None or vocab is not None or device_window:
            raise ConfigError("--overhead --structured walks the target's own vocabulary: "
                              "drop --recorded, --vocab and --device-window")
        prompts = select_prompts(load_prompts(prompts_file), only, ["structured"])
        _masks(prompts, repeats, json_path, opts)
        return
    if overhead:
        pools = None
        if recorded is not None:
            if vocab is not None:
                raise ConfigError("--vocab and --recorded: the recorded rows have their own "
                                  "vocabulary")
            pools = _recorded_pools(recorded, opts, prompts_file)
        _overhead(vocab, repeats, json_path, opts["draft_window"], pools, recorded,
                  device_window)
        return
    from ..core.sampling import SamplingParams
    from ..runtime import sources

    # Everything the user typed is checked before any model loads.
    temperatures = parse_temperatures(opts["temperature"])
    base = SamplingParams(temperature=0.0, top_k=opts["top_k"], top_p=opts["top_p"],
                          min_p=opts["min_p"], seed=opts["seed"])
    prompts = select_prompts(load_prompts(prompts_file), only, parse_list(kinds, "--kinds"))
    names = parse_drafters(drafters, sources.NAMES)
    ks = parse_lengths(lengths, config.MAX_DRAFT_LENGTH)
    sides = parse_list(memory_sides, "--memory-sides")
    bad = [s for s in sides if s not in SIDES]
    if bad:
        raise ConfigError(f"--memory-sides: unknown {', '.join(bad)}; choose from {', '.join(SIDES)}")
    if not (runs or sweep or memory):
        raise ConfigError("nothing to do: --no-runs needs --sweep or --memory")
    if llama_cpp_bin is not None and not runs:
        raise ConfigError("--llama-cpp-bin runs llama.cpp's tools on the prompt set: drop --no-runs")
    if llama_cpp_bin is not None:
        anchors_mod.check_bin_dir(llama_cpp_bin)
    json_path = json_path or Path("bench-results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    plot_path = plot_path or json_path.with_suffix(".png")
    for p in (json_path, plot_path):
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot create {p.parent}: {err.strerror or err}") from None

    settings = {
        "pair": opts["pair"], "target": opts["target"], "draft": opts["draft"],
        "drafters": names, "prompts": str(prompts_file) if prompts_file else "built-in",
        "prompt_ids": [p.id for p in prompts], "repeats": repeats, "max_tokens": max_tokens,
        "temperatures": temperatures, "top_k": base.top_k, "top_p": base.top_p,
        "min_p": base.min_p, "seed": base.seed or 0, "draft_length": opts["draft_length"],
        "lengths": ks, "n_ctx": opts["n_ctx"], "threads": opts["threads"] or config.default_threads(),
        "warmup": warmup, "kernels": "fast" if opts["fast_kernels"] else "batch-consistent",
        "fixed_width": opts["fixed_width"],
        "rpc": opts["rpc"], "draft_rpc": opts["draft_rpc"], "tensor_split": opts["tensor_split"],
        "llama_cpp_bin": str(llama_cpp_bin) if llama_cpp_bin else None,
        "speed_basis": "generated tokens per second of decoding, prompt prefill excluded",
        "ratio_basis": "per prompt: median(config) / median(none) in this run; overall: "
                       "geometric mean over prompts",
    }
    echo_err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    records: list[dict] = []
    configs: list[Config] = []
    skipped: list[dict] = []
    notes: list[str] = []
    sweep_result = memory_result = anchors = None
    anchor_plan = None
    machine: dict = {}
    interrupted = False
    failure: EdgespecError | None = None
    target_path = draft_path = None

    try:
        if runs or sweep:
            with _load(opts) as engine:
                machine = machine_info(engine)
                target_path = getattr(engine.target, "path", None)
                draft_path = getattr(engine.draft, "path", None)
                settings.update(_offload(engine))
                if sweep:
                    echo_err("measuring the target's cost curve t(k)...")
                    from ..bench.report import print_sweep

                    sweep_result = run_sweep(engine)
                    print_sweep(sweep_result, click.echo)
                prompts = for_model(prompts, getattr(engine.target, "has_chat_template", True))
                if runs:
                    configs, skipped = _configs(engine, names, ks)
                    for s in skipped:
                        echo_err(f"skipping {s['config']}: {s['reason']}")
                    if llama_cpp_bin is not None:
                        anchor_plan = _anchor_plan(engine, prompts, max_tokens, opts, base, notes,
                                                   echo_err)
                    _measure(engine, prompts, configs, repeats, temperatures, base, max_tokens,
                             warmup, records, settings)
            if anchor_plan is not None:
                # after the engine is closed: the tools get the memory (a GPU's too) to themselves
                anchors = anchors_mod.new_result(llama_cpp_bin, anchor_plan[0])
                settings["anchors"] = anchors["settings"]
                _run_anchors(anchors, llama_cpp_bin, *anchor_plan, repeats)
        if memory:
            if target_path is None:
                target_path, draft_path = _resolve_paths(opts)
            if not machine:
                machine = machine_info()
            memory_result = _memory(target_path, draft_path, sides, memory_ctx, memory_prompt_tokens,
                                    opts, echo_err)
    except KeyboardInterrupt:
        interrupted = True
        notes.append("interrupted: partial results")
    except EdgespecError as err:  # e.g. a prompt longer than the context: keep what was measured
        failure = err
        notes.append(f"stopped by an error: {err}")
    _report(settings, machine, prompts, configs, skipped, records,
            not interrupted and failure is None, sweep_result, memory_result, notes, json_path,
            plot_path, anchors)
    if failure is not None:
        raise failure
    if interrupted:
        click.echo("interrupted: partial results written", err=True)
        sys.exit(130)


def _offload(engine: Engine) -> dict:
    """The layers edgespec offloaded, for the settings (the reference and the anchors use the
    same)."""
    def ngl(backend: object) -> int | None:
        return getattr(getattr(backend, "options", None), "n_gpu_layers", None)

    return {"n_gpu_layers": ngl(engine.target) or 0,
            "fixed_width": getattr(engine.target, "fixed_width", 0),  # --exact may have set it
            "draft_n_gpu_layers": ngl(engine.draft) if engine.draft is not None else None,
            "draft_window": engine.draft_window, "draft_window_mode": engine.draft_window_mode}


def _anchor_plan(engine: Engine, prompts: Sequence[BenchPrompt], max_tokens: int, opts: dict,
                 base: SamplingParams, notes: list[str], echo_err: Callable[[str], None]
                 ) -> tuple[anchors_mod.AnchorSettings, list[anchors_mod.AnchorPrompt]] | None:
    """Settings and prompt texts for llama.cpp's tools, taken while the engine is loaded; None
    (with a note) when the target is on RPC workers, where the tools' numbers would be this
    machine's. Structured prompts are left out (with a note): the tools would answer them
    unconstrained."""
    def note(text: str) -> None:
        notes.append(text)
        echo_err(text)

    if getattr(getattr(engine.target, "options", None), "rpc", ()):
        note("llama.cpp's tools: not run (they run locally, the target is on --rpc workers)")
        return None
    plain = [p for p in prompts if p.schema is None]
    if len(plain) < len(prompts):
        note("llama.cpp's tools: structured prompts left out (the tools would answer them "
             "without their schema)")
    if not plain:
        return None
    return (anchors_mod.settings_from_engine(engine, draft_length=opts["draft_length"],
                                             seed=base.seed),
            anchors_mod.anchor_prompts(engine, plain, max_tokens))


def _run_anchors(anchors: dict, bin_dir: Path, settings: anchors_mod.AnchorSettings,
                 prompts: Sequence[anchors_mod.AnchorPrompt], repeats: int) -> None:
    """Run llama.cpp's tools into ``anchors`` (:func:`edgespec.bench.anchors.run_anchors`), with
    a progress bar and the prompt files in a temporary directory."""
    import tempfile

    from tqdm import tqdm

    tools = anchors_mod.find_tools(bin_dir)
    usable = [t for t, exe in tools.items()
              if anchors_mod.unusable_reason(t, exe, settings, bin_dir) is None]
    total = repeats * len(prompts) * len(usable)
    bar = tqdm(total=total, desc="llama.cpp tools", unit="run", file=sys.stderr,
               dynamic_ncols=True, disable=None)

    def on_run(tool: str, prompt: anchors_mod.AnchorPrompt, repeat: int) -> None:
        bar.update()
        bar.set_postfix_str(f"{prompt.id} {tool}")

    try:
        with tempfile.TemporaryDirectory(prefix="edgespec-anchors-") as tmp:
            anchors_mod.run_anchors(anchors, tools, settings, prompts, repeats, Path(tmp),
                                    on_run=on_run)
    finally:
        bar.close()


def _load(opts: dict):
    # a target without --draft gets the draft picked for it (or none: lookup only)
    return load_engine(dict(opts, drafter=config.DEFAULT_DRAFTER))


def _resolve_paths(opts: dict) -> tuple[Path, Path | None]:
    """Target and draft files without loading them (for --memory alone)."""
    from ..models.catalog import resolve_pair
    from ..models.resolve import resolve_model

    target, draft = opts["target"], opts["draft"]
    if target is None:
        pair = resolve_pair(opts["pair"])
        target, draft = pair.target, draft if draft is not None else pair.draft
    t = resolve_model(str(target), download=True, progress=True)
    if draft is None:
        from ..models.drafts import choose_draft

        draft = choose_draft(str(target), t).draft
    d = resolve_model(str(draft), download=True, progress=True) if draft is not None else None
    return t, d


def _configs(engine, names, ks) -> tuple[list[Config], list[dict]]:
    """The configurations that can run with this engine, and why the others cannot."""
    from ..runtime import sources

    configs, skipped = [], []

    def usable(name) -> bool:
        if not sources.spec(name).usable(engine.draft is not None, getattr(engine, "mtp", None) is not None):
            skipped.append({"config": name, "reason": "no draft model loaded (--draft)" if sources.spec(name).requires_draft_model else "the target has no MTP layers"})
            return False
        return True

    remote = bool(getattr(getattr(engine.target, "options", None), "rpc", ()))
    for name in names:
        if Config(name).is_reference and remote:
            # llama-cpp-python's Llama cannot reach a worker: its numbers would be this machine's
            skipped.append({"config": name, "reason": "runs locally only (llama-cpp-python has no RPC)"})
        elif Config(name).is_reference or usable(name):
            configs.append(Config(name))
    if not ks:
        return configs, skipped
    by_length = [d for d in LENGTH_DRAFTERS
                 if Config(d) in configs or (d not in names and usable(d))]
    return configs + [Config(d, k) for d in by_length for k in ks], skipped


def _measure(engine, prompts, configs, repeats, temperatures, base, max_tokens, warmup,
             records, settings) -> None:
    from tqdm import tqdm

    from ..bench.reference import ReferenceRunner

    main = [c for c in configs if c.draft_length is None]
    fixed = [c for c in configs if c.draft_length is not None]
    reference = None
    if any(c.is_reference for c in configs):
        options = getattr(engine.target, "options", None)
        reference = ReferenceRunner(getattr(engine.target, "path", None), engine.target.n_ctx,
                                    getattr(options, "n_threads", None) or config.default_threads(),
                                    n_gpu_layers=settings["n_gpu_layers"])
        settings["reference"] = {name: desc for name, desc in reference.describe().items()
                                 if Config(name) in configs}
    runners = Runners(EdgespecRunner(engine), reference)
    plan = plan_runs(prompts, main, repeats, temperatures, edit_only=fixed)
    bar = tqdm(total=len(plan) + (len(configs) if warmup else 0), desc="bench", unit="run",
               file=sys.stderr, dynamic_ncols=True, disable=None)
    try:
        if warmup:
            bar.set_postfix_str("warm-up")
            warm_up(configs, runners, base, on_done=lambda c: bar.update())

        def start(item):
            bar.set_postfix_str(f"{item.prompt.id} {item.config.label} T={item.temperature:g}")

        def done(item, record):
            bar.update()
            bar.set_postfix_str(f"{item.prompt.id} {item.config.label} "
                                f"{record['tokens_per_second']:.1f} tok/s")

        execute(plan, runners, base, max_tokens, records, on_start=start, on_done=done)
    finally:
        bar.close()
        if reference is not None:
            reference.close()


def _memory(target, draft, sides, n_ctx, prompt_tokens, opts, echo_err) -> dict:
    from ..bench.memory import run_memory_scenario

    return run_memory_scenario(
        target=Path(target), draft=Path(draft) if draft else None, sides=sides, n_ctx=n_ctx,
        prompt_tokens=prompt_tokens, threads=opts["threads"] or config.default_threads(),
        batch_consistent=not opts["fast_kernels"],
        on_side=lambda side: echo_err(f"memory: {side} side, {prompt_tokens}-token prompt "
                                      f"in a {n_ctx}-token context (prefill takes a while)..."))


def _report(settings, machine, prompts, configs, skipped, records, complete, sweep, memory, notes,
            json_path, plot_path, anchors=None) -> None:
    from ..bench.report import print_anchors, print_memory, print_report, write_json, write_plot

    doc = build_document(settings=settings, machine=machine, prompts=prompts, configs=configs,
                         skipped=skipped, runs=records, complete=complete, sweep=sweep,
                         memory=memory, notes=notes, anchors=anchors)
    if records:
        print_report(doc, click.echo)
    if anchors:
        print_anchors(doc, click.echo)
    if memory:
        print_memory(memory, click.echo)
    click.echo("")
    click.echo(f"peak RSS of this process: {doc['peak_rss_mb']:.0f} MB")
    write_json(doc, json_path)
    click.echo(f"results: {json_path}")
    if records or sweep:
        if write_plot(doc, plot_path):
            click.echo(f"plot:    {plot_path}")


def _recorded_pools(path: Path, opts: dict, prompts_file: Path | None):
    """The rows of ``--recorded PATH``: read, or recorded from the pair first."""
    from ..bench.overhead import load_pools, record_pools, save_pools

    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot create {path.parent}: {err.strerror or err}") from None
        click.echo(f"recording rows of the pair into {path} ...", err=True)
        with _load(opts) as engine:
            if engine.draft is None:
                raise ConfigError("--recorded needs a draft model")
            # (the unconstrained kinds: the recorded mix the docs' figures were measured on)
            target, draft = record_pools(engine, [p for p in load_prompts(prompts_file)
                                                  if p.schema is None])
        tmp = path.with_name(path.name + ".part")
        save_pools(tmp, target, draft)
        tmp.replace(path)
    return load_pools(path)


def _masks(prompts: Sequence[BenchPrompt], repeats: int, json_path: Path | None,
           opts: dict) -> None:
    """``--overhead --structured``: :mod:`edgespec.bench.masks` on the target's vocabulary."""
    import json

    from ..bench.masks import format_masks, run_masks, structured_prompts
    from ..models.catalog import resolve_pair
    from ..models.resolve import resolve_model

    structured_prompts(prompts)  # (before anything loads)
    if json_path is not None:
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot create {json_path.parent}: {err.strerror or err}") from None
    target = resolve_model(str(opts["target"] or resolve_pair(opts["pair"]).target),
                           download=True, progress=True)

    def progress(cost) -> None:
        click.echo(f"  {cost.prompt}: {cost.tokens} tokens walked", err=True)

    click.echo(f"walking the masks on the vocabulary of {target.name} ...", err=True)
    result = run_masks(target, prompts, repeats, progress=progress)
    click.echo(format_masks(result))
    if json_path is not None:
        json_path.write_text(json.dumps({"structured_overhead": result}, indent=1) + "\n")
        click.echo(f"wrote {json_path}", err=True)


def _overhead(vocab: int | None, repeats: int, json_path: Path | None, draft_window: int,
              pools=None, recorded: Path | None = None, device_window: bool = False) -> None:
    import json

    from ..bench.overhead import DEFAULT_VOCAB, format_table, run_overhead
    from ..core import rowpass

    n_vocab = pools[0].shape[1] if pools is not None else vocab or DEFAULT_VOCAB
    if json_path is not None:
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot create {json_path.parent}: {err.strerror or err}") from None

    def progress(r) -> None:
        click.echo(f"  {r.drafter:7} k={r.k:<2} {r.sampling:15} {r.us_per_token:8.1f} µs/token",
                   err=True)

    results = run_overhead(n_vocab, repeats=repeats, progress=progress,
                           draft_window=draft_window, pools=pools, device_window=device_window)
    click.echo(format_table(results, n_vocab, draft_window, recorded, device_window))
    if json_path is not None:
        doc = {"overhead": [r.to_dict() for r in results], "vocab": n_vocab,
               "draft_window": draft_window, "device_window": device_window,
               "rows": str(recorded) if recorded is not None else "generated",
               "row_passes": "compiled" if rowpass.rows() is not None else "numpy"}
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
        click.echo(f"wrote {json_path}", err=True)
