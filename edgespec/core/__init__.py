"""The math of exact speculative decoding: pure NumPy and arithmetic, no llama.cpp.

``sampling`` (processed distributions), ``rejection`` (the exact test), ``lookup`` (n-gram
drafting), ``costs`` and ``policy`` (what speculation costs and the ``auto`` choice), ``stats``
and ``textstream`` (what a generation reports and shows). Nothing here imports ``llama_cpp``
or any other edgespec layer but ``config`` and ``errors``.
"""
