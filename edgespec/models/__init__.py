"""Models on disk: ``catalog`` (which GGUF models exist and where to fetch them), ``download``
(fetching into the verified cache) and ``resolve`` (a model argument to a local file).

Imports neither the runtime nor any face.
"""
