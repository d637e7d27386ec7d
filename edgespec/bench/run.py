"""``edgespec bench``: run a prompt set over drafters, interleaved, and aggregate the results.

Every configuration (an edgespec drafter, optionally at a fixed draft length, or one of
llama-cpp-python's own paths) runs every prompt once per repeat. Within a repeat the prompts run
in order and, for each prompt, every configuration runs back to back in an order rotated by the
repeat number (A B C, B C A, C A B, ...), so slow drift of the machine (heat, other load) spreads
over all configurations instead of biasing one.

Speeds are tokens per second of decoding with the prompt prefill excluded, for both edgespec
(:attr:`edgespec.Stats.tokens_per_second`) and the reference (see
:mod:`edgespec.bench_reference`). A configuration's speedup on a prompt is its median speed over
the repeats divided by the median speed of ``none`` (plain decoding through edgespec's loop) on
the same prompt, measured in the same run; overall, the geometric mean of those per-prompt ratios.

On a ``structured`` prompt every configuration answers under the prompt's JSON schema
(edgespec's through ``json_schema=``, llama-cpp-python's through its grammar made from the
schema); each answer is checked (:func:`~edgespec.bench.prompts.check_answer`), and the runs
report validity and the forced share: the generated tokens drafted as source ``forced``, the
tokens a grammar allows alone, drafted where a round starts on them (a draft that runs through
them keeps its own source; ``none`` drafts nothing, so it has none).

Aggregation works on plain run dicts (the ``runs`` of the JSON results), so a saved result can be
re-aggregated. This module does not print: the report is :mod:`edgespec.bench_report`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from ..core.sampling import SamplingParams
from ..errors import ConfigError
from ..runtime.kernels import describe, mode_of
from .anchors import TOOLS as ANCHOR_TOOLS
from .prompts import KINDS, WARMUP_PROMPT, BenchPrompt, check_answer

SCHEMA = "edgespec-bench/1"

#: llama-cpp-python's own paths, measured as references (see edgespec.bench_reference).
REFERENCE_DRAFTERS = ("llama-cpp-python", "llama-cpp-python-plain")
DEFAULT_DRAFTERS = ("none", "model", "lookup", "hybrid", "auto", *REFERENCE_DRAFTERS)
#: The baseline every ratio is taken against; always run.
BASELINE = "none"
#: Drafters ``--lengths`` runs at each fixed draft length, on the edit prompts.
LENGTH_DRAFTERS = ("lookup", "model")
DEFAULT_REPEATS = 3
DEFAULT_MAX_TOKENS = 128
WARMUP_TOKENS = 8
#: Draft lengths the ``--sweep`` measures the target's batch-scoring cost at.
SWEEP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
TIME_PARTS = ("drafting", "target", "sampling", "other")


# ---- configurations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One thing to measure: a drafter, optionally at a fixed draft length."""

    drafter: str
    draft_length: int | None = None

    @property
    def label(self) -> str:
        return self.drafter if self.draft_length is None else f"{self.drafter}@{self.draft_length}"

    @property
    def is_reference(self) -> bool:
        return self.drafter in REFERENCE_DRAFTERS

    def to_dict(self) -> dict:
        return {"label": self.label, "drafter": self.drafter, "draft_length": self.draft_length,
                "reference": self.is_reference}


def parse_list(text: str, what: str) -> list[str]:
    """``"a, b,c"`` -> ``["a", "b", "c"]``; ConfigError when empty or repeated."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError(f"{what}: give at least one value")
    dup = sorted({x for x in items if items.count(x) > 1})
    if dup:
        raise ConfigError(f"{what}: repeated {', '.join(dup)}")
    return items


def parse_drafters(text: str, known: Sequence[str]) -> list[str]:
    """The ``--drafters`` list; ``none`` (the baseline) is added first when missing."""
    names = parse_list(text, "--drafters")
    valid = (*known, *REFERENCE_DRAFTERS)
    bad = [n for n in names if n not in valid and n != "auto"]
    if bad:
        raise ConfigError(f"unknown drafter(s) {', '.join(bad)}: choose from {', '.join(valid)}")
    if BASELINE not in names:
        names.insert(0, BASELINE)
    return names


def parse_lengths(text: str | None, max_length: int) -> list[int]:
    """The ``--lengths`` list (draft lengths in 1..max_length)."""
    if not text:
        return []
    out = []
    for item in parse_list(text, "--lengths"):
        try:
            k = int(item)
        except ValueError:
            raise ConfigError(f"--lengths: {item!r} is not an integer") from None
        if not 1 <= k <= max_length:
            raise ConfigError(f"--lengths: {k} is outside 1..{max_length}")
        out.append(k)
    return out


def parse_temperatures(text: str) -> list[float]:
    """``--temperature 0,0.8``: one or more temperatures, each valid for SamplingParams."""
    temps = []
    for item in parse_list(text, "--temperature"):
        try:
            t = float(item)
        except ValueError:
            raise ConfigError(f"--temperature: {item!r} is not a number") from None
        SamplingParams(temperature=t)  # validates
        temps.append(t)
    return temps


# ---- one measured run ----------------------------------------------------------------------


@dataclass
class Measurement:
    """What one generation measured, the same way for edgespec and the reference paths.

    ``decode_time`` excludes the prompt prefill; times are seconds inside it. ``time_llama`` is
    the time inside llama.cpp's decode calls (None when not measured). ``rounds`` counts target
    calls (the prefill's last row counts as the first round for the reference, as edgespec's
    first round scores the prompt's last token).

    Structured prompts only (None elsewhere): ``valid``, whether the answer parses and matches
    the schema (``invalid`` says why not), and ``forced``, the generated tokens that were drafts
    of the grammar alone (edgespec's source ``forced``; None for the reference, which has none).
    """

    generated: int
    tokens_per_second: float
    decode_time: float
    prompt_tokens: int
    rounds: int
    drafted: int
    accepted: int
    time_drafting: float
    time_target: float
    time_sampling: float
    finish_reason: str
    time_llama: float | None = None
    draft_length_hist: dict[str, int] | None = None
    detail: dict = field(default_factory=dict)
    valid: bool | None = None
    invalid: str | None = None
    forced: int | None = None

    def check(self, prompt: BenchPrompt, text: str) -> "Measurement":
        """Record whether ``text`` is a valid answer to a structured ``prompt`` (and the text,
        in ``detail``); nothing for the other prompts."""
        if prompt.schema is not None:
            self.invalid = check_answer(text, prompt.schema)
            self.valid = self.invalid is None
            self.detail["text"] = text
        return self

    @property
    def time_other(self) -> float:
        return max(self.decode_time - self.time_drafting - self.time_target - self.time_sampling, 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("drafting", "target", "sampling"):
            d.pop(f"time_{key}")
        d.pop("time_llama")
        d["time"] = {"drafting": self.time_drafting, "target": self.time_target,
                     "sampling": self.time_sampling, "other": self.time_other,
                     "llama": self.time_llama}
        return d


class Runner(Protocol):
    def run(self, config: Config, prompt: BenchPrompt, max_tokens: int,
            sampling: SamplingParams) -> Measurement: ...


def _draft_length_hist(stats_dict: dict) -> dict[str, int] | None:
    """Rounds per number of tokens drafted (what ``auto`` chose; 0 = a plain step), if the
    stats report it."""
    hist = stats_dict.get("drafted_hist")
    if not isinstance(hist, list):
        return None
    return {str(k): int(v) for k, v in enumerate(hist) if v}


class EdgespecRunner:
    """Runs edgespec's drafters through ``Engine.complete`` and reads its :class:`Stats`."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def prepare(self, prompt: BenchPrompt) -> None:
        """Prefill the draft model's cache with the prompt. The target's prefill is excluded from
        every run's decoding time, but the draft's happens inside the first round that uses it:
        without this, whichever configuration first drafts with the model on a prompt (it
        changes as the order rotates) would pay the draft's prompt prefill as drafting time."""
        from ..runtime.loop import prefill

        draft = self.engine.draft
        if draft is None:
            return
        tokens = self.engine.prompt_tokens(prompt.payload, chat=not prompt.raw)
        if len(tokens) < draft.n_ctx:
            prefill(draft, tokens)

    def run(self, config, prompt, max_tokens, sampling) -> Measurement:
        constrained = {} if prompt.schema is None else {"json_schema": prompt.schema}
        out = self.engine.complete(prompt.payload, max_tokens=max_tokens, sampling=sampling,
                                   drafter=config.drafter, draft_length=config.draft_length,
                                   chat=not prompt.raw, **constrained)
        s = out.stats
        stats_dict = s.to_dict()
        forced = s.by_drafter.get("forced")
        return Measurement(
            generated=s.generated, tokens_per_second=s.tokens_per_second,
            decode_time=s.decode_time, prompt_tokens=s.prompt_tokens, rounds=s.rounds,
            drafted=s.drafted, accepted=s.accepted, time_drafting=s.time_drafting,
            time_target=s.time_target, time_sampling=s.time_sampling,
            finish_reason=out.finish_reason, time_llama=getattr(s, "time_llama", None),
            draft_length_hist=_draft_length_hist(stats_dict),
            detail={"stats": stats_dict},
            forced=(forced.accepted if forced is not None else 0) if constrained else None,
        ).check(prompt, out.text)


class Runners:
    """Dispatch a configuration to edgespec or to the llama-cpp-python reference."""

    def __init__(self, edgespec: Runner, reference: Runner | None = None) -> None:
        self.edgespec = edgespec
        self.reference = reference

    def prepare(self, prompt: BenchPrompt) -> None:
        """Before a prompt's group of runs (see :meth:`EdgespecRunner.prepare`)."""
        prepare = getattr(self.edgespec, "prepare", None)
        if prepare is not None:
            prepare(prompt)

    def run(self, config, prompt, max_tokens, sampling) -> Measurement:
        if config.is_reference:
            if self.reference is None:
                raise ConfigError(f"{config.drafter}: no reference runner")
            return self.reference.run(config, prompt, max_tokens, sampling)
        return self.edgespec.run(config, prompt, max_tokens, sampling)


# ---- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRun:
    prompt: BenchPrompt
    config: Config
    temperature: float
    repeat: int
    position: int  #: place of this configuration in its prompt's rotated order


def rotate(items: Sequence, r: int) -> list:
    """``items`` rotated left by ``r`` (A B C -> B C A for r=1)."""
    if not items:
        return []
    r %= len(items)
    return list(items[r:]) + list(items[:r])


def plan_runs(prompts: Sequence[BenchPrompt], configs: Sequence[Config], repeats: int,
              temperatures: Sequence[float] = (0.0,),
              edit_only: Sequence[Config] = ()) -> list[PlannedRun]:
    """Every (temperature, repeat, prompt, configuration), interleaved: per prompt, all
    configurations back to back, their order rotated by the repeat number. ``edit_only``
    configurations (fixed draft lengths) join the rotation on ``edit`` prompts only."""
    plan = []
    for temperature in temperatures:
        for r in range(repeats):
            for prompt in prompts:
                these = list(configs) + (list(edit_only) if prompt.kind == "edit" else [])
                for pos, config in enumerate(rotate(these, r)):
                    plan.append(PlannedRun(prompt, config, temperature, r, pos))
    return plan


def sampling_for(base: SamplingParams, temperature: float, repeat: int) -> SamplingParams:
    """The run's sampling settings: repeat r uses seed ``base.seed + r`` (base 0 if unset)."""
    return SamplingParams(temperature=temperature, top_k=base.top_k, top_p=base.top_p,
                          min_p=base.min_p, seed=(base.seed or 0) + repeat)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MB (10^6 bytes)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb * 1024 / 1e6 if sys.platform != "darwin" else kb / 1e6


def current_rss_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return None


def execute(plan: Iterable[PlannedRun], runners: Runner, base: SamplingParams,
            max_tokens: int, records: list[dict],
            on_start: Callable[[PlannedRun], None] | None = None,
            on_done: Callable[[PlannedRun, dict], None] | None = None) -> list[dict]:
    """Run the plan, appending one JSON-ready dict per run to ``records`` as each finishes
    (so an interruption keeps everything measured so far). Before each prompt's group of runs,
    ``runners.prepare(prompt)`` (when it has one) primes caches that no run should pay for."""
    group = None
    for item in plan:
        if (item.temperature, item.repeat, item.prompt.id) != group:
            group = (item.temperature, item.repeat, item.prompt.id)
            if hasattr(runners, "prepare"):
                runners.prepare(item.prompt)
        if on_start:
            on_start(item)
        sampling = sampling_for(base, item.temperature, item.repeat)
        n = item.prompt.max_tokens or max_tokens
        m = runners.run(item.config, item.prompt, n, sampling)
        record = {
            "prompt": item.prompt.id, "kind": item.prompt.kind, "config": item.config.label,
            "drafter": item.config.drafter, "draft_length": item.config.draft_length,
            "temperature": item.temperature, "repeat": item.repeat, "position": item.position,
            "seed": sampling.seed, "max_tokens": n, **m.to_dict(), "rss_mb": current_rss_mb(),
        }
        records.append(record)
        if on_done:
            on_done(item, record)
    return records


def warm_up(configs: Sequence[Config], runners: Runner, base: SamplingParams,
            on_done: Callable[[Config], None] | None = None) -> None:
    """One short unrecorded run per configuration (first-call costs, reference loading)."""
    for config in configs:
        runners.run(config, WARMUP_PROMPT, WARMUP_TOKENS, sampling_for(base, 0.0, 0))
        if on_done:
            on_done(config)


# ---- aggregation -----------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def geometric_mean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values (None when there are none)."""
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b > 0 or math.isnan(a):
        return None
    return a / b


def _pooled(runs: Sequence[dict]) -> dict:
    """Counts summed over runs, then divided: acceptance, per-round means, time split."""
    total = {k: sum(r[k] for r in runs) for k in ("generated", "rounds", "drafted", "accepted")}
    decode = sum(r["decode_time"] for r in runs)
    split = {part: (sum(r["time"][part] for r in runs) / decode if decode > 0 else None)
             for part in TIME_PARTS}
    have_llama = runs and all(r["time"].get("llama") is not None for r in runs)
    inside = sum((r["time"]["llama"] if have_llama else r["time"]["target"]) for r in runs)
    return {
        "acceptance_rate": total["accepted"] / total["drafted"] if total["drafted"] else None,
        "mean_accepted": total["accepted"] / total["rounds"] if total["rounds"] else None,
        "tokens_per_round": total["generated"] / total["rounds"] if total["rounds"] else None,
        "time_split": split,
        # Share of decoding spent outside llama.cpp's decode calls (Python overhead, sampling,
        # drafting); from time.llama when measured, else everything but the target calls.
        "outside_llama": 1 - inside / decode if decode > 0 else None,
        "outside_llama_basis": "llama" if have_llama else "target",
        **{k: total[k] for k in ("generated", "rounds", "drafted", "accepted")},
    }


def _structured(runs: Sequence[dict]) -> dict:
    """Validity and the forced share of the runs on structured prompts (None elsewhere):
    ``valid`` of ``checked`` answers; ``forced_share``, forced tokens over generated ones,
    pooled over the runs that count forced tokens (edgespec's)."""
    checked = [r for r in runs if r.get("valid") is not None]
    counted = [r for r in checked if r.get("forced") is not None]
    generated = sum(r["generated"] for r in counted)
    return {"checked": len(checked) if checked else None,
            "valid": sum(bool(r["valid"]) for r in checked) if checked else None,
            "forced_share": (sum(r["forced"] for r in counted) / generated
                             if generated else None)}


def _merge_hists(runs: Sequence[dict]) -> dict[str, int] | None:
    hists = [r.get("draft_length_hist") for r in runs if r.get("draft_length_hist")]
    if not hists:
        return None
    out: dict[str, int] = {}
    for h in hists:
        for k, v in h.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def aggregate(runs: Sequence[dict], reference: str = REFERENCE_DRAFTERS[0]) -> dict:
    """Per prompt and overall aggregates of run dicts (see module docstring for the ratios)."""
    groups: dict[tuple, list[dict]] = {}
    order: dict[str, int] = {}
    for r in runs:
        groups.setdefault((r["temperature"], r["prompt"], r["config"]), []).append(r)
        order.setdefault(r["config"], len(order))
    per_prompt = []
    medians: dict[tuple, float] = {}
    for (temp, prompt, config), rs in groups.items():
        medians[temp, prompt, config] = median([r["tokens_per_second"] for r in rs])
    for (temp, prompt, config), rs in groups.items():
        tps = medians[temp, prompt, config]
        per_prompt.append({
            "temperature": temp, "prompt": prompt, "kind": rs[0]["kind"], "config": config,
            "drafter": rs[0]["drafter"], "draft_length": rs[0]["draft_length"], "runs": len(rs),
            "tokens_per_second": tps,
            "tokens_per_second_all": [r["tokens_per_second"] for r in rs],
            "ratio_vs_none": _ratio(tps, medians.get((temp, prompt, BASELINE))),
            "ratio_vs_reference": _ratio(tps, medians.get((temp, prompt, reference))),
            "draft_length_hist": _merge_hists(rs),
            **_pooled(rs), **_structured(rs),
        })
    per_prompt.sort(key=lambda a: (a["temperature"], _first_seen(runs, a["prompt"]), order[a["config"]]))

    overall = []
    for temp in sorted({a["temperature"] for a in per_prompt}):
        for config in sorted({a["config"] for a in per_prompt if a["temperature"] == temp},
                             key=order.__getitem__):
            rows = [a for a in per_prompt if a["temperature"] == temp and a["config"] == config]
            rs = [r for r in runs if r["temperature"] == temp and r["config"] == config]
            ratios = [(a["ratio_vs_none"], a["prompt"]) for a in rows if a["ratio_vs_none"] is not None]
            worst = min(ratios) if ratios else (None, None)
            kinds = sorted({a["kind"] for a in rows},
                           key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS))
            overall.append({
                "temperature": temp, "config": config, "drafter": rows[0]["drafter"],
                "draft_length": rows[0]["draft_length"], "prompts": len(rows),
                "ratio_vs_none": geometric_mean([x for x, _ in ratios]),
                "min_ratio_vs_none": worst[0], "min_ratio_prompt": worst[1],
                "ratio_vs_none_by_kind": {
                    k: geometric_mean([a["ratio_vs_none"] for a in rows if a["kind"] == k])
                    for k in kinds},
                "ratio_vs_reference": geometric_mean([a["ratio_vs_reference"] for a in rows]),
                "tokens_per_second": median([a["tokens_per_second"] for a in rows]),
                "draft_length_hist": _merge_hists(rs),
                **_pooled(rs), **_structured(rs),
            })
    return {"per_prompt": per_prompt, "overall": overall,
            "by_length": _by_length(overall), "temperature_retention": _retention(overall)}


def aggregate_anchors(runs: Sequence[dict], per_prompt: Sequence[dict]) -> dict:
    """The anchors' runs (llama.cpp's own tools, :mod:`edgespec.bench.anchors`) per prompt and
    tool: the median tok/s over the repeats, acceptance, and the ratio to edgespec's greedy
    ``none`` on that prompt in the same run (``per_prompt`` is :func:`aggregate`'s); overall:
    geometric mean of the ratios, median tok/s."""
    greedy = {(a["prompt"], a["config"]): a["tokens_per_second"] for a in per_prompt
              if a["temperature"] == 0 and a["draft_length"] is None}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["prompt"], r["tool"]), []).append(r)
    rows = []
    for (prompt, tool), rs in groups.items():
        tps = median([r["tokens_per_second"] for r in rs])
        drafted = sum(r["drafted"] or 0 for r in rs)
        rows.append({"prompt": prompt, "kind": rs[0]["kind"], "tool": tool, "runs": len(rs),
                     "tokens_per_second": tps,
                     "ratio_vs_none": _ratio(tps, greedy.get((prompt, BASELINE))),
                     "edgespec_config": ANCHOR_TOOLS[tool],
                     "edgespec_tokens_per_second": greedy.get((prompt, ANCHOR_TOOLS[tool])),
                     "acceptance_rate": (sum(r["accepted"] or 0 for r in rs) / drafted
                                         if drafted else None),
                     "prompt_tokens": rs[0]["prompt_tokens"]})
    overall = []
    for tool, twin in ANCHOR_TOOLS.items():
        mine = [a for a in rows if a["tool"] == tool]
        if mine:
            overall.append({"tool": tool, "prompts": len(mine),
                            "tokens_per_second": median([a["tokens_per_second"] for a in mine]),
                            "ratio_vs_none": geometric_mean([a["ratio_vs_none"] for a in mine]),
                            "edgespec_config": twin})
    return {"per_prompt": rows, "overall": overall}


def _first_seen(runs: Sequence[dict], prompt: str) -> int:
    return next(i for i, r in enumerate(runs) if r["prompt"] == prompt)


def _by_length(overall: Sequence[dict]) -> list[dict]:
    """Speedup against draft length: fixed-length configurations (edit prompts)."""
    return [{"temperature": o["temperature"], "drafter": o["drafter"], "draft_length": o["draft_length"],
             "ratio_vs_none": o["ratio_vs_none_by_kind"].get("edit"),
             "acceptance_rate": o["acceptance_rate"], "tokens_per_round": o["tokens_per_round"]}
            for o in overall if o["draft_length"] is not None]


def _retention(overall: Sequence[dict]) -> list[dict]:
    """For each temperature above 0: the edit-prompt speedup kept relative to greedy."""
    greedy = {o["config"]: o for o in overall if o["temperature"] == 0}
    out = []
    for o in overall:
        g = greedy.get(o["config"])
        if o["temperature"] == 0 or g is None:
            continue
        edit_t, edit_0 = o["ratio_vs_none_by_kind"].get("edit"), g["ratio_vs_none_by_kind"].get("edit")
        out.append({"config": o["config"], "temperature": o["temperature"],
                    "edit_ratio": edit_t, "greedy_edit_ratio": edit_0,
                    "retained": _ratio(edit_t, edit_0),
                    "mean_accepted": o["mean_accepted"], "greedy_mean_accepted": g["mean_accepted"]})
    return out


# ---- cost sweep ------------------------------------------------------------------------------


def run_sweep(engine, sizes: Sequence[int] = SWEEP_SIZES, repeats: int = 3) -> dict:
    """The target's call costs by width (one call scoring k tokens, k logit rows): a new width's
    first call, its second and its third (on a GPU: no graph, the capture, a replayed graph;
    the steady S(k) and the excesses U and C that :class:`~edgespec.core.costs.CallCosts`
    holds), the draft model's cost per drafted token, and for each k the break-even acceptance
    at the steady cost: the per-token acceptance rate at which a round of k - 1 drafts (k tokens
    scored) is as fast as plain decoding, for lookup (free drafts) and for the draft model.
    ``"never"``: no acceptance rate can pay for that round."""
    from ..core import costs
    from ..runtime import calibration

    times = calibration.relation_times(engine.target, list(sizes), repeats=repeats)
    steady = {k: t[2] for k, t in times.items()}
    draft_cost = None
    if engine.draft is not None:
        draft_cost = calibration.measure_draft_cost(engine.draft, n=8, repeats=repeats)

    def break_even(k: int, cost: float | None):
        if cost is None or k < 2:
            return None
        value = costs.break_even_acceptance(steady, k - 1, cost)
        return value if math.isfinite(value) else "never"

    t1 = steady.get(1)
    rows = [{"k": k, "t": s, "t_per_token": s / k, "t_rel": s / t1 if t1 else None,
             "t_new": times[k][0], "t_second": times[k][1],
             "changed": times[k][0] - s, "second": times[k][1] - s,
             "break_even_lookup": break_even(k, 0.0), "break_even_model": break_even(k, draft_cost)}
            for k, s in sorted(steady.items())]
    return {"target_curve": {str(k): t[0] for k, t in sorted(times.items())},
            "target_curve_second": {str(k): t[1] for k, t in sorted(times.items())},
            "target_curve_repeated": {str(k): t for k, t in sorted(steady.items())},
            "draft_cost_per_token": draft_cost, "repeats": repeats, "rows": rows}


# ---- the results document --------------------------------------------------------------------


def machine_info(engine=None) -> dict:
    """CPU, memory, versions, llama.cpp build features and the models' kernel mode."""
    from importlib.metadata import PackageNotFoundError, version

    from ..runtime.backend import consistent_build, system_info

    def pkg(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    cpu = None
    mem = None
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), None)
        mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal:"))
        mem = mem_kb * 1024 / 1e6
    except (OSError, StopIteration, ValueError):
        pass
    info = {
        "cpu": cpu or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_mb": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "edgespec": pkg("edgespec"),
        "llama_cpp_python": pkg("llama-cpp-python"),
        "llama_cpp_system_info": system_info(),
        "batch_consistent_build": consistent_build(),
    }
    if engine is not None:
        info.update(models_info(engine))
    return info


def models_info(engine) -> dict:
    def one(backend):
        if backend is None:
            return None
        opts = getattr(backend, "options", None)
        path = Path(backend.path) if getattr(backend, "path", None) else None
        return {
            "path": str(path) if path else None,
            "size_mb": path.stat().st_size / 1e6 if path and path.exists() else None,
            "n_ctx": getattr(backend, "n_ctx", None),
            "threads": getattr(opts, "n_threads", None),
            "kernels": None if opts is None else describe(backend),
            "kernel_mode": None if opts is None else mode_of(backend),
        }

    out = {"target": one(engine.target), "draft": one(engine.draft)}
    costs = getattr(engine, "costs", None)
    if costs is not None:  # auto's start-up calibration
        target = costs.target
        out["calibration"] = {
            "target_curve": {str(k): v for k, v in sorted(target.steady.points.items())},
            "width": target.steady.width, "graphs": target.graphs,
            "changed": target.changed, "second": target.second,
            "draft_per_token": costs.draft_per_token, "seconds": costs.calibration_seconds}
    return out


def build_document(*, settings: dict, machine: dict, prompts: Sequence[BenchPrompt],
                   configs: Sequence[Config], skipped: Sequence[dict], runs: Sequence[dict],
                   complete: bool, sweep: dict | None = None, memory: dict | None = None,
                   notes: Sequence[str] = (), anchors: dict | None = None) -> dict:
    """The full JSON results: settings, machine, raw runs, aggregates, sweep, memory, and the
    anchors (llama.cpp's own tools, :mod:`edgespec.bench.anchors`) with their aggregates."""
    aggregates = aggregate(runs) if runs else None
    if anchors is not None:
        per_prompt = aggregates["per_prompt"] if aggregates else []
        anchors = {**anchors, "aggregates": aggregate_anchors(anchors["runs"], per_prompt)}
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "complete": complete,
        "settings": settings,
        "machine": machine,
        "prompts": [{"id": p.id, "kind": p.kind, "max_tokens": p.max_tokens,
                     **({"schema": json.loads(p.schema)} if p.schema is not None else {})}
                    for p in prompts],
        "configs": [c.to_dict() for c in configs],
        "skipped": list(skipped),
        "notes": list(notes),
        "runs": list(runs),
        "aggregates": aggregates,
        "sweep": sweep,
        "memory": memory,
        "anchors": anchors,
        "peak_rss_mb": peak_rss_mb(),
    }
