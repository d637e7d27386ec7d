"""Measure how much llama.cpp's logits depend on batch shape, and what each switch buys.

For a fixed context, score the same tokens (a) one decode call per token and (b) in one call of
k tokens; report the largest |logit difference|. Runs each setting in a fresh process because
GGML_CPU_TILED_MM is read once per process.

Usage: python scripts/batch_consistency.py MODEL.gguf [--threads N] [--long]
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

KS = (2, 3, 4, 8, 16)
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'


def one_setting(model: str, repack: bool, flash: bool, threads: int, long: bool) -> dict:
    import llama_cpp
    import numpy as np

    from edgespec.runtime import backend as B

    orig_m, orig_c = llama_cpp.llama_model_default_params, llama_cpp.llama_context_default_params

    def mp():
        p = orig_m(); p.use_extra_bufts = repack; return p

    def cp():
        p = orig_c(); p.flash_attn_type = 1 if flash else 0; return p

    llama_cpp.llama_model_default_params, llama_cpp.llama_context_default_params = mp, cp
    be = B.LlamaBackend(B.ModelOptions(path=Path(model), n_threads=threads, n_ctx=2048,
                                       batch_consistent=False))
    llama_cpp.llama_model_default_params, llama_cpp.llama_context_default_params = orig_m, orig_c
    prompt = be.tokenize(PROMPT * (12 if long else 1))  # long: > 512 KV cells
    cont = be.tokenize(" return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint(fibonacci(10))",
                       add_special=False)
    cont = (cont * 4)[: max(KS)]
    be.decode(prompt, 0)
    # (each decode's rows are a view of llama.cpp's buffer, valid until the next decode: copy)
    single = np.concatenate([be.decode([t], 1).copy() for t in cont])
    worst = {}
    for k in KS:
        be.sync(prompt)
        worst[k] = float(np.abs(be.decode(cont[:k], k) - single[:k]).max())
    return {"n_prompt": len(prompt), "worst": worst}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one_setting(a.model, a.child[0] == "1", a.child[1] == "1", a.threads, a.long)))
        sys.exit(0)
    from edgespec.runtime.backend import system_info
    print("llama.cpp LLAMAFILE =", system_info().get("LLAMAFILE", "?"))
    for tiled, repack, flash in itertools.product(["1", "0"], [True, False], [True, False]):
        env = dict(os.environ, GGML_CPU_TILED_MM=tiled)
        cmd = [sys.executable, __file__, a.model, "--threads", str(a.threads),
               "--child", str(int(repack)), str(int(flash))] + (["--long"] if a.long else [])
        res = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
        print(f"tiled_mm={tiled} repack={int(repack)} flash_attn={int(flash)} prompt={res['n_prompt']:4d}  "
              + "  ".join(f"k={k}: {v:.4f}" for k, v in res["worst"].items()), flush=True)
