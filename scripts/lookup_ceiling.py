"""How fast can prompt lookup make greedy decoding on this machine, at best?

Generates each built-in bench prompt's greedy answer once (drafter ``none``), measures the
target's cost curve t(n), then replays the answer offline:

- ``oracle``: a clairvoyant policy that knows how many lookup tokens the target will accept and
  picks the k that maximises that round's tokens per second: an upper bound for any policy that
  drafts with lookup;
- ``auto``: edgespec's policy (``edgespec.core.policy.Policy``), learning as it goes;
- ``k=4``: lookup with a fixed draft length of 4.

Speedups are predicted from the measured t(n) (greedy acceptance is deterministic, so the replay
is exact up to timing noise). Usage: python scripts/lookup_ceiling.py [--fast-kernels] [-n 256]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edgespec import Engine, SamplingParams, config  # noqa: E402
from edgespec.bench.prompts import load_prompts  # noqa: E402
from edgespec.core.costs import CallCosts, CostCurve  # noqa: E402
from edgespec.runtime.calibration import measure_target_curve  # noqa: E402
from edgespec.core.lookup import find_continuation  # noqa: E402
from edgespec.core.lookup import common_prefix as matched  # noqa: E402
from edgespec.core.policy import Offer, Policy  # noqa: E402

NS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def replay(prompt, gen, t: CostCurve, mode: str, cap: int = config.AUTO_MAX_DRAFT_LENGTH) -> float:
    """Predicted speedup over plain decoding of one greedy answer under a lookup policy."""
    policy = Policy(CallCosts(CostCurve(dict(t.points))), None)
    i, cost = 0, 0.0
    while i < len(gen):
        match = find_continuation(prompt + gen[:i], max_ngram=config.DEFAULT_MAX_NGRAM,
                                  min_ngram=config.DEFAULT_MIN_NGRAM, max_tokens=cap)
        proposal, ngram = (match.tokens, match.ngram) if match else ([], 0)
        right = matched(proposal, gen[i:])
        if mode == "oracle":
            k = max(range(len(proposal) + 1), key=lambda k: (min(right, k) + 1) / t(k + 1))
        elif mode == "k=4":
            k = min(4, len(proposal))
        else:
            choice = policy.choose(Offer(cap, len(proposal), ngram, model=False))
            k = choice.k if choice.source == "lookup" else 0
        emitted = min(right, k) + 1
        cost += t(k + 1)
        if mode == "auto" and proposal:
            seen = matched(proposal, gen[i:i + emitted])
            policy.observe_lookup(ngram, seen, seen < min(len(proposal), emitted))
        i += emitted
    return len(gen) * t(1) / cost


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", "--tokens", type=int, default=256)
    ap.add_argument("--fast-kernels", action="store_true")
    a = ap.parse_args()
    with Engine.load(pair="default", drafter="none", batch_consistent=not a.fast_kernels,
                     progress=False) as engine:
        traces = []
        for p in load_prompts():
            out = engine.complete(p.payload, max_tokens=a.tokens, drafter="none",
                                  sampling=SamplingParams(temperature=0))
            traces.append((p.id, engine.prompt_tokens(p.payload), [tok.id for tok in out.tokens]))
        curve = CostCurve(measure_target_curve(engine.target, NS, repeats=3, context=300))
    kernels = "fast" if a.fast_kernels else "exact (batch-consistent)"
    print(f"target t(n), {kernels} kernels, ms:  "
          + "  ".join(f"{n}:{1000 * curve(n):.0f}" for n in NS))
    print(f"best per-token cost {1000 * min(curve(n) / n for n in NS):.1f} ms vs t(1) "
          f"{1000 * curve(1):.1f} ms: no drafter can beat {max(curve(1) * n / curve(n) for n in NS):.2f}x")
    print(f"{'prompt':18} {'oracle':>7} {'auto':>7} {'k=4':>7}")
    for pid, prompt, gen in traces:
        row = [replay(prompt, gen, curve, mode) for mode in ("oracle", "auto", "k=4")]
        print(f"{pid:18} " + " ".join(f"{r:6.2f}x" for r in row))


if __name__ == "__main__":
    main()
