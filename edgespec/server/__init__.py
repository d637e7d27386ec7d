"""``edgespec serve``: an OpenAI-compatible HTTP server over one :class:`edgespec.Engine`.

Modules, one job each:

- :mod:`.schemas`: request bodies (pydantic) and their translation into ``engine.stream`` arguments;
- :mod:`.responses`: OpenAI response bodies and stream chunks;
- :mod:`.worker`: the single generation thread and its bounded, in-order queue;
- :mod:`.metrics`: counters behind ``GET /metrics``;
- :mod:`.app`: the Starlette routes;
- :mod:`.run`: binding the socket and running uvicorn; :mod:`.cli`: the ``serve`` command.

Importing this package loads neither Starlette nor uvicorn (the CLI stays fast to start).
"""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Requests that may wait behind the running one before new ones get HTTP 503.
DEFAULT_MAX_QUEUE = 16
