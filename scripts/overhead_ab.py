"""Compare edgespec's host work per token between two versions, in one process.

    .venv/bin/python scripts/overhead_ab.py BASE [--configs model:16:t0.8-top_p0.95,...]
                                                 [--rounds 4] [--recorded rows.npz]
                                                 [--device-window]

``BASE`` is a git commit (or any ref) of this repository. Its ``edgespec`` package is copied
out of a temporary worktree under another name (``edgespec_base``, imports rewritten), its
compiled row passes built where it has them, and each configuration then runs in both
versions in turn, ``--rounds`` times each: the best of each is printed, in µs per generated
token, as ``bench --overhead`` measures it (the same synthetic model, rows and prompt, this
checkout's).

Why one process: on a shared VM, separate runs of the same code drift by up to ±50%, more
than most changes move; interleaved runs of the same code mostly agree within ~10%.
A ``BASE`` from before ``bench --overhead`` existed (``f112bbf``: the code before the hot-loop
work) is driven through its own loop, drafters and sampler with this checkout's synthetic
model.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.bench import overhead as new  # noqa: E402
from edgespec.runtime.allocator import keep_freed_memory  # noqa: E402

DEFAULT_CONFIGS = ("none:0:t0.8,none:0:t0.8-top_p0.95,model:4:t0.8-top_p0.95,"
                   "model:16:t0.8-top_k40,hybrid:16:t0.8-top_p0.95,auto:4:t0.8")
IMPORT = re.compile(r"\b(from|import) edgespec(?=[. ]|$)", re.M)


def copy_base(ref: str, into: Path) -> Path:
    """``ref``'s package as ``into/edgespec_base`` (imports rewritten, row passes built).
    ``ref``: a commit, or a directory that holds an ``edgespec`` package (a ``git archive``
    of one, where there is no repository: a lent GPU machine)."""
    pkg = into / "edgespec_base"
    if Path(ref).is_dir():
        shutil.copytree(Path(ref) / "edgespec", pkg)
    else:
        tree = into / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree),
                        ref], check=True, capture_output=True)
        try:
            shutil.copytree(tree / "edgespec", pkg)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)
    for py in pkg.rglob("*.py"):
        py.write_text(IMPORT.sub(r"\1 edgespec_base", py.read_text()))
    source = pkg / "core" / "_rows.c"
    if source.exists():
        out = source.with_name("_rows" + sysconfig.get_config_var("EXT_SUFFIX"))
        subprocess.run(["cc", "-O3", "-Wno-psabi", "-shared", "-fPIC",
                        "-I" + sysconfig.get_paths()["include"], str(source), "-o", str(out),
                        "-lm"], check=True)
    return pkg


def flat_layout_measure():
    """``measure`` for a version without ``edgespec.bench.overhead`` (its modules at the
    package's top level): its loop, drafters and sampler over this checkout's synthetic model."""
    from importlib import import_module

    costs, policy_mod = import_module("edgespec_base.costs"), import_module("edgespec_base.policy")
    drafters, loop = import_module("edgespec_base.drafters"), import_module("edgespec_base.loop")
    sampling, stats = import_module("edgespec_base.sampling"), import_module("edgespec_base.stats")

    def measure(drafter, k, label, pools, prompt, n_tokens, seed=0, windows=None):
        target_pool, draft_pool, _ = pools
        p = new.SAMPLINGS[label]
        params = sampling.SamplingParams(p.temperature, p.top_k, p.top_p, p.min_p, seed)
        n_ctx = len(prompt) + n_tokens + 64
        target = new.SyntheticModel(target_pool, n_ctx)
        draft = (new.SyntheticModel(draft_pool, n_ctx)
                 if drafter in ("model", "hybrid", "auto") else None)
        policy = None
        if drafter == "auto":
            curve = costs.CostCurve(dict(new.GPU_CURVE))
            if hasattr(costs, "CallCosts"):  # (the policy since its restatement)
                curve = costs.CallCosts(curve)
            policy = policy_mod.Policy(curve, policy_mod.CostEstimate(new.GPU_DRAFT_TOKEN))
        made = drafters.make_drafter(drafter, draft, target.n_vocab, policy=policy)
        if policy is not None:  # GPU-like costs, as the bench keeps them
            (policy.costs if hasattr(policy, "costs") else policy.curve).observe = (
                lambda *a, **kw: None)
            policy.lookup_cost.observe = lambda s: None
            if policy.draft_cost is not None:
                policy.draft_cost.observe = lambda s: None
        loop.prefill(target, prompt)
        if draft is not None:
            draft.decode(prompt[:-1], 0)
        models = [m for m in (target, draft) if m is not None]
        before = sum(m.decode_seconds for m in models)
        rng = sampling.make_rng(seed)
        t0 = time.perf_counter()
        produced = n_rounds = 0
        for rnd in loop.rounds(target, made, prompt, params, rng, k, stats.Stats(), n_tokens):
            produced += len(rnd.tokens)
            n_rounds += 1
            if produced >= n_tokens:
                break
        host = time.perf_counter() - t0 - (sum(m.decode_seconds for m in models) - before)
        return new.OverheadResult(drafter, k if drafter != "none" else 0, label, produced,
                                  n_rounds, host)

    return measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="git commit or ref to compare with this checkout")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="drafter:k:sampling,... (sampling as bench --overhead labels it), "
                         "or all: every configuration of bench --overhead")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--recorded", help="rows recorded by bench --overhead --recorded")
    ap.add_argument("--device-window", action="store_true")
    args = ap.parse_args()

    keep_freed_memory()
    with tempfile.TemporaryDirectory() as tmp:
        copy_base(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        try:
            from edgespec_base.bench import overhead as old  # type: ignore[import-not-found]
            old_measure = old.measure
        except ImportError:
            if args.device_window:
                sys.exit(f"{args.base} has no device window to compare")
            old_measure = flat_layout_measure()
        pools = new.load_pools(args.recorded) if args.recorded else new.make_pools(new.DEFAULT_VOCAB)
        prompt = new.make_prompt(pools[2])
        windows = new.device_windows(pools[1], 64) if args.device_window else None
        print(f"µs of host work per generated token, best of {args.rounds} interleaved "
              f"({args.base} → this checkout)")
        configs = ([f"{d}:{k}:{s}" for d in new.DRAFTERS
                    for k in (new.LENGTHS if d != "none" else (0,)) for s in new.SAMPLINGS]
                   if args.configs == "all" else args.configs.split(","))
        for conf in configs:
            drafter, k, label = conf.split(":")
            best = {"base": float("inf"), "new": float("inf")}
            for r in range(args.rounds):
                for name, measure in (("base", old_measure), ("new", new.measure)):
                    kw = {"windows": windows} if windows is not None else {}
                    res = measure(drafter, int(k), label, pools, prompt, args.tokens, seed=r, **kw)
                    best[name] = min(best[name], res.us_per_token)
            print(f"{drafter:7} {int(k):3} {label:16} {best['base']:9.1f} → {best['new']:9.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
