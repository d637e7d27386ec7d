"""The Starlette app: OpenAI routes over one engine, one worker thread, a bounded queue.

Routes: ``GET /health`` (no key needed), ``GET /metrics``, ``GET /v1/models``,
``GET /v1/models/{id}``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

A generation request is validated first (400/422 before it queues), then queued (503 with
``Retry-After`` when the queue is full). The response waits for the first piece of text, so an
error the engine finds (context overflow, a drafter without its draft model) is still a plain
400; after that, a streamed response sends server-sent events in the OpenAI chunk format and
ends with ``data: [DONE]``. A client that disconnects, whether queued, waiting or mid-stream,
cancels its job: the worker closes the engine's generator at the end of the current round.
When the engine is lost (its RPC worker died or stopped answering), every open and queued
request gets a 503 ``backend_unavailable`` (an error event on a stream), then the process exits.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..errors import ContextOverflowError, EdgespecError
from ..runtime.engine import Engine
from . import DEFAULT_MAX_QUEUE, errors
from .errors import APIError
from .metrics import Metrics, prometheus_text
from .responses import DONE, Reply, sse
from .schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Defaults,
    parse_body,
    to_generation,
)
from .worker import (
    BackendLostError,
    InternalError,
    Job,
    Piece,
    QueueFullError,
    ShuttingDownError,
    Worker,
)

log = logging.getLogger("edgespec.server")

#: Largest request body accepted (413 beyond it).
MAX_BODY_BYTES = 16 * 1024 * 1024

#: Status recorded in the metrics for a request whose client went away before the answer.
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class ServerSettings:
    """How the server behaves: the model name it reports, its API key, queue size, defaults."""

    model_id: str
    api_key: str | None = None
    max_queue: int = DEFAULT_MAX_QUEUE
    defaults: Defaults = field(default_factory=Defaults)


def create_app(engine: Engine, settings: ServerSettings) -> Starlette:
    """The ASGI app serving ``engine``. Its worker thread starts and stops with the app's
    lifespan; ``app.state.worker`` and ``app.state.metrics`` expose them."""
    metrics = Metrics()
    worker = Worker(settings.max_queue,
                    on_done=lambda job, stats, secs: metrics.count_generation(job.outcome, stats, secs))
    api = _Api(engine, settings, worker, metrics)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from ..runtime.rpc import on_fatal

        worker.start()
        # A worker fault ends the process (ggml cannot go on): every open request hears why first.
        forget = on_fatal(lambda message: worker.fail_all(BackendLostError(message)))
        try:
            yield
        finally:
            forget()
            await asyncio.to_thread(worker.stop)

    def route(path: str, name: str, handler, method: str, auth: bool = True) -> Route:
        return Route(path, api.endpoint(name, handler, auth=auth), methods=[method])

    app = Starlette(
        routes=[
            route("/health", "health", api.health, "GET", auth=False),
            route("/metrics", "metrics", api.metrics_page, "GET"),
            route("/v1/models", "models", api.models, "GET"),
            route("/v1/models/{model_id:path}", "models", api.model, "GET"),
            route("/v1/completions", "completions", api.completions, "POST"),
            route("/v1/chat/completions", "chat.completions", api.chat_completions, "POST"),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
    )
    app.state.worker = worker
    app.state.metrics = metrics
    return app


def error_response(err: APIError) -> JSONResponse:
    """An OpenAI error body with the error's status and headers."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = errors.not_found(f"no route {request.method} {request.url.path}")
    else:
        err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
    return error_response(err)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    return error_response(errors.internal())


def as_api_error(err: BaseException) -> APIError:
    """What the client is told about an error from the engine or the worker."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, ShuttingDownError):
        return errors.shutting_down()
    if isinstance(err, BackendLostError):
        return errors.backend_lost(str(err))
    if isinstance(err, ContextOverflowError):
        return errors.bad_request(str(err), code="context_length_exceeded")
    if isinstance(err, EdgespecError):  # ConfigError (a drafter without its draft model), ...
        return errors.bad_request(str(err), code="invalid_value")
    if not isinstance(err, InternalError):
        log.error("unexpected error", exc_info=err)
    return errors.internal()


class _Api:
    """The route handlers, sharing one engine, worker and metrics."""

    def __init__(self, engine: Engine, settings: ServerSettings, worker: Worker, metrics: Metrics):
        self.engine = engine
        self.settings = settings
        self.worker = worker
        self.metrics = metrics
        self.started = int(time.time())

    def endpoint(self, name: str, handler: Callable[[Request], Awaitable[Response]],
                 *, auth: bool) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a handler: check the key, turn errors into OpenAI bodies, count the response."""

        async def wrapped(request: Request) -> Response:
            try:
                if auth:
                    self._check_key(request)
                response = await handler(request)
            except Exception as err:  # noqa: BLE001 - every error becomes an OpenAI body
                response = error_response(as_api_error(err))
            self.metrics.count_request(name, response.status_code)
            return response

        return wrapped

    def _check_key(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise errors.unauthorized()

    # ---- informational routes ---------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.settings.model_id,
                             "busy": self.worker.busy, "queue_depth": self.worker.queue_depth})

    async def metrics_page(self, request: Request) -> Response:
        snap = self.metrics.snapshot(queue_depth=self.worker.queue_depth,
                                     queue_capacity=self.settings.max_queue, busy=self.worker.busy)
        wants_json = (request.query_params.get("format") == "json"
                      or "application/json" in request.headers.get("accept", ""))
        if wants_json:
            return JSONResponse(snap)
        return PlainTextResponse(prometheus_text(snap), media_type="text/plain; version=0.0.4")

    def _model_card(self) -> dict[str, Any]:
        engine = self.engine
        return {"id": self.settings.model_id, "object": "model", "created": self.started,
                "owned_by": "edgespec",
                "edgespec": {"drafter": engine.drafter_name, "draft_length": engine.draft_length,
                             "draft_model": engine.draft is not None,
                             "context_length": engine.target.n_ctx}}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id != self.settings.model_id:
            raise errors.not_found(f"the model '{model_id}' does not exist; this server runs "
                                   f"'{self.settings.model_id}'", code="model_not_found",
                                   param="model")
        return JSONResponse(self._model_card())

    # ---- generation -------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        body = await _read_body(request)
        req = parse_body(ChatCompletionRequest if chat else CompletionRequest, body)
        gen = to_generation(req, self.settings.defaults)
        reply = Reply(chat=chat, model=self.settings.model_id)
        job = Job(lambda: self.engine.stream(gen.prompt, **gen.kwargs))
        try:
            self.worker.submit(job)
        except QueueFullError:
            raise errors.overloaded(self._retry_after()) from None
        except ShuttingDownError:
            raise errors.shutting_down() from None
        watcher = asyncio.create_task(_cancel_on_disconnect(request.receive, job))

        def done() -> None:
            watcher.cancel()
            job.cancel()

        streaming = False
        try:
            first = await job.next()
            if first is None:  # cancelled before any text: the client has gone
                return Response(status_code=CLIENT_CLOSED)
            if gen.stream:  # from here on, the response cancels the job when it ends
                streaming = True
                return _JobStream(self._events(reply, job, first, gen.include_usage), on_close=done)
            parts, last = [first.text], first
            while last.finish_reason is None:
                piece = await job.next()
                if piece is None:
                    return Response(status_code=CLIENT_CLOSED)
                parts.append(piece.text)
                last = piece
            assert last.stats is not None
            return JSONResponse(reply.body("".join(parts), last.finish_reason, last.stats))
        finally:
            if not streaming:
                done()

    async def _events(self, reply: Reply, job: Job, first: Piece,
                      include_usage: bool) -> AsyncIterator[str]:
        if reply.chat:
            yield sse(reply.chunk("", role=True))
        piece: Piece | None = first
        try:
            while piece is not None:
                if piece.text:
                    yield sse(reply.chunk(piece.text))
                if piece.finish_reason is not None:
                    yield sse(reply.chunk(reason=piece.finish_reason, stats=piece.stats))
                    if include_usage and piece.stats is not None:
                        yield sse(reply.usage_chunk(piece.stats))
                    break
                piece = await job.next()
        except Exception as err:  # noqa: BLE001 - after the headers, errors become an event
            yield sse(as_api_error(err).body())
        yield DONE

    def _retry_after(self) -> int:
        """Seconds until a queue slot is likely free (1 to 60)."""
        wait = self.metrics.mean_job_seconds * (self.worker.queue_depth + 1)
        return int(min(60, max(1, math.ceil(wait))))


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    return bytes(body)


async def _cancel_on_disconnect(receive: Receive, job: Job) -> None:
    """Cancel ``job`` when the client disconnects (the body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


class _JobStream(StreamingResponse):
    """Server-sent events that cancel their job however the response ends (done, client gone,
    server stopping)."""

    def __init__(self, events: AsyncIterator[str], *, on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
