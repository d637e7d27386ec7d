"""Compare edgespec.runtime.mtp.MtpHead's greedy drafts with llama.cpp's own ``draft-mtp``, and
time an MTP draft step against a target decode (not run by CI; scripts/mtp_reference.sh builds
the reference and calls this).

Reference: ``llama-speculative-simple --spec-type draft-mtp --temp 0`` at debug verbosity logs,
per round, each draft step's top candidates (``draft candidate 0, pos i: <id>``: the drafted
token, a round always drafts ``--spec-draft-n-max`` steps before truncating to what fits) and
``accepted n/k draft tokens, the last target token is: (<id>)``. The replay here plays the same
rounds with MtpHead and a plain target context (llama-cpp-python's own libllama): the prompt
but its last token decoded at once, then per round ``draft(id_last, K)``, the target's greedy
verification of ``[id_last] + draft[:fits]``, and ``catch_up`` of what it accepted (``--feed
all``: of the whole verified batch, then a rollback, as the reference does). On the random
weights no draft is ever accepted; ``--echo`` patches a copy of the model so that some are
(:func:`echo_model`), which exercises catch-ups of several tokens and partial acceptance.

    scripts/mtp_reference.sh [--model M.gguf] [--draft-max 3] [--n-predict 48] [--feed all]
    scripts/mtp_reference.sh --echo 0.45,1,1 --draft-max 4 --n-predict 64   (drafts accepted)
    .venv/bin/python scripts/mtp_reference.py --cost [--model M.gguf]   (no binary needed)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp  # noqa: E402

from edgespec.runtime.mtp import MtpHead, has_mtp, load_with_mtp  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"


class Target:
    """A plain target context: decodes tokens at given positions, rows of logits for all."""

    def __init__(self, model, *, n_ctx: int, n_batch: int, n_threads: int, n_rs_seq: int):
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, n_batch, min(n_batch, 512)
        p.n_threads = p.n_threads_batch = n_threads
        p.n_seq_max = 1
        p.n_rs_seq = n_rs_seq
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:
            raise SystemExit("cannot create the target context")
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    def decode(self, tokens, pos0: int, logits: bool = True) -> np.ndarray | None:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = logits
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise SystemExit(f"target decode failed: {rc}")
        if not logits:
            return None
        ptr = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(len(tokens), self.n_vocab))

    def rm(self, pos: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1):
            raise SystemExit(f"the target cannot drop its cache from {pos}")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


def tokenize(model, text: str) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    raw = text.encode()
    buf = (llama_cpp.llama_token * (len(raw) + 16))()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, True)
    return list(buf[:n])


def default_model(name: str = "qwen35-tiny") -> Path:
    from edgespec.models import synthetic

    return synthetic.cached(name, mtp=True)


def echo_model(src: Path, target_scale: float, mtp_scale: float = 0.3,
               h_scale: float = 0.3) -> Path:
    """A copy of the (F32, tiny) synthetic model patched so that drafts are sometimes accepted:
    random weights never agree with the target, so a comparison on them only sees rounds that
    reject everything. Each trunk layer's output projection is scaled by ``target_scale``, so
    the residual stream stays close to the token's embedding and the (tied) head mostly
    repeats the current token, now and then not; the MTP block reads mostly the token
    (``eh_proj`` = [I, h_scale * its random h part]) and its own layers' output projections
    are scaled by ``mtp_scale``: it drafts mostly repeats, now and then not, its attention
    (over the cache the target's rows built) and the rows it chains still counting.
    Patched in place on a copy (same tensors, same sizes): no GGUF writer."""
    import shutil

    import gguf

    dst = src.with_name(f"{src.stem}-echo{target_scale:g}-{mtp_scale:g}-{h_scale:g}.gguf")
    if dst.exists():
        return dst
    tmp = dst.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    reader = gguf.GGUFReader(tmp, "r+")
    n_layer = int(reader.fields["qwen35.block_count"].parts[-1][0]) - 1
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise SystemExit(f"{src}: {t.name} is {t.tensor_type.name}: use an F32 model")
        il = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        out_proj = t.name.endswith((".ssm_out.weight", ".attn_output.weight", ".ffn_down.weight"))
        if out_proj and 0 <= il < n_layer:
            t.data[...] *= target_scale
        elif out_proj and il == n_layer:
            t.data[...] *= mtp_scale
        elif t.name.endswith(".nextn.eh_proj.weight"):
            e = t.data.shape[0]
            t.data[:, e:] *= h_scale
            t.data[:, :e] = np.eye(e, dtype=np.float32)
    reader.data.flush()
    del reader
    tmp.rename(dst)
    return dst


# -- the reference run


_CAND = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+)")
_ACC = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")


def run_reference(binary: str, model: Path, prompt: str, k: int, n_predict: int, n_ctx: int,
                  threads: int, extra: list[str]) -> tuple[list[dict], str]:
    """[{'draft': full K-step draft, 'accepted': n, 'k': drafted, 'last': id}] per round."""
    cmd = [binary, "-m", str(model), "-p", prompt, "--spec-type", "draft-mtp",
           "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
           "-n", str(n_predict), "--temp", "0", "-t", str(threads), "-c", str(n_ctx),
           "-lv", "5", "--seed", "1", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = out.stdout + out.stderr
    if out.returncode != 0:
        raise SystemExit(f"reference failed ({out.returncode}):\n{log[-4000:]}")
    rounds: list[dict] = []
    draft: list[int] = []
    for line in log.splitlines():
        if m := _CAND.search(line):
            if int(m.group(1)) == 0:
                draft = []
            draft.append(int(m.group(2)))
        elif m := _ACC.search(line):
            rounds.append({"draft": draft, "accepted": int(m.group(1)), "k": int(m.group(2)),
                           "last": int(m.group(3))})
            draft = []
    return rounds, " ".join(cmd)


# -- the replay with MtpHead


def replay(model_path: Path, prompt: str, k: int, n_predict: int, n_ctx: int, threads: int,
           feed: str = "accepted") -> list[dict]:
    """speculative-simple's loop with MtpHead drafting (see the module docstring)."""
    model = load_with_mtp(model_path)
    ptr = model.model
    target = Target(ptr, n_ctx=n_ctx, n_batch=2048, n_threads=threads, n_rs_seq=k)
    head = MtpHead(model, target.ctx)
    vocab = llama_cpp.llama_model_get_vocab(ptr)
    rounds: list[dict] = []
    try:
        inp = tokenize(ptr, prompt)
        target.decode(inp[:-1], 0, logits=False)
        head.catch_up(inp[:-1])
        id_last, n_past, n_made = inp[-1], len(inp) - 1, 0
        while True:
            n_max = max(0, min(n_ctx - n_past - 2, n_predict - n_made - 1))
            full = head.draft(id_last, k).tokens
            draft = full[:n_max] if n_max > 0 else full
            rows = target.decode([id_last] + draft, n_past)
            ids: list[int] = []
            for i in range(len(draft) + 1):  # greedy: keep drafts while the target agrees
                t = int(np.argmax(rows[i]))
                ids.append(t)
                if i == len(draft) or t != draft[i]:
                    break
            n_acc = len(ids) - 1
            if feed == "all":  # the whole verified batch, then the rejected drafts cut
                head.catch_up([id_last] + draft)
                head.rollback(n_past + 1 + n_acc)
            else:
                head.catch_up([id_last] + draft[:n_acc])
            rounds.append({"draft": full, "accepted": n_acc, "k": len(draft), "last": ids[-1]})
            n_past += 1 + n_acc
            n_made += len(ids)
            target.rm(n_past)
            id_last = ids[-1]
            if llama_cpp.llama_vocab_is_eog(vocab, id_last) or n_made > n_predict:
                break
    finally:
        head.close()
        target.close()
        model.close()
    return rounds


def compare(ref: list[dict], mine: list[dict]) -> bool:
    same = True
    print(f"{'round':>5} {'reference draft':>24} {'acc':>4} {'MtpHead draft':>24} {'acc':>4}")
    for i in range(max(len(ref), len(mine))):
        a = ref[i] if i < len(ref) else None
        b = mine[i] if i < len(mine) else None
        ok = a is not None and b is not None and a["draft"] == b["draft"] and \
            a["accepted"] == b["accepted"] and a["last"] == b["last"]
        same &= ok
        fa = f"{a['draft']} " if a else "-"
        fb = f"{b['draft']} " if b else "-"
        print(f"{i:>5} {fa:>24} {a['accepted'] if a else '-':>4} {fb:>24} "
              f"{b['accepted'] if b else '-':>4} {'' if ok else '  <-- differs'}")
    n_acc = sum(r["accepted"] for r in mine)
    n_dr = sum(r["k"] for r in mine)
    print(f"rounds: reference {len(ref)}, MtpHead {len(mine)}; MtpHead accepted {n_acc}/{n_dr}")
    return same


# -- the cost of a step


def cost(model_path: Path, threads: int, ks=(1, 2, 3, 4), reps: int = 20, n_prompt: int = 64,
         best: bool = True):
    """Milliseconds (the best of ``reps``, or their median): k MTP draft steps, the catch-up of
    k+1 tokens, and the target's verification decode of k+1 tokens (and of 1), after an
    n_prompt-token prefill. (On a shared machine, ggml's spinning threads make a loaded
    core's timings far worse than its share: run it alone.)"""
    model = load_with_mtp(model_path)
    ptr = model.model
    target = Target(ptr, n_ctx=1024, n_batch=512, n_threads=threads, n_rs_seq=8)
    head = MtpHead(model, target.ctx)
    rng = np.random.default_rng(0)
    n_vocab = target.n_vocab
    try:
        text = tokenize(ptr, PROMPT * 8)[:n_prompt]
        text += list(rng.integers(100, min(n_vocab, 20000), n_prompt - len(text)))
        target.decode(text[:-1], 0, logits=False)
        head.catch_up(text[:-1])
        n_past, last = len(text) - 1, text[-1]

        def timed(fn):
            fn()  # warm
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return (min(ts) if best else statistics.median(ts)) * 1e3

        def verify(n):
            target.decode([last] * n, n_past)
            target.rm(n_past)

        def catch(n):
            head.catch_up([last] * n, np.zeros((n, head.n_embd), np.float32))
            head.rollback(n_past)

        rows = []
        t1 = timed(lambda: verify(1))
        for k in ks:
            t_draft = timed(lambda: head.draft(last, k))
            t_ver = timed(lambda: verify(k + 1))
            t_cu = timed(lambda: catch(k + 1))
            rows.append((k, t_draft, t_draft / k, t_cu, t_ver, t1))
    finally:
        head.close()
        target.close()
        model.close()
    print(f"{model_path.name}: {threads} threads, context {n_prompt} tokens, "
          f"{'best' if best else 'median'} of {reps}")
    print(f"{'k':>2} {'MTP draft k':>12} {'per step':>9} {'MTP catch-up k+1':>17} "
          f"{'target k+1':>11} {'target 1':>9} {'step/target1':>13}")
    for k, td, ts, tc, tv, t1 in rows:
        print(f"{k:>2} {td:>10.2f}ms {ts:>7.2f}ms {tc:>15.2f}ms {tv:>9.2f}ms {t1:>7.2f}ms "
              f"{ts / t1:>12.2f}x")
    return rows


@llama_cpp.llama_log_callback
def _quiet(level, text, user_data):  # llama.cpp's log: only errors
    if level == 4:  # GGML_LOG_LEVEL_ERROR
        sys.stderr.write(text.decode(errors="replace"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", help="llama-speculative-simple (scripts/mtp_reference.sh)")
    ap.add_argument("--model", type=Path, help="a GGUF with MTP layers (default: synthetic)")
    ap.add_argument("--synthetic", default="qwen35-tiny", help="synthetic model name")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--draft-max", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--echo", metavar="T[,M[,H]]",
                    help="patch the model so that drafts are sometimes accepted (echo_model's "
                    "target_scale, mtp_scale, h_scale)")
    ap.add_argument("--feed", choices=("accepted", "all"), default="accepted")
    ap.add_argument("--cost", action="store_true", help="time MTP steps against target decodes")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--median", action="store_true", help="--cost: the median, not the best")
    ap.add_argument("--ref-arg", action="append", default=[], help="an extra reference argument")
    ap.add_argument("--ref-libs", help="LD_LIBRARY_PATH for the reference (e.g. the venv's "
                    "llama_cpp/lib: the same libllama as the replay's)")
    args = ap.parse_args()
    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p())
    model = args.model or default_model(args.synthetic)
    if args.echo is not None:
        model = echo_model(model, *(float(x) for x in args.echo.split(",")))
    if not has_mtp(model):
        raise SystemExit(f"{model} has no MTP layers")
    if args.cost:
        cost(model, args.threads, reps=args.reps, best=not args.median)
        return 0
    if not args.binary:
        raise SystemExit("--binary (or --cost)")
    if args.ref_libs:
        os.environ["LD_LIBRARY_PATH"] = args.ref_libs
    ref, cmd = run_reference(args.binary, model, args.prompt, args.draft_max, args.n_predict,
                             args.ctx, args.threads, args.ref_arg)
    print("reference:", cmd)
    mine = replay(model, args.prompt, args.draft_max, args.n_predict, args.ctx, args.threads,
                  args.feed)
    same = compare(ref, mine)
    print("MATCH" if same else "MISMATCH")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
