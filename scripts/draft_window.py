"""What a draft window costs in acceptance, on real models.

For each bench prompt, the target writes ``--tokens`` tokens (temperature 0.8, a seed per
prompt); both models then score that text, and for every position the script compares the
acceptance probability ``sum(min(p, q))`` of the draft's whole processed row with that of the
draft restricted to its W most likely tokens (``W=...``), and with the window the engine uses
(``draft_distribution``: those W, less the tokens under 1e-4 of the top one's weight;
``W=...+floor``). The plain windows are computed with the dense reference ``process``. Prints
the running means over prompts, per sampling setting and window.

Usage: python scripts/draft_window.py [--pair default] [--tokens 80] [--windows 16,64,256]
"""
import argparse

import numpy as np

from edgespec import Engine, SamplingParams
from edgespec.bench.prompts import load_prompts
from edgespec.core.sampling import draft_distribution, process

SETTINGS = {"t0.8": SamplingParams(temperature=0.8), "t1.0": SamplingParams(temperature=1.0),
            "t0.8-top_p0.95": SamplingParams(temperature=0.8, top_p=0.95)}


def windowed(row: np.ndarray, window: int) -> np.ndarray:
    """The row with every logit below its ``window``-th largest at -inf (ties stay in)."""
    floor = np.sort(row)[row.size - window]
    return np.where(row >= floor, row, np.float32(-np.inf)).astype(np.float32)


def _name(w: int) -> str:
    """A column's name: 0 the whole row, W > 0 a plain window, -W the engine's window."""
    return "whole" if w == 0 else f"W={w}" if w > 0 else f"W={-w}+floor"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="default")
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--windows", default="16,64,256")
    args = ap.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    prompts = load_prompts()
    acc: dict[tuple[str, int], list[float]] = {}
    with Engine.load(pair=args.pair, drafter="model", progress=False) as engine:
        for i, prompt in enumerate(prompts):
            out = engine.complete(prompt.payload, max_tokens=args.tokens, drafter="none",
                                  sampling=SamplingParams(temperature=0.8, seed=i))
            seq = engine.prompt_tokens(prompt.payload) + [t.id for t in out.tokens]
            n = len(out.tokens)
            for model in (engine.target, engine.draft):
                model.reset()
            p_rows = engine.target.decode(seq[:-1], n).copy()
            q_rows = engine.draft.decode(seq[:-1], n).copy()
            vocab = p_rows.shape[1]
            for label, params in SETTINGS.items():
                for j in range(n):
                    p = process(p_rows[j], params)
                    row = np.full(vocab, -np.inf, np.float32)
                    m = min(vocab, q_rows.shape[1])
                    row[:m] = q_rows[j][:m]
                    acc.setdefault((label, 0), []).append(float(np.minimum(p, process(row, params)).sum()))
                    for w in windows:
                        q = process(windowed(row, w), params)
                        acc.setdefault((label, w), []).append(float(np.minimum(p, q).sum()))
                        q = draft_distribution(row, params, vocab, w).dense()
                        acc.setdefault((label, -w), []).append(float(np.minimum(p, q).sum()))
            rows = len(acc[(next(iter(SETTINGS)), 0)])
            print(f"after {prompt.id} ({rows} positions):")
            for label in SETTINGS:
                cells = "  ".join(f"{_name(w)} {np.mean(acc[(label, w)]):.4f}"
                                  for w in [0, *windows, *(-w for w in windows)])
                print(f"  {label:16s} {cells}", flush=True)


if __name__ == "__main__":
    main()
