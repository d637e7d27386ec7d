"""``edgespec bench`` output: terminal tables, the JSON results file, and the plot.

Everything here reads the results document built by :func:`edgespec.bench.build_document`
(the same dict that is written as JSON), so a saved result renders the same way.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, Sequence

Echo = Callable[[str], None]
#: Configurations that never draft.
_PLAIN = ("none", "llama-cpp-python-plain")


# ---- formatting helpers ----------------------------------------------------------------------


def _num(x, fmt: str = "{:.1f}", none: str = "-") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return fmt.format(x)


def _pct(x) -> str:
    return _num(None if x is None else 100 * x, "{:.0f}%")


def _ratio(x) -> str:
    return _num(x, "{:.2f}x")


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None) -> list[str]:
    """Plain-text columns; numeric columns (``right``) right-aligned."""
    right = right if right is not None else set(range(2, len(header)))
    widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]

    def line(row):
        cells = [str(v).rjust(w) if c in right else str(v).ljust(w)
                 for c, (v, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return out


def _temp_title(t: float) -> str:
    return "greedy (temperature 0)" if t == 0 else f"temperature {t:g}"


# ---- terminal report -------------------------------------------------------------------------


def print_report(doc: dict, echo: Echo) -> None:
    """Per-prompt and overall tables, temperature retention, notes (runs must exist)."""
    agg = doc.get("aggregates")
    s = doc["settings"]
    if not agg:
        echo("no completed runs")
        return
    structured = any(a.get("checked") for a in agg["per_prompt"])
    for temp in sorted({a["temperature"] for a in agg["per_prompt"]}):
        echo("")
        echo(f"{_temp_title(temp)}: median of {s.get('repeats')} repeat(s), up to "
             f"{s.get('max_tokens')} tokens; tok/s excludes the prompt prefill; "
             f"x none = speedup over plain decoding (none) in this run")
        rows = []
        last = None
        for a in agg["per_prompt"]:
            if a["temperature"] != temp or a["draft_length"] is not None:  # see print_lengths
                continue
            split = a["time_split"]
            plain = a["drafter"] in _PLAIN
            rows.append([
                a["prompt"] if a["prompt"] != last else "", a["config"],
                _num(a["tokens_per_second"]), _ratio(a["ratio_vs_none"]),
                "-" if plain else _pct(a["acceptance_rate"]),
                "-" if plain else _num(a["mean_accepted"], "{:.2f}"),
                _num(a["tokens_per_round"], "{:.2f}"),
                _pct(split["drafting"]), _pct(split["target"]), _pct(split["sampling"]),
                _pct(split["other"]), *(_structured_cells(a) if structured else ()),
            ])
            last = a["prompt"]
        for line in table(["prompt", "drafter", "tok/s", "x none", "accept", "acc/rnd", "tok/rnd",
                           "draft", "target", "sample", "other",
                           *(("valid", "forced") if structured else ())], rows):
            echo(line)

        echo("")
        echo(f"overall, {_temp_title(temp)}: x none is the geometric mean over prompts of "
             "median(drafter) / median(none)")
        rows = []
        kinds = ["edit", "code", "chat", *(["structured"] if structured else [])]
        for o in agg["overall"]:
            if o["temperature"] != temp or o["draft_length"] is not None:
                continue
            by_kind = o["ratio_vs_none_by_kind"]
            plain = o["drafter"] in _PLAIN
            worst = (f"{_ratio(o['min_ratio_vs_none'])} {o['min_ratio_prompt']}"
                     if o["min_ratio_vs_none"] is not None else "-")
            rows.append([
                o["config"], _num(o["tokens_per_second"]), _ratio(o["ratio_vs_none"]), worst,
                *[_ratio(by_kind.get(k)) for k in kinds],
                "-" if plain else _pct(o["acceptance_rate"]),
                "-" if plain else _num(o["mean_accepted"], "{:.2f}"),
                _num(o["tokens_per_round"], "{:.2f}"),
                _pct(o["outside_llama"]), _ratio(o["ratio_vs_reference"]),
                *(_structured_cells(o) if structured else ()),
            ])
        header = ["drafter", "tok/s", "x none", "min x none", *kinds, "accept", "acc/rnd",
                  "tok/rnd", "outside", "x lcp", *(("valid", "forced") if structured else ())]
        for line in table(header, rows, right=set(range(1, len(header))) - {3}):
            echo(line)
    echo("")
    echo("accept = accepted / drafted tokens; acc/rnd = accepted drafts per target call; "
         "tok/rnd = tokens per target call; draft/target/sample/other = share of decoding time; "
         "outside = share of decoding outside llama.cpp's decode calls (Python, sampling, drafting); "
         "x lcp = speedup over llama-cpp-python's prompt-lookup path")
    if structured:
        echo("structured prompts: every configuration answers under the prompt's JSON schema "
             "(edgespec: llguidance's masks; llama-cpp-python: its grammar from the schema, "
             "llama.cpp's grammar sampler); valid = answers that parse and match the schema; "
             "forced = share of the generated tokens drafted as source forced: a round that "
             "starts where the grammar allows one token alone drafts what it forces (a draft "
             "already running through such tokens keeps its own source; none drafts nothing)")
    for r in agg.get("temperature_retention", []):
        if r["config"] in _PLAIN or "@" in r["config"]:
            continue
        echo(f"{r['config']} at temperature {r['temperature']:g} keeps {_pct(r['retained'])} of its "
             f"greedy edit speedup ({_ratio(r['edit_ratio'])} vs {_ratio(r['greedy_edit_ratio'])}; "
             f"acc/rnd {_num(r['mean_accepted'], '{:.2f}')} vs "
             f"{_num(r['greedy_mean_accepted'], '{:.2f}')})")
    base = [o for o in agg["overall"] if o["config"] == "none"]
    for o in base:
        basis = "llama.cpp decode calls" if o["outside_llama_basis"] == "llama" else "target calls"
        echo(f"none at temperature {o['temperature']:g}: {_pct(o['outside_llama'])} of decoding time "
             f"outside {basis} (Python overhead)")
    if agg.get("by_length"):
        print_lengths(agg["by_length"], echo)


def _structured_cells(a: dict) -> list[str]:
    """``valid`` (valid / checked answers) and ``forced`` of a structured aggregate, else dashes."""
    if not a.get("checked"):
        return ["-", "-"]
    return [f"{a['valid']}/{a['checked']}", _pct(a["forced_share"])]


def print_anchors(doc: dict, echo: Echo) -> None:
    """The anchors: llama.cpp's own tools on the same prompts, with x none against edgespec's
    greedy ``none`` of this run, then one line per missing or failed tool."""
    anchors = doc["anchors"]
    s = anchors["settings"]
    agg = anchors.get("aggregates") or {"per_prompt": [], "overall": []}
    draft_ngl = "" if s["draft_n_gpu_layers"] is None else f", -ngld {s['draft_n_gpu_layers']}"
    build = next((r["detail"].get("build_commit") for r in anchors["runs"]
                  if r["detail"].get("build_commit")), None)
    echo("")
    echo(f"anchors: llama.cpp's own tools from {anchors['bin']}"
         + (f" (build {build})" if build else "")
         + f", not edgespec runs: greedy, the same prompts, models and settings "
         f"(k={s['draft_length']}, -ngl {s['n_gpu_layers']}{draft_ngl}, -fa {s['flash_attn']}, "
         f"-t {s['threads']}, -c {s['n_ctx']}); median of the runs; x none = tok/s / edgespec's "
         "greedy none on the prompt in this run")
    if agg["per_prompt"]:
        rows, last = [], None
        for a in agg["per_prompt"]:
            rows.append([a["prompt"] if a["prompt"] != last else "", a["tool"],
                         _num(a["tokens_per_second"]), _ratio(a["ratio_vs_none"]),
                         _pct(a["acceptance_rate"]), a["edgespec_config"],
                         _num(a["edgespec_tokens_per_second"])])
            last = a["prompt"]
        for line in table(["prompt", "llama.cpp tool", "tok/s", "x none", "accept", "edgespec",
                           "tok/s"], rows, right={2, 3, 4, 6}):
            echo(line)
        echo("")
        echo("anchors overall: x none is the geometric mean over prompts")
        rows = [[o["tool"], _num(o["tokens_per_second"]), _ratio(o["ratio_vs_none"])]
                for o in agg["overall"]]
        for line in table(["llama.cpp tool", "tok/s", "x none"], rows, right={1, 2}):
            echo(line)
    for line in anchor_problems(anchors):
        echo(line)


def anchor_problems(anchors: dict) -> list[str]:
    """One line per tool that is missing or failed (its prompts named), and per run whose tool
    tokenized the prompt differently from edgespec."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for e in anchors["errors"]:
        grouped.setdefault((e["tool"], e["error"]), []).append(e["prompt"])
    lines = []
    for (tool, error), where in grouped.items():
        prompts = [p for p in where if p]
        lines.append(f"{tool} failed on {', '.join(prompts)}: {error}" if prompts
                     else f"{tool}: {error}")
    mismatched = {(r["tool"], r["prompt"]): (r["prompt_tokens"], ours) for r in anchors["runs"]
                  if (ours := r["detail"].get("edgespec_prompt_tokens")) is not None
                  and r["prompt_tokens"] is not None and r["prompt_tokens"] != ours}
    for (tool, prompt), (theirs, ours) in mismatched.items():
        lines.append(f"{tool} on {prompt}: the prompt is {theirs} tokens for it, {ours} for edgespec")
    return lines


def print_lengths(rows: Sequence[dict], echo: Echo) -> None:
    echo("")
    echo("speedup against draft length (edit prompts, geometric mean of x none)")
    out = [[_num(r["temperature"], "{:g}"), r["drafter"], str(r["draft_length"]),
            _ratio(r["ratio_vs_none"]), _pct(r["acceptance_rate"]), _num(r["tokens_per_round"], "{:.2f}")]
           for r in rows]
    for line in table(["temp", "drafter", "k", "x none", "accept", "tok/rnd"], out, right={2, 3, 4, 5}):
        echo(line)


def print_sweep(sweep: dict, echo: Echo) -> None:
    """The target's call costs by width and break-even acceptance rates."""
    echo("")
    draft = sweep.get("draft_cost_per_token")
    echo("target call cost by width k: one decode call scoring k tokens with k logit rows"
         + (f"; draft model: {1000 * draft:.2f} ms per drafted token" if draft is not None else
            "; no draft model loaded"))

    def even(x):
        return x if isinstance(x, str) else _pct(x)

    def ms(r, key):
        return _num(1000 * r[key], "{:.2f}") if r.get(key) is not None else "-"

    rows = [[str(r["k"]), ms(r, "t"), ms(r, "t_per_token"), _num(r["t_rel"], "{:.2f}"),
             ms(r, "changed"), ms(r, "second"),
             even(r["break_even_lookup"]), even(r["break_even_model"])]
            for r in sweep["rows"]]
    for line in table(["k", "S(k) ms", "S(k)/k ms", "S(k)/S(1)", "U ms", "C ms",
                       "break-even lookup", "break-even model"], rows, right=set(range(8))):
        echo(line)
    echo("S(k): a call of width k after two of the same width (on a GPU: a replayed graph); "
         "U: what the first call of a new width costs more (no graph); C: what the second "
         "costs more (it captures one). auto charges U + C once per change of width")
    echo("break-even = per-token acceptance rate at which a round of k-1 drafts (k tokens scored) "
         "is as fast as plain decoding, at the steady cost")


def print_memory(memory: dict, echo: Echo) -> None:
    echo("")
    echo(f"peak memory: {memory['prompt_tokens']}-token prompt, context {memory['n_ctx']}, "
         f"{memory['max_tokens']} tokens generated, each side in a fresh process "
         f"(MB = 10^6 bytes; bound = model files + KV cache + {memory['headroom_mb']:.0f} MB)")
    rows = []
    for s in memory["sides"]:
        verdict = "error" if s.get("error") else ("within" if s["within_bound"] else "OVER")
        rows.append([s["side"], _num(s.get("peak_rss_mb"), "{:.0f}"), _num(s["files_mb"], "{:.0f}"),
                     _num(s["kv_mb"], "{:.0f}"), _num(s["bound_mb"], "{:.0f}"), verdict,
                     str(s.get("prompt_tokens", "-")), _num(s.get("seconds"), "{:.0f}s")])
    for line in table(["side", "peak RSS", "files", "KV cache", "bound", "verdict", "prompt", "time"],
                      rows, right={1, 2, 3, 4, 6, 7}):
        echo(line)
    for s in memory["sides"]:
        if s.get("error"):
            echo(f"{s['side']}: {s['error']}")
        if s.get("logits_all"):
            echo(f"{s['side']}: logits_all=True keeps n_ctx x n_vocab float32 logits "
                 "(written for every prompt token)")


# ---- files -----------------------------------------------------------------------------------


def write_json(doc: dict, path: Path) -> Path:
    """Write the results document (atomically: a partial file never has the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(_finite(doc), indent=1, ensure_ascii=False, default=str) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def _finite(x):
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_plot(doc: dict, path: Path) -> Path | None:
    """Speedup per prompt and drafter (one panel per temperature), speedup against draft length
    (or the adaptive drafter's chosen lengths), and the target's cost curve when measured.
    Returns None when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = doc.get("aggregates") or {}
    per_prompt = agg.get("per_prompt") or []
    temps = sorted({a["temperature"] for a in per_prompt
                    if a["config"] != "none" and a["draft_length"] is None})
    panels: list[Callable] = [lambda ax, t=t: _speedup_panel(ax, per_prompt, t) for t in temps]
    if agg.get("by_length"):
        panels.append(lambda ax: _length_panel(ax, agg["by_length"]))
    else:
        hists = [o for o in agg.get("overall", []) if o["drafter"] == "auto" and o.get("draft_length_hist")]
        if hists:
            panels.append(lambda ax: _hist_panel(ax, hists))
    if doc.get("sweep"):
        panels.append(lambda ax: _sweep_panel(ax, doc["sweep"]))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.8 * len(panels)), squeeze=False)
    for draw, ax in zip(panels, axes[:, 0]):
        draw(ax)
    machine = doc.get("machine", {})
    target = (machine.get("target") or {}).get("path")
    cpus = machine.get("cpus_usable") or machine.get("cpu_count")
    fig.suptitle("edgespec bench" + (f": {Path(target).name}" if target else "")
                 + (f" ({cpus} CPUs)" if cpus else ""), fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _speedup_panel(ax, per_prompt: Sequence[dict], temp: float) -> None:
    rows = [a for a in per_prompt if a["temperature"] == temp and a["draft_length"] is None
            and a["config"] != "none"]
    prompts = list(dict.fromkeys(a["prompt"] for a in rows))
    configs = list(dict.fromkeys(a["config"] for a in rows))
    width = 0.8 / max(len(configs), 1)
    cmap = _colors()
    for i, config in enumerate(configs):
        values = {a["prompt"]: a["ratio_vs_none"] for a in rows if a["config"] == config}
        xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(prompts))]
        ys = [values.get(p) or 0.0 for p in prompts]
        ax.bar(xs, ys, width, label=config, color=cmap(i))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(prompts)), prompts, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs none")
    ax.set_title(f"speedup per prompt and drafter, {_temp_title(temp)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _length_panel(ax, rows: Sequence[dict]) -> None:
    styles = ["-", "--", ":", "-."]
    temps = sorted({r["temperature"] for r in rows})
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    cmap = _colors()
    for i, d in enumerate(drafters):
        for j, t in enumerate(temps):
            pts = sorted((r["draft_length"], r["ratio_vs_none"]) for r in rows
                         if r["drafter"] == d and r["temperature"] == t and r["ratio_vs_none"])
            if pts:
                ax.plot(*zip(*pts), marker="o", linestyle=styles[j % len(styles)], color=cmap(i),
                        label=f"{d}, T={t:g}")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xscale("log", base=2)
    ks = sorted({r["draft_length"] for r in rows})
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup vs none (edit prompts)")
    ax.set_title("speedup against draft length", fontsize=10)
    ax.legend(fontsize=8)


def _hist_panel(ax, overall: Sequence[dict]) -> None:
    cmap = _colors()
    for i, o in enumerate(overall):
        hist = o["draft_length_hist"]
        ks = [int(k) for k in hist]
        total = sum(hist.values()) or 1
        ax.bar([k + 0.8 * (i / len(overall) - 0.4) for k in ks], [v / total for v in hist.values()],
               0.8 / len(overall), color=cmap(i), label=f"{o['config']}, T={o['temperature']:g}")
    ax.set_xlabel("tokens drafted in the round (0 = plain decoding step)")
    ax.set_ylabel("share of rounds")
    ax.set_title("draft lengths auto chose", fontsize=10)
    ax.legend(fontsize=8)


def _sweep_panel(ax, sweep: dict) -> None:
    ks = [r["k"] for r in sweep["rows"]]
    ax.plot(ks, [1000 * r["t"] for r in sweep["rows"]], marker="o", label="S(k)")
    ax.plot(ks, [1000 * r["t_per_token"] for r in sweep["rows"]], marker="s", label="S(k)/k")
    if sweep.get("draft_cost_per_token") is not None:
        ax.axhline(1000 * sweep["draft_cost_per_token"], color="gray", linestyle=":",
                   label="draft model, per token")
    ax.set_xticks([k for k in ks if k in (1, 2, 4, 8) or k % 8 == 0])
    ax.set_xlabel("tokens scored per call k")
    ax.set_ylabel("ms")
    ax.set_title("target batch-scoring cost on this machine", fontsize=10)
    ax.legend(fontsize=8)


def _colors():
    import matplotlib

    return matplotlib.colormaps["tab10"]
