"""What drives llama.cpp: ``backend`` (the only module that calls llama_cpp), ``loop`` (one
speculative round after another), ``drafters`` and ``engine`` (the public Engine).

Imports ``core`` and ``models``; never a face (cli, server, tui) or ``bench``.
"""
