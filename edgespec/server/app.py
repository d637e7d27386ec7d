"""The Starlette app: OpenAI routes over one engine, one worker thread, a bounded queue.

Routes: ``GET /health`` (no key needed), ``GET /metrics``, ``GET /v1/models``,
``GET /v1/models/{id}``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

A generation request is validated first (400/422 before it queues), then queued (503 with
``Retry-After`` when the queue is full). The response waits for the first piece of text, so an
error the engine finds (context overflow, a drafter without its draft model) is still a plain
400; after that, a streamed response sends server-sent events in the OpenAI chunk format and
ends with ``data: [DONE]``. With ``n`` choices, they run one after another, and a stream sends
each choice's chunks in turn. With tools, the model's text is read for calls
(:class:`~edgespec.runtime.tools.ToolCallStream`): a message's ``tool_calls`` and
``finish_reason`` ``"tool_calls"``, streamed as OpenAI's tool-call deltas.

A client that disconnects, whether queued, waiting or mid-stream, cancels its job: the worker
closes the engine's generator at the end of the current round.
When the engine is lost (its RPC worker died or stopped answering), every open and queued
request gets a 503 ``backend_unavailable`` (an error event on a stream), then the process exits.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import math
import re
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
from ..runtime.tools import ToolCallStream, call_finish_reason, parse_tool_calls, tool_family
from . import DEFAULT_MAX_QUEUE, errors
from .errors import APIError
from .metrics import Metrics, prometheus_text
from .responses import (
    DONE,
    Reply,
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    sse,
    token_logprobs,
)
from .schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Defaults,
    Generation,
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
        return errors.bad_request(str(err), code="invalid_value", param=_param_named(str(err)))
    if not isinstance(err, InternalError):
        log.error("unexpected error", exc_info=err)
    return errors.internal()


#: request parameters an engine's message may start with (``logit_bias names token ...``)
_PARAMS = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)


def _param_named(message: str) -> str | None:
    """The request parameter an engine's error message starts with, if it names one."""
    match = re.match(r"([a-z_]+)[\[.: ]", message)
    return match.group(1) if match and match.group(1) in _PARAMS else None


class _Api:
    """The route handlers, sharing one engine, worker and metrics."""

    def __init__(self, engine: Engine, settings: ServerSettings, worker: Worker, metrics: Metrics):
        self.engine = engine
        self.settings = settings
        self.worker = worker
        self.metrics = metrics
        self.started = int(time.time())
        # how the target's chat template has the model write tool calls (read once, here:
        # afterwards the model is the worker thread's)
        metadata = getattr(engine.target, "metadata", None)
        self.tool_family = tool_family(metadata().get("tokenizer.chat_template", "")
                                       if metadata else "")

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
        engine = self.engine
        starts = [functools.partial(engine.stream, gen.prompt, **gen.choice_kwargs(i))
                  for i in range(gen.n)]
        detail = None
        if gen.logprobs is not None:
            def detail(chunk):  # on the worker's thread: the engine's vocabulary is read there
                return token_logprobs(chunk.tokens, engine.target.token_bytes)
        job = Job(*starts, detail=detail)
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
                return _JobStream(self._events(reply, job, first, gen), on_close=done)
            answers = [_Answer() for _ in range(gen.n)]
            piece: Piece | None = first
            while True:
                answers[piece.choice].add(piece)
                if piece.finish_reason is not None and piece.choice == gen.n - 1:
                    break
                piece = await job.next()
                if piece is None:
                    return Response(status_code=CLIENT_CLOSED)
            return JSONResponse(self._body(reply, gen, answers))
        finally:
            if not streaming:
                done()

    def _body(self, reply: Reply, gen: Generation, answers: list["_Answer"]) -> dict[str, Any]:
        choices = []
        for index, answer in enumerate(answers):
            text, reason, calls = "".join(answer.parts), answer.reason, None
            if gen.tools:
                text, calls = parse_tool_calls(text, self.tool_family)
                calls = calls[:1] if gen.single_call else calls
                reason = call_finish_reason(reason, bool(calls))
            logprobs = answer.logprobs if gen.logprobs is not None else None
            choices.append(reply.choice(index, text, reason, tool_calls=calls, logprobs=logprobs))
        return reply.body(choices, [a.stats for a in answers], [a.reason for a in answers])

    async def _events(self, reply: Reply, job: Job, first: Piece,
                      gen: Generation) -> AsyncIterator[str]:
        piece: Piece | None = first
        choice = _StreamedChoice(reply, gen, self.tool_family, piece.choice)
        stats: list[dict[str, Any]] = []
        try:
            for event in choice.start():
                yield sse(event)
            while piece is not None:
                if piece.choice != choice.index:
                    choice = _StreamedChoice(reply, gen, self.tool_family, piece.choice)
                    for event in choice.start():
                        yield sse(event)
                for event in choice.feed(piece):
                    yield sse(event)
                if piece.finish_reason is not None:
                    assert piece.stats is not None
                    stats.append(piece.stats)
                    if piece.choice == gen.n - 1:
                        if gen.include_usage:
                            yield sse(reply.usage_chunk(stats))
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


class _Answer:
    """One choice of a whole (non-streamed) response, as its pieces come."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.reason = "stop"
        self.stats: dict[str, Any] = {}

    def add(self, piece: Piece) -> None:
        self.parts.append(piece.text)
        self.logprobs.extend(piece.detail or ())
        if piece.finish_reason is not None:
            self.reason = piece.finish_reason
            self.stats = piece.stats or {}


class _StreamedChoice:
    """The chunks of one streamed choice: its text as content deltas, or read for tool calls
    (held back while a call may be starting); each chunk carries the log-probabilities of the
    tokens it brings (those of held-back text ride with the next chunk)."""

    def __init__(self, reply: Reply, gen: Generation, family: str, index: int) -> None:
        self.reply = reply
        self.index = index
        self.logprobs = gen.logprobs is not None
        self.single_call = gen.single_call
        self.calls = ToolCallStream(family) if gen.tools else None
        self.pending: list[TokenLogprob] = []
        self.offset = 0  #: completions' text_offset: characters sent so far

    def start(self) -> list[dict[str, Any]]:
        """The opening chunk (chat: the assistant's role)."""
        return [self.reply.chunk("", index=self.index, role=True)] if self.reply.chat else []

    def feed(self, piece: Piece) -> list[dict[str, Any]]:
        self.pending.extend(piece.detail or ())
        if self.calls is not None:
            deltas = self.calls.feed(piece.text)
            if piece.finish_reason is not None:
                deltas += self.calls.finish()
        else:
            deltas = [{"content": piece.text}] if piece.text else []
        if self.single_call:
            deltas = [d for d in deltas if all(c["index"] == 0 for c in d.get("tool_calls", ()))]
        out = [self._chunk(delta) for delta in deltas]
        if piece.finish_reason is not None:
            called = self.calls is not None and self.calls.calls > 0
            reason = call_finish_reason(piece.finish_reason, called)
            out.append(self.reply.chunk(index=self.index, reason=reason, stats=piece.stats,
                                        engine_reason=piece.finish_reason,
                                        logprobs=self._logprobs()))
        return out

    def _chunk(self, delta: dict[str, Any]) -> dict[str, Any]:
        if "content" in delta:
            return self.reply.chunk(delta["content"], index=self.index, logprobs=self._logprobs())
        return self.reply.chunk(index=self.index, delta=delta, logprobs=self._logprobs())

    def _logprobs(self) -> dict[str, Any] | None:
        """The log-probabilities not sent yet, in the reply's shape (None where not asked)."""
        if not self.logprobs:
            return None
        items, self.pending = self.pending, []
        if self.reply.chat:
            return chat_logprobs(items)
        out = completion_logprobs(items, self.offset)
        self.offset += sum(item.chars for item in items)
        return out
