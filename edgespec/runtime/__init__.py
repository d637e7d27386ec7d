"""What drives llama.cpp: ``backend`` (a model and its context: ``llama_model``,
``llama_context``, ``callplan``, ``llama_log``, the modules that call llama_cpp for a
generation), ``loop`` (a round as propose, score, judge, commit), ``sources`` (one module per
source of drafts, and their registry), ``guide`` (how rows are shaped), ``options`` (what a load
takes) and ``engine`` (the public Engine).

Imports ``core`` and ``models``; never a face (cli, server, tui) or ``bench``.
"""
