"""The sampler's fused passes over a row of logits, compiled (:file:`_rows.c`, issue 10).

A 151,936-wide row and its weights (2 x 600 KB) overflow a 512 KiB L2 cache, so the sampler's
cost is the number of times it reads and writes them. NumPy does one operation per pass: the
weights ``exp((x - top) / T)`` take three (a subtraction, a product, the ``exp``) plus one for
their block sums, and the weight before a token in a flat top-p nucleus takes four. The
compiled module does each in one pass:

- ``scaled_exp(x, out, top, inv_t, blocks=None, precise=False) -> float``:
  ``out = exp((x - top) * inv_t)`` (the argument rounded in float32 exactly as NumPy's two
  operations round it; no product when ``inv_t`` is 1), their sum, and each block of 256's
  sum into ``blocks``; ``precise``: every weight summed as a float64 (for a total a top-p cut
  is placed against), else float32 lanes within a block;
- ``mass_before(x, w, y) -> float``: the float64 sum of ``w`` over the tokens before ``y`` in
  descending order of ``x``, ties to the lowest id;
- ``window(x, offset, keep, ids) -> (top, count)``: a draft row's max and a superset of its
  ``keep`` largest logits at ``max + offset`` or above, in one read;
- ``largest(x, keep, ids, t=0) -> (top, count, floor)``: a row's max and top-k's candidates
  (every logit from a hair below the ``keep``-th largest), in one read; with a temperature,
  cut in the same call to the ``keep`` largest and their near-ties (``_Maxima.top_ids``);
- ``at_least(x, floor, ids) -> int``: the ids of the logits at a floor (compare and
  ``nonzero`` in one read);
- ``head(x, cols, slices, top, t, floor, max_head, guess, ids, w)``: a row's head and the sums
  bounding its total, from its column maxima (``_head``);
- ``filtered(x, ids, top, t, top_k, top_p, min_p, mass, margin, floored, out_ids, out_probs)``:
  top-k, top-p and min-p over a few candidates, bit for bit NumPy's arithmetic (``_filtered``).

The last two replace some twenty NumPy calls each. Right after a decode has streamed the
model's weights through the caches, each NumPy call costs 5-15 µs (warm: 1-2), so on a CPU
the number of calls per row costs more than their arithmetic.

Measured on the 2-core development VM (AMD EPYC, AVX2, 151,936 float32 values): the weights
and their sum 105-110 µs (155 µs precise) against 133-183 µs for NumPy's passes with ggml's
``exp``, and the weight before a token 44 µs against 80-110 µs.

It is built when edgespec is installed (``pip install -e .``; optional: without a C compiler
the install goes on without it). :func:`rows` gives it, or ``None`` where it was not built or
``EDGESPEC_NUMPY_ROWS=1``; the sampler then does the same in NumPy (same distributions: the
tests check both paths against the dense reference).
"""

from __future__ import annotations

from types import ModuleType

from .._native import switched_on

#: set to 1 to leave the compiled passes unused (NumPy's, as before they existed)
NO_ROWS = "EDGESPEC_NUMPY_ROWS"

_module: ModuleType | None = None
_looked_up = False


def switched_off() -> bool:
    """Whether ``EDGESPEC_NUMPY_ROWS`` asks for NumPy's passes."""
    return switched_on(NO_ROWS)


def rows() -> ModuleType | None:
    """The compiled module (``edgespec.core._rows``), or ``None`` (not built, or switched
    off). Looked up once."""
    global _module, _looked_up
    if not _looked_up:
        _looked_up = True
        if not switched_off():
            try:
                from . import _rows
            except ImportError:
                _rows = None
            _module = _rows
    return _module


def describe() -> str:
    """Which passes the sampler uses, in words (for benchmark headers)."""
    return "compiled row passes" if rows() is not None else "NumPy row passes"
