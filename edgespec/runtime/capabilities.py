"""What a backend offers beyond ``sync`` and ``decode``: one record, read in one place.

The loop, the drafters and the engine take any backend with the ``Target`` / ``DraftModel``
surface (:mod:`edgespec.runtime.loop`, :mod:`edgespec.runtime.sources`). What more a backend
can do, it declares as attributes (:class:`edgespec.runtime.backend.LlamaBackend` does, the
test fakes and the virtual GPU of ``scripts/gpu/replay.py`` too); :func:`capabilities` reads
them into a :class:`Capabilities`, and the callers read that.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond ``sync`` / ``decode``."""

    #: ``decode_argmax(tokens, n_logits)``: each row's arg-max id only (a greedy round then
    #: never brings a row of logits to the host)
    argmax: bool = False
    #: ``start_decode`` / ``finish_decode``, and a decode that returns before the device is
    #: done (a local GPU, RPC workers): the loop launches a round before it yields the last
    asynchronous: bool = False
    #: the device keeps one captured graph per call width (llama.cpp's CUDA backend): a call of
    #: a new width costs more, and the second captures (``edgespec.core.costs.CallCosts``)
    graph_shapes: bool = False
    #: ``decode_window(tokens, n_logits, w)``: each row's w largest logits, taken on the device
    #: (may turn off while running, where llama.cpp's sampler cannot be attached)
    device_window: bool = False
    #: every logit-reading call is padded to this many tokens (0: calls as wide as they feed)
    fixed_width: int = 0
    #: ``decode(tokens, n_logits, unread)``: rows the caller will not read get no output
    #: projection (a position a constraint leaves one token)
    unread_rows: bool = False
    #: the longest draft a round may score (None: any): a model with recurrent layers takes
    #: back only what its last call's snapshots hold (:mod:`edgespec.runtime.recurrent`)
    draft_reach: int | None = None


def capabilities(model) -> Capabilities:
    """``model``'s :class:`Capabilities` as it declares them now (none for ``None``)."""
    if model is None:
        return Capabilities()
    return Capabilities(
        argmax=callable(getattr(model, "decode_argmax", None)),
        asynchronous=(bool(getattr(model, "asynchronous", False))
                      and callable(getattr(model, "start_decode", None))),
        graph_shapes=bool(getattr(model, "graph_shapes", False)),
        device_window=bool(getattr(model, "device_window", False)),
        fixed_width=int(getattr(model, "fixed_width", 0) or 0),
        unread_rows=bool(getattr(model, "unread_rows", False)),
        draft_reach=getattr(model, "draft_reach", None),
    )
