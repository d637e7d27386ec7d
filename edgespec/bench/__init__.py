"""Measuring: ``run`` (the speed benchmark), ``memory``, ``prompts``, ``reference`` (llama-cpp-python's
own paths), ``report`` (tables, JSON, plot) and ``verify`` (the exactness audit)."""
