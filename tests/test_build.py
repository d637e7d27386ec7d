"""The llama.cpp build edgespec runs on: no kernel that runs for 2+ rows only.

llamafile's sgemm and Intel AMX each take over from a single-token kernel once a call has two
rows or more, so a token's logits would depend on how many tokens shared its call and greedy
speculation would stop matching plain decoding (README, "Exactness"). ``scripts/setup.sh``
builds without both; these checks read the installed build's own feature list.
"""

from __future__ import annotations

from click.testing import CliRunner

from edgespec.cli.main import cli
from edgespec.runtime import backend
from edgespec.runtime.backend import consistent_build, inconsistent_features


def test_the_installed_build_has_no_batch_shaped_kernels():
    # On a CPU with AMX (this project's VMs since 2026-11-28) a stock build compiles AMX in; its
    # tile loads also died there of SIGILL in the first multi-row decode.
    assert inconsistent_features() == []
    assert consistent_build()


def test_each_batch_shaped_feature_is_named():
    assert inconsistent_features({"AVX512": "1", "LLAMAFILE": "0"}) == []
    assert inconsistent_features({"AMX_INT8": "1"}) == ["AMX_INT8"]
    assert inconsistent_features({"LLAMAFILE": "1", "AMX_INT8": "1"}) == ["LLAMAFILE", "AMX_INT8"]


def test_info_names_what_breaks_batch_consistency(monkeypatch):
    res = CliRunner().invoke(cli, ["info"])
    assert res.exit_code == 0, res.output
    assert "batch-consistent: yes" in res.output
    monkeypatch.setattr(backend, "system_info", lambda: {"AVX512": "1", "AMX_INT8": "1"})
    res = CliRunner().invoke(cli, ["info"])
    assert res.exit_code == 0, res.output
    assert "batch-consistent: no: this llama.cpp has AMX_INT8 (2+ rows only)" in res.output
