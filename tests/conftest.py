"""Shared fixtures. Real-model fixtures load GGUF files through the catalog (fetching them if the
cache lacks them: `make test` pulls them first) and are session-scoped: loading costs seconds."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_engine():
    """The default pair (Qwen2.5-Coder 1.5B target, 0.5B draft), batch-consistent kernels."""
    from edgespec.runtime.engine import Engine

    with Engine.load(pair="default", drafter="hybrid", n_ctx=4096, progress=False) as engine:
        yield engine


@pytest.fixture(scope="session")
def tiny_engine():
    """SmolLM2-135M drafting for itself: draft and target logits are bit-identical."""
    from edgespec.runtime.engine import Engine

    with Engine.load(pair="tiny", drafter="model", n_ctx=2048, progress=False) as engine:
        yield engine
