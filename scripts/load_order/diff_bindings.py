#!/usr/bin/env python3
"""Diff (requesting object, symbol) -> providing object maps between two LD_DEBUG=bindings logs.
usage: diff_bindings.py A.log B.log [regex-of-requesting-objects]"""
import re, sys, os, collections
PAT = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: (\w+ )?symbol `([^']+)'(?: \[([^\]]+)\])?")
def load(p):
    m = collections.defaultdict(set); order = []
    for line in open(p, errors="replace"):
        r = PAT.search(line)
        if r:
            src, dst, kind, sym, ver = r.groups()
            m[(os.path.basename(src), sym)].add(os.path.basename(dst))
        elif "calling init:" in line:
            order.append(line.split("calling init:")[1].strip())
    return m, order
a, ao = load(sys.argv[1]); b, bo = load(sys.argv[2])
flt = re.compile(sys.argv[3] if len(sys.argv) > 3 else r"libllama|libggml|libstdc\+\+|libgomp|libgcc_s")
def demangle(names):
    import subprocess
    try: return subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    except Exception: return names
keys = sorted(k for k in set(a) | set(b) if flt.search(k[0]))
import os as _os
BOTH = _os.environ.get("BOTH_ONLY") == "1"
diff = [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and (not BOTH or (a.get(k) and b.get(k)))]
dm = demangle([k[1] for k, _, _ in diff])
print(f"# requesting objects matching {flt.pattern}: {len(keys)} (obj,symbol) pairs; differing: {len(diff)}")
for (k, x, y), d in zip(diff, dm):
    print(f"{k[0]:40s} {d[:100]:100s}  A={sorted(x) if x else '-'}  B={sorted(y) if y else '-'}")
# any binding from llama/ggml side into numpy objects, or vice versa, in either log
for name, m in (("A", a), ("B", b)):
    for (src, sym), dsts in sorted(m.items()):
        for dst in dsts:
            s_np = "numpy" in src or "openblas" in src or "gfortran" in src or "quadmath" in src or "_umath" in src
            d_np = "numpy" in dst or "openblas" in dst or "gfortran" in dst or "quadmath" in dst or "_umath" in dst or "multiarray" in dst
            s_ll = re.search(r"libllama|libggml|libgomp|libmtmd", src); d_ll = re.search(r"libllama|libggml|libgomp|libmtmd", dst)
            if (s_ll and d_np) or (s_np and d_ll):
                print(f"CROSS {name}: {src} -> {dst}: {sym}")
print("# init order A:"); [print("  ", x) for x in ao]
print("# init order B:"); [print("  ", x) for x in bo]
