#!/usr/bin/env python3
"""Run llama_cpp model loads under different pre-import conditions, each in a fresh subprocess.
usage: order_matrix.py MODEL.gguf [variant ...]   (default: all variants); env N_GPU_LAYERS (default -1), REPEAT (default 2)
Prints one line per run: variant, return code (-11 = SIGSEGV), seconds, last stderr line."""
import os, subprocess, sys, time, glob, sysconfig

SITE = sysconfig.get_paths()["purelib"]
NPLIBS = os.path.join(SITE, "numpy.libs")
def npl(prefix):
    g = sorted(glob.glob(os.path.join(NPLIBS, prefix + "*")))
    return g[0] if g else None
MAU = (glob.glob(os.path.join(SITE, "numpy/_core/_multiarray_umath*.so")) or [None])[0]

PRE = {
    # name: python source run before the load (llama_cpp imported after unless the snippet does it)
    "llama_first":      "import llama_cpp, numpy",
    "numpy_first":      "import numpy, llama_cpp",
    "numpy_first_vocab_only": "import numpy, llama_cpp; VOCAB_ONLY=True",
    "numpy_first_ngl0": "import numpy, llama_cpp; NGL=0",
    # H1: libstdc++ relocated in numpy's local scope -> binds its own typeinfo/__throw_bad_array_new_length into
    # _multiarray_umath. Make libstdc++ global before numpy: if this no longer crashes, H1 (or libstdc++ init order) it is.
    "stdcxx_global_then_numpy": "import ctypes; ctypes.CDLL('libstdc++.so.6', mode=ctypes.RTLD_GLOBAL); import numpy, llama_cpp",
    "gomp_global_then_numpy": "import ctypes; ctypes.CDLL('libgomp.so.1', mode=ctypes.RTLD_GLOBAL); import numpy, llama_cpp",
    # bisection without numpy's Python-level init: load only numpy's native libraries (RTLD_LOCAL, constructors run)
    "only_quadmath":    f"import ctypes; ctypes.CDLL({npl('libquadmath')!r}); import llama_cpp",
    "only_gfortran":    f"import ctypes; ctypes.CDLL({npl('libgfortran')!r}); import llama_cpp",
    "only_openblas":    f"import ctypes; ctypes.CDLL({npl('libscipy_openblas')!r}); import llama_cpp",
    "only_mau_ctypes":  f"import ctypes; ctypes.CDLL({MAU!r}); import llama_cpp",
    # heap-layout sensitivity (H2): llama first, but with ~numpy-sized allocation churn first / malloc perturbation
    "llama_first_heapshift": "junk=[bytearray(4096*(i%64+1)) for i in range(20000)]; del junk[::2]; import llama_cpp, numpy",
    "numpy_first_perturb":  "import os; import numpy, llama_cpp",   # run with MALLOC_PERTURB_ (see ENV below)
    "llama_first_perturb":  "import llama_cpp, numpy",
}
ENV = {"numpy_first_perturb": {"MALLOC_PERTURB_": "165"}, "llama_first_perturb": {"MALLOC_PERTURB_": "165"}}

BODY = r'''
import faulthandler, sys, os; faulthandler.enable()
NGL = int(os.environ.get("N_GPU_LAYERS", "-1")); VOCAB_ONLY = False
{pre}
import llama_cpp
m = llama_cpp.Llama(sys.argv[1], n_gpu_layers=NGL, n_ctx=256, verbose=True, vocab_only=VOCAB_ONLY)
print("LOADED", m.tokenize(b"hello world"), flush=True)
'''

def main():
    model = sys.argv[1]
    names = sys.argv[2:] or list(PRE)
    rep = int(os.environ.get("REPEAT", "2"))
    outdir = os.environ.get("OUTDIR", "/tmp/order_matrix"); os.makedirs(outdir, exist_ok=True)
    for name in names:
        for r in range(rep):
            env = dict(os.environ, **ENV.get(name, {}))
            t = time.time()
            p = subprocess.run([sys.executable, "-c", BODY.format(pre=PRE[name]), model], env=env,
                               capture_output=True, text=True)
            with open(os.path.join(outdir, f"{name}.{r}.log"), "w") as f:
                f.write(p.stdout + "\n----stderr----\n" + p.stderr)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            last = lines[-1][:120] if lines else ""
            ok = "LOADED" in p.stdout
            print(f"{name:28s} run{r} rc={p.returncode:4d} {'OK ' if ok else 'BAD'} {time.time()-t:6.1f}s | {last}", flush=True)

if __name__ == "__main__":
    main()
