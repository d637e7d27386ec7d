"""Measure how much llama.cpp's logits depend on batch shape, and what each remedy buys.

For a fixed context, score the same tokens (a) one decode call per token and (b) k per call;
report the largest |logit difference| for each k, and what one plain step (one token, its
logits) costs in each mode.

Two tables:

- the CPU switches (default, no ``--ngl``): ggml-cpu's tiled matmul, weight repacking and flash
  attention, each combination in a fresh process (GGML_CPU_TILED_MM is read once per process);
- ``--widths 2,4,8,16,32`` (and ``--ngl -1`` on a GPU): no padding, then every logit-reading
  call padded to a fixed width W (edgespec's ``--fixed-width``), with flash attention off and
  on. A row of zeros is a width at which speculation is exact on this device; its step cost
  is what plain decoding pays for it.

Usage: python scripts/batch_consistency.py MODEL.gguf [--threads N] [--long]
       python scripts/batch_consistency.py MODEL.gguf --ngl -1 --widths 2,4,8,16,32 [--long]
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

KS = (2, 3, 4, 8, 16, 32)
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
CONTINUATION = " return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint(fibonacci(10))"


def _load(model: str, *, repack: bool = True, flash: bool = False, threads: int = 2,
          ngl: int = 0, width: int = 0):
    """A backend with llama.cpp's repacking and flash attention set as asked."""
    import llama_cpp

    from edgespec.runtime import backend as B

    orig_m, orig_c = llama_cpp.llama_model_default_params, llama_cpp.llama_context_default_params

    def mp():
        p = orig_m(); p.use_extra_bufts = repack; return p

    def cp():
        p = orig_c(); p.flash_attn_type = 1 if flash else 0; return p

    llama_cpp.llama_model_default_params, llama_cpp.llama_context_default_params = mp, cp
    try:
        # batch_consistent=False: one call per batch (no CPU pieces), flash attention as set
        return B.LlamaBackend(B.ModelOptions(path=Path(model), n_threads=threads, n_ctx=4096,
                                             n_gpu_layers=ngl, batch_consistent=False,
                                             fixed_width=width))
    finally:
        llama_cpp.llama_model_default_params, llama_cpp.llama_context_default_params = orig_m, orig_c


def _text(be, long: bool) -> tuple[list[int], list[int]]:
    prompt = be.tokenize(PROMPT * (12 if long else 1))  # long: > 512 KV cells
    cont = be.tokenize(CONTINUATION, add_special=False)
    return prompt, (cont * 8)[: max(KS)]


def _step_ms(be, prompt: list[int], cont: list[int], n: int = 16) -> float:
    """Median ms of one plain step: one token decoded, its logits read."""
    from edgespec.runtime.loop import prefill

    prefill(be, prompt + cont[:1])  # caches the prompt
    times = []
    for t in cont[:n]:
        t0 = time.perf_counter()
        be.decode([t], 1)
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[len(times) // 2]


def measure(be, long: bool) -> dict:
    from edgespec.bench.verify import batch_noise_by_width

    prompt, cont = _text(be, long)
    return {"n_prompt": len(prompt), "worst": batch_noise_by_width(be, prompt, cont, KS),
            "step_ms": _step_ms(be, prompt, cont)}


def _row(label: str, res: dict) -> str:
    return (f"{label:28} prompt={res['n_prompt']:4d} step={res['step_ms']:7.2f} ms  "
            + "  ".join(f"k={k}: {v:.4f}" for k, v in res["worst"].items()))


def widths_table(a) -> None:
    widths = [int(w) for w in a.widths.split(",") if w.strip()]
    for flash in (False, True):
        for width in [0] + widths:
            be = _load(a.model, flash=flash, threads=a.threads, ngl=a.ngl, width=width)
            try:
                label = f"flash_attn={int(flash)} " + (f"width={width}" if width else "no padding")
                print(_row(label, measure(be, a.long)), flush=True)
            finally:
                be.close()


def cpu_switches(a) -> None:
    from edgespec.runtime.backend import inconsistent_features

    print("llama.cpp batch-shaped features compiled in:", ", ".join(inconsistent_features()) or "none")
    for tiled, repack, flash in itertools.product(["1", "0"], [True, False], [True, False]):
        env = dict(os.environ, GGML_CPU_TILED_MM=tiled)
        cmd = [sys.executable, __file__, a.model, "--threads", str(a.threads),
               "--child", str(int(repack)), str(int(flash))] + (["--long"] if a.long else [])
        res = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
        print(_row(f"tiled_mm={tiled} repack={int(repack)} flash={int(flash)}", res), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long", action="store_true", help="a prompt over 512 tokens")
    ap.add_argument("--ngl", type=int, default=0, help="layers offloaded (-1: all)")
    ap.add_argument("--widths", default=None, metavar="W,W,...",
                    help="fixed widths to compare with no padding (e.g. 2,4,8,16,32)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        be = _load(a.model, repack=a.child[0] == "1", flash=a.child[1] == "1", threads=a.threads)
        print(json.dumps(measure(be, a.long)))
        sys.exit(0)
    if a.widths or a.ngl:
        widths_table(a if a.widths else argparse.Namespace(**{**vars(a), "widths": "4,8,16"}))
    else:
        cpu_switches(a)
