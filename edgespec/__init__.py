"""edgespec: exact speculative decoding of GGUF models on local hardware.

Public API::

    from edgespec import Engine, SamplingParams

    with Engine.load(pair="default") as engine:
        for chunk in engine.stream("Write a haiku about caches", max_tokens=64):
            print(chunk.text, end="", flush=True)
"""

from .engine import Chunk, Completion, Engine, EngineBusyError, TokenInfo
from .errors import (
    ConfigError,
    ContextOverflowError,
    DownloadError,
    EdgespecError,
    IncompatibleDraftError,
    ModelError,
)
from .rejection import Source
from .sampling import SamplingParams
from .stats import Stats

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
