"""``edgespec bench --memory``: peak memory with a long context and a long prompt.

Each side runs in a fresh subprocess (``python -m edgespec.bench.memory``), so one side's
allocations cannot hide in another's, and its peak resident set size (``ru_maxrss``, read by the
parent with ``os.wait4`` for that child alone) is the whole story: model files mapped, KV
caches, logits buffers, Python. The prompt is raw text (no chat template) of about
``prompt_tokens`` tokens, built from the built-in edit prompts' code, and each side generates
``max_tokens`` greedy tokens.

The bound a side is held to: the GGUF files it loads + their KV caches at this context
(computed from the GGUF metadata: layers x KV heads x (key + value length) x n_ctx x 2 bytes,
f16) + 300 MB. MB here is 10^6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ..errors import ConfigError, ModelError

SIDES = ("edgespec", "edgespec-none", "llama-cpp-python", "llama-cpp-python-plain")
DEFAULT_SIDES = ("edgespec", "llama-cpp-python")
DEFAULT_N_CTX = 16384
DEFAULT_PROMPT_TOKENS = 10_000
DEFAULT_MAX_TOKENS = 32
HEADROOM_MB = 300.0
_RESULT = "EDGESPEC_MEMORY_RESULT "
_MB = 1e6


# ---- GGUF metadata and KV cache size ---------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | Path) -> dict:
    """The key/value metadata of a GGUF file (arrays of strings are skipped, not read)."""
    path = Path(path)
    try:
        fh = open(path, "rb")
    except OSError as err:
        raise ModelError(f"cannot read {path}: {err.strerror or err}") from None
    with fh:
        def read(fmt):
            size = struct.calcsize(fmt)
            data = fh.read(size)
            if len(data) != size:
                raise ModelError(f"truncated GGUF header: {path}")
            return struct.unpack(fmt, data)[0]

        def string():
            n = read("<Q")
            return fh.read(n).decode("utf-8", "replace")

        def value(vtype):
            if vtype in _SCALARS:
                return read(_SCALARS[vtype])
            if vtype == _STRING:
                return string()
            if vtype == _ARRAY:
                itype, n = read("<I"), read("<Q")
                if itype == _STRING:  # e.g. the tokenizer's vocabulary: skip
                    for _ in range(n):
                        fh.seek(read("<Q"), os.SEEK_CUR)
                    return None
                if itype in _SCALARS:
                    fmt = _SCALARS[itype]
                    return list(struct.unpack(f"<{n}{fmt[1]}", fh.read(n * struct.calcsize(fmt))))
                return [value(itype) for _ in range(n)]
            raise ModelError(f"unknown GGUF value type {vtype} in {path}")

        if fh.read(4) != b"GGUF":
            raise ModelError(f"not a GGUF file: {path}")
        version = read("<I")
        if version < 2:
            raise ModelError(f"GGUF version {version} is not supported: {path}")
        read("<Q")  # tensor count
        meta = {}
        for _ in range(read("<Q")):
            key = string()
            meta[key] = value(read("<I"))
        return meta


def kv_cache_bytes(meta: dict, n_ctx: int, bytes_per_value: int = 2) -> int:
    """llama.cpp's KV cache size for ``n_ctx`` cells: per layer, KV heads x (key + value
    length) values per cell, f16 by default."""
    arch = meta.get("general.architecture")
    try:
        n_layer = int(meta[f"{arch}.block_count"])
        n_head = meta[f"{arch}.attention.head_count"]
        n_embd = int(meta[f"{arch}.embedding_length"])
    except KeyError as err:
        raise ModelError(f"GGUF metadata lacks {err.args[0]}") from None
    n_head_kv = meta.get(f"{arch}.attention.head_count_kv", n_head)

    def per_layer(x):
        return list(x) if isinstance(x, list) else [int(x)] * n_layer

    heads, kv_heads = per_layer(n_head), per_layer(n_head_kv)
    head_dim = n_embd // max(heads[0], 1)
    k_len = int(meta.get(f"{arch}.attention.key_length", head_dim))
    v_len = int(meta.get(f"{arch}.attention.value_length", head_dim))
    return n_ctx * sum(h * (k_len + v_len) for h in kv_heads) * bytes_per_value


def model_budget(paths: Sequence[Path], n_ctx: int) -> dict:
    """Files, KV caches and the bound (files + KV + headroom) for the models a side loads, MB."""
    files = sum(Path(p).stat().st_size for p in paths) / _MB
    kv = sum(kv_cache_bytes(read_gguf_metadata(p), n_ctx) for p in paths) / _MB
    return {"files_mb": files, "kv_mb": kv, "headroom_mb": HEADROOM_MB,
            "bound_mb": files + kv + HEADROOM_MB}


# ---- the parent: one subprocess per side ------------------------------------------------------


def run_side(side: str, *, target: Path, draft: Path | None, n_ctx: int, prompt_tokens: int,
             max_tokens: int, threads: int, batch_consistent: bool = True,
             timeout: float | None = None) -> dict:
    """Run one side in a fresh Python process; return its report plus its peak RSS."""
    cmd = [sys.executable, "-m", "edgespec.bench.memory", "--side", side, "--target", str(target),
           "--n-ctx", str(n_ctx), "--prompt-tokens", str(prompt_tokens),
           "--max-tokens", str(max_tokens), "--threads", str(threads)]
    if draft is not None:
        cmd += ["--draft", str(draft)]
    if not batch_consistent:
        cmd.append("--fast-kernels")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, f=f: streams.__setitem__(n, f.read()), daemon=True)
               for n, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, even if it was killed
    except BaseException:  # Ctrl-C: do not leave the child running
        proc.kill()
        os.waitpid(proc.pid, 0)
        proc.returncode = -signal.SIGKILL
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    out, err = streams.get("out", ""), streams.get("err", "")
    report: dict = {"side": side, "seconds": time.perf_counter() - start,
                    "returncode": proc.returncode}
    for line in out.splitlines():
        if line.startswith(_RESULT):
            report.update(json.loads(line[len(_RESULT):]))
    report["peak_rss_mb"] = usage.ru_maxrss * 1024 / _MB
    if proc.returncode != 0 or "generated" not in report:
        if proc.returncode is not None and proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            why = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit code {proc.returncode}"
        report["error"] = why
    return report


def run_memory_scenario(*, target: Path, draft: Path | None, sides: Sequence[str] = DEFAULT_SIDES,
                        n_ctx: int = DEFAULT_N_CTX, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
                        max_tokens: int = DEFAULT_MAX_TOKENS, threads: int = 1,
                        batch_consistent: bool = True,
                        on_side: Callable[[str], None] | None = None) -> dict:
    """Every side in turn, each with its bound and a pass/fail verdict."""
    if prompt_tokens + max_tokens > n_ctx:
        raise ConfigError(f"a {prompt_tokens}-token prompt and {max_tokens} tokens do not fit "
                          f"in a context of {n_ctx}")
    results = []
    for side in sides:
        if on_side:
            on_side(side)
        report = run_side(side, target=target, draft=draft, n_ctx=n_ctx,
                          prompt_tokens=prompt_tokens, max_tokens=max_tokens, threads=threads,
                          batch_consistent=batch_consistent)
        loaded = [target] + ([draft] if report.get("draft_loaded") and draft is not None else [])
        report.update(model_budget(loaded, n_ctx))
        peak = report.get("peak_rss_mb")
        report["within_bound"] = peak is not None and peak <= report["bound_mb"]
        results.append(report)
    return {"n_ctx": n_ctx, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
            "headroom_mb": HEADROOM_MB, "sides": results}


# ---- the child --------------------------------------------------------------------------------


def _vm_hwm_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / _MB
    except OSError:
        pass
    return None


def _child(args: argparse.Namespace) -> dict:
    from .prompts import long_prompt

    t0 = time.perf_counter()
    if args.side.startswith("edgespec"):
        from ..runtime.backend import set_verbose
        from ..runtime.engine import Engine

        set_verbose(False)
        if args.side == "edgespec-none" or args.draft is None:
            drafter = "none" if args.side == "edgespec-none" else "lookup"
        else:
            drafter = "auto"
        engine = Engine.load(args.target, args.draft if drafter != "none" else None,
                             drafter=drafter, n_ctx=args.n_ctx, n_threads=args.threads,
                             batch_consistent=not args.fast_kernels, download=False, progress=False)
        load = time.perf_counter() - t0

        def count(text):
            return len(engine.target.tokenize(text, add_special=False, parse_special=False))

        text = long_prompt(count, args.prompt_tokens)
        out = engine.complete(text, chat=False, max_tokens=args.max_tokens)
        result = {"drafter": drafter, "draft_loaded": engine.draft is not None,
                  "prompt_tokens": out.stats.prompt_tokens, "generated": out.stats.generated,
                  "prefill_seconds": out.stats.time_prefill,
                  "tokens_per_second": out.stats.tokens_per_second}
    else:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from .reference import N_BATCH, NUM_PRED_TOKENS

        draft = (LlamaPromptLookupDecoding(num_pred_tokens=NUM_PRED_TOKENS)
                 if args.side == "llama-cpp-python" else None)
        llm = llama_cpp.Llama(model_path=args.target, n_ctx=args.n_ctx, n_threads=args.threads,
                              n_threads_batch=args.threads, n_batch=N_BATCH, draft_model=draft,
                              logits_all=draft is not None, verbose=False)
        load = time.perf_counter() - t0

        def count(text):
            return len(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

        text = long_prompt(count, args.prompt_tokens)
        t1 = time.perf_counter()
        out = llm.create_completion(text, max_tokens=args.max_tokens, temperature=0.0, top_k=0,
                                    top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        result = {"drafter": "prompt lookup" if draft else "none", "draft_loaded": False,
                  "logits_all": draft is not None,
                  "prompt_tokens": out["usage"]["prompt_tokens"],
                  "generated": out["usage"]["completion_tokens"],
                  "generate_seconds": time.perf_counter() - t1}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _MB
    result.update(load_seconds=load, child_peak_rss_mb=rss, vm_hwm_mb=_vm_hwm_mb())
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.bench.memory",
                                 description="One side of `edgespec bench --memory` (internal).")
    ap.add_argument("--side", choices=SIDES, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--n-ctx", type=int, default=DEFAULT_N_CTX)
    ap.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fast-kernels", action="store_true")
    args = ap.parse_args(argv)
    result = _child(args)
    sys.stdout.write(_RESULT + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
