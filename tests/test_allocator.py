"""The allocator setting: freed row-sized buffers stay in the process (no page faults)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .fakes import FakeLM, Table

# Three 608 KiB arrays (rows of a 152k vocabulary) made and freed together, 50 times: glibc's
# defaults give their pages back each time (~265 minor faults a cycle here); kept, the cycles
# after the first fault nothing in.
_SCRIPT = """
import resource, sys
import numpy as np
def faults():
    for _ in range(3):
        a = [np.ones(152_064, np.float32) for _ in range(3)]
        del a
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        a = [np.ones(152_064, np.float32) for _ in range(3)]
        del a
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 50
before = faults()
from edgespec.runtime.allocator import keep_freed_memory
ok = keep_freed_memory()
print(ok, before, faults())
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")


def _run(env_extra: dict[str, str] | None = None) -> tuple[bool, float, float]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    return out[0] == "True", float(out[1]), float(out[2])


@glibc
def test_freed_rows_are_kept_after_the_setting():
    ok, before, after = _run()
    assert ok
    assert before > 100  # (the default: the pages go back and are faulted in again)
    assert after < 5


@glibc
def test_the_environment_wins():
    # a user who tunes glibc by environment keeps their setting: nothing is changed
    ok, _, _ = _run({"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert not ok


def test_the_engine_sets_it(monkeypatch):
    from edgespec.runtime import engine

    calls = []
    monkeypatch.setattr(engine, "keep_freed_memory", lambda: calls.append(1) or True)
    engine.Engine(FakeLM(Table(16)), drafter="lookup")
    assert calls == [1]
