"""``edgespec verify``: the click command around :mod:`edgespec.bench.verify` (options, output)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .. import config
from ..bench import verify as v
from ..errors import ConfigError
from ..runtime.kernels import BATCH_DEPENDENT, EXACT_PIECES, describe, mode_of
from .options import (
    CONTEXT_SETTINGS,
    constraint_options,
    model_options,
    penalty_options,
    sampling_options,
    user_errors,
)

#: Drafters that cannot run without a draft model (auto falls back to lookup).

#: Exit code when the audit ran and found a difference (user errors exit 1/2, Ctrl-C 130).
FAILED_EXIT = 3



@click.command("verify", context_settings=CONTEXT_SETTINGS)
@model_options
@sampling_options
@penalty_options
@constraint_options
@click.option("--drafters", default=None, metavar="NAME,...",
              help="Drafters to audit (default: every one the loaded models allow).")
@click.option("--greedy/--no-greedy", default=True, show_default=True,
              help="Greedy audit: speculative and target-only tokens equal, prompt by prompt.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=None,
              help="JSONL prompt set for the greedy audit, as for `edgespec bench` "
                   "(default: the built-in set).")
@click.option("--only", multiple=True, metavar="ID", help="Greedy audit on this prompt only "
              "(repeatable).")
@click.option("--greedy-tokens", type=click.IntRange(1), default=v.DEFAULT_GREEDY_TOKENS,
              show_default=True, help="Tokens per prompt in the greedy audit.")
@click.option("--prompt", "sampling_prompt", default=None,
              help="Prompt of the sampling audit, through the chat template unless --raw "
                   f"(default, raw: {v.DEFAULT_SAMPLING_PROMPT!r}).")
@click.option("--raw", is_flag=True, help="Send --prompt without the chat template.")
@click.option("--samples", type=click.IntRange(20), default=v.DEFAULT_SAMPLES,
              show_default=True, help="Seeded runs per drafter, and target-only, in the "
                                      "sampling audit.")
@click.option("--tokens", type=click.IntRange(1, 16), default=v.DEFAULT_SAMPLE_TOKENS,
              show_default=True, help="Leading tokens whose joint distribution is compared.")
@click.option("--alpha", type=click.FloatRange(0.0001, 0.5), default=v.DEFAULT_ALPHA,
              show_default=True, help="Significance level of each sampling check.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object.")
@user_errors
def verify(**kw) -> None:
    """Audit exactness on your models and settings.

    Greedy: speculative output must equal target-only output token for token, on every
    prompt. Sampling (at --temperature, default 0.8 here, with --top-k/--top-p/--min-p):
    the first --tokens tokens of --samples seeded runs per drafter must be distributed as in
    target-only runs; reported as total variation distance with a bootstrap upper bound and
    a permutation test at --alpha (--temperature 0 skips it). Exit code 0 when every check
    passes, 3 when one fails.

    Penalties, --logit-bias and a constraint (--schema, --json-object, --grammar) apply to
    both sides of both checks: speculative output is compared with plain decoding under the
    same ones (give a --prompt the constraint makes sense for).
    """
    _verify(v, **kw)


# The audit covers several drafters (--drafters) instead of the shared --drafter, and samples
# at 0.8 unless told otherwise (the shared default, 0, is greedy).
temperature = click.Option(["--temperature", "--temp"], type=float, default=0.8,
                           show_default=True, help="Temperature of the sampling audit "
                                                   "(0: greedy audit only).")
verify.params = [temperature if p.name == "temperature" else p
                 for p in verify.params if p.name != "drafter"]


def _verify(v, *, drafters, greedy, prompts_file, only, greedy_tokens, sampling_prompt, raw,
            samples, tokens, alpha, as_json, **opts) -> None:
    from ..bench.prompts import for_model, load_prompts, select_prompts
    from ..runtime import sources
    from .options import load_engine, make_constraint, make_sampling

    # Everything the user typed is checked before any model loads.
    params = make_sampling(opts)
    constraint = make_constraint(opts)
    sampling = params.temperature > 0
    prompts = select_prompts(load_prompts(prompts_file), only) if greedy else []
    names = _parse_drafters(drafters, sources.NAMES)
    if not (greedy or sampling):
        raise ConfigError("nothing to audit: --no-greedy needs a --temperature above 0")
    chat = sampling_prompt is not None and not raw
    sampling_prompt = v.DEFAULT_SAMPLING_PROMPT if sampling_prompt is None else sampling_prompt
    if not sampling_prompt.strip():
        raise ConfigError("--prompt must not be empty")

    def say(msg: str) -> None:
        if not as_json:
            click.echo(f"  ... {msg}", err=True)

    try:
        with load_engine(dict(opts, drafter=config.DEFAULT_DRAFTER),
                         progress=not as_json) as engine:
            usable = sources.usable(engine.draft is not None, getattr(engine, "mtp", None) is not None)
            if names is None:  # every source that drafts and can run here
                names = [n for n in usable if sources.spec(n).drafts]
            elif set(names) - set(usable):
                raise ConfigError(f"drafters {', '.join(sorted(set(names) - set(usable)))} "
                                  "need a draft model (--draft)")
            prompts = for_model(prompts, getattr(engine.target, "has_chat_template", True))
            g = v.verify_greedy(engine, [(p.id, p.payload, not p.raw) for p in prompts], names,
                                greedy_tokens, progress=say, params=params,
                                constraint=constraint) if greedy else []
            s = v.verify_sampling(engine, sampling_prompt, names, params, tokens, samples,
                                  alpha=alpha, chat=chat, progress=say,
                                  constraint=constraint) if sampling else []
            header = dict(_header(engine, params, constraint), sampling_prompt=sampling_prompt,
                          sampling_chat=chat)
    except KeyboardInterrupt:
        click.echo("\n[interrupted: no verdict]", err=True)
        sys.exit(130)
    result = v.to_dict(g, s)
    if as_json:
        click.echo(json.dumps(dict(result, settings=header), ensure_ascii=False))
    else:
        click.echo(format_report(header, g, s, greedy_tokens))
    if not result["passed"]:
        sys.exit(FAILED_EXIT)


def _parse_drafters(text: str | None, known) -> list[str] | None:
    from ..bench.run import parse_list
    from ..runtime import sources

    if text is None:
        return None
    names = parse_list(text, "--drafters")
    drafting = [n for n in known if sources.spec(n).drafts]  # (plain decoding is the reference)
    bad = [n for n in names if n not in drafting]
    if bad:
        valid = ", ".join(drafting)
        raise ConfigError(f"--drafters: unknown {', '.join(bad)}; choose from {valid}")
    return names


def _header(engine, params, constraint=None) -> dict:
    draft = engine.draft.path.name if engine.draft is not None else None
    workers = getattr(engine.target.options, "rpc", ())
    kernels = describe(engine.target)
    if workers and mode_of(engine.target) == EXACT_PIECES:
        # the pieces hold on a worker's CPU; a GPU worker picks kernels by batch width
        kernels += f", target on RPC workers {', '.join(workers)} (exact only where they serve a CPU)"
    return {
        "target": engine.target.path.name,
        "draft": draft,
        "rpc": list(workers),
        "kernels": kernels,
        "kernel_mode": mode_of(engine.target),
        "draft_window": engine.draft_window, "draft_window_mode": engine.draft_window_mode,
        "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
        "min_p": params.min_p,
        "shaping": _shaping(params),
        "constraint": constraint.describe() if constraint is not None else None,
    }


def _shaping(params) -> str | None:
    """The penalties and logit bias in use, as the options that set them (None: none)."""
    if not params.shaped:
        return None
    parts = [f"--{name} {value}" for name, value, off in (
        ("presence-penalty", params.presence_penalty, 0),
        ("frequency-penalty", params.frequency_penalty, 0),
        ("repeat-penalty", params.repeat_penalty, 1)) if value != off]
    if parts:
        parts.append(f"--repeat-last-n {params.penalty_last_n}")
    parts += [f"--logit-bias {t}={b:g}" for t, b in params.logit_bias]
    return " ".join(parts)


def format_report(header: dict, greedy, sampling, greedy_tokens: int) -> str:
    """The human-readable audit: one line per check, then the verdict."""
    #: a constraint's forced tokens get a column of their own (not the drafter's drafts)
    forced = bool(header.get("constraint"))
    lines = [f"target {header['target']}, draft {header['draft'] or '(none)'}",
             f"kernels: {header['kernels']}"]
    if header.get("draft_window_mode", "off") != "off":
        lines.append(f"draft window: {header['draft_window']} tokens ({header['draft_window_mode']})")
    if header.get("constraint"):
        lines.append(f"constraint: {header['constraint']}, on both sides (tokens it forces are "
                     "drafted ahead: 'forced')")
    if header.get("shaping"):
        lines.append(f"shaping: {header['shaping']}, on both sides")
    if greedy:
        prompts = sorted({r.prompt for r in greedy})
        tolerance = greedy[0].tolerance
        lines += ["", f"greedy: {len(prompts)} prompts x {greedy_tokens} tokens, speculative vs "
                      "target-only, token for token"]
        if header.get("kernel_mode") == BATCH_DEPENDENT:
            lines.append("  scoring 2-16 tokens per call moved a logit by up to "
                         + (f"{tolerance / 2:.4f} on this device: a difference is excused where "
                            f"the top-2 logit gap is at most {tolerance:.4f} (twice that)"
                            if tolerance is not None else "? (not measured: nothing excused)"))
        else:
            lines.append("  exact kernels: any difference is a bug")
        lines += [
                  f"  {'drafter':8} {'equal':>7} {'drafted':>8} {'accepted':>9}"
                  f"{' ' + 'forced'.rjust(8) if forced else ''}  result"]
        for name in dict.fromkeys(r.drafter for r in greedy):
            rows = [r for r in greedy if r.drafter == name]
            ok = sum(r.equal for r in rows)
            verdict = "PASS" if all(r.passed for r in rows) else "FAIL"
            lines.append(f"  {name:8} {f'{ok}/{len(rows)}':>7} {sum(r.drafted for r in rows):>8} "
                         f"{sum(r.accepted for r in rows):>9}"
                         f"{f' {sum(r.forced for r in rows):>8}' if forced else ''}  {verdict}")
            for r in rows:
                if not r.equal:
                    if r.near_tie:
                        why = "near-tie flip (within the measured batch-shape noise)"
                    elif r.tolerance is not None:
                        why = f"above {r.tolerance:.4f}, outside the measured noise: a bug"
                    else:
                        why = "a bug (exact kernels)"
                    lines.append(f"    {r.prompt}: first difference at token {r.divergence}, "
                                 f"top-2 logit gap {r.gap:.3f}: {why}")
    if sampling:
        r0 = sampling[0]
        alpha = r0.test.alpha
        lines += ["", f"sampling (temperature {header['temperature']}, top-k {header['top_k']}, "
                      f"top-p {header['top_p']}, min-p {header['min_p']}): first {r0.tokens} "
                      f"tokens, {r0.samples} seeded runs per drafter vs {r0.samples} target-only",
                  f"  prompt{'' if header['sampling_chat'] else ' (raw)'}: "
                  f"{header['sampling_prompt']!r}",
                  f"  TV = total variation distance between the two empirical distributions "
                  f"(outcomes seen < {v.MIN_OUTCOME_COUNT} times pooled); upper = {1 - alpha:.0%} "
                  "bootstrap bound;",
                  f"  noise = TV that equal distributions exceed with probability {alpha} at "
                  f"this size; pass if p > {alpha}",
                  f"  {'drafter':8} {'TV':>6} {'upper':>6} {'noise':>6} {'p':>6} {'outcomes':>9} "
                  f"{'drafted':>8} {'accepted':>9}{' ' + 'forced'.rjust(8) if forced else ''}  "
                  "result"]
        for r in sampling:
            t = r.test
            lines.append(f"  {r.drafter:8} {t.tv:6.3f} {t.tv_upper:6.3f} {t.critical:6.3f} "
                         f"{t.p_value:6.3f} {r.outcomes:>9} {r.drafted:>8} {r.accepted:>9}"
                         f"{f' {r.forced:>8}' if forced else ''}  "
                         f"{'PASS' if r.passed else 'FAIL'}")
            if r.drafted == 0:
                lines.append(f"    ({r.drafter} drafted nothing here: the check is vacuous"
                             f"{' but for the forced tokens' if r.forced else ''})")
    checks = [*greedy, *sampling]
    failed = sum(not r.passed for r in checks)
    lines += ["", f"verdict: {'PASS' if not failed else 'FAIL'} "
                  f"({len(checks) - failed}/{len(checks)} checks passed)"]
    return "\n".join(lines)
