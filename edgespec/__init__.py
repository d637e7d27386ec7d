"""edgespec: exact speculative decoding of GGUF models on local hardware.

Public API::

    from edgespec import Engine, SamplingParams

    with Engine.load(pair="default") as engine:
        for chunk in engine.stream("Write a haiku about caches", max_tokens=64):
            print(chunk.text, end="", flush=True)

The names below are imported on first use, so that ``import edgespec`` (and the ``edgespec``
command's start-up, which must be able to handle Ctrl-C) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _native

#: how llama.cpp's library was loaded ahead of NumPy (see edgespec/_native.py)
PRELOAD = _native.preload()

if TYPE_CHECKING:
    from .core.rejection import Source
    from .core.sampling import SamplingParams
    from .core.stats import Stats
    from .errors import (
        ConfigError,
        ContextOverflowError,
        DownloadError,
        EdgespecError,
        IncompatibleDraftError,
        ModelError,
    )
    from .runtime.engine import Chunk, Completion, Engine, EngineBusyError, TokenInfo
    from .runtime.options import LoadOptions

#: public name -> the submodule that defines it
_EXPORTS = {
    "Chunk": "runtime.engine",
    "Completion": "runtime.engine",
    "ConfigError": "errors",
    "ContextOverflowError": "errors",
    "DownloadError": "errors",
    "EdgespecError": "errors",
    "Engine": "runtime.engine",
    "EngineBusyError": "runtime.engine",
    "IncompatibleDraftError": "errors",
    "LoadOptions": "runtime.options",
    "ModelError": "errors",
    "SamplingParams": "core.sampling",
    "Source": "core.rejection",
    "Stats": "core.stats",
    "TokenInfo": "runtime.engine",
}

__all__ = [
    "Chunk",
    "Completion",
    "ConfigError",
    "ContextOverflowError",
    "DownloadError",
    "EdgespecError",
    "Engine",
    "EngineBusyError",
    "IncompatibleDraftError",
    "ModelError",
    "SamplingParams",
    "Source",
    "Stats",
    "TokenInfo",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its submodule on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
