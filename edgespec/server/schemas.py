"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, and what they ask the engine.

:func:`parse_body` validates the JSON against a pydantic model (types only: a malformed body is a
400, a body of the wrong shape a 422). :func:`to_generation` turns a valid request into the
arguments of ``engine.stream``, checking values with the engine's own validators (400), and
refusing OpenAI features that edgespec does not implement rather than ignoring them silently.
Fields no one here knows (``user``, ``metadata``, ...) are ignored, as most OpenAI-compatible
servers do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..config import DEFAULT_MAX_TOKENS
from ..core.sampling import SamplingParams
from ..errors import ConfigError
from ..runtime.drafters import check_drafter_name
from ..runtime.engine import validate_draft_length
from .errors import APIError, bad_request

_STRICT = ConfigDict(strict=True, extra="allow")


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices."""

    model_config = _STRICT
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions (OpenAI names), plus edgespec's
    extras ``top_k``, ``min_p``, ``drafter`` and ``draft_length``."""

    model_config = _STRICT
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    top_k: int | None = None
    min_p: float | None = None
    drafter: str | None = None
    draft_length: int | None = None


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: a raw prompt, no chat template."""

    prompt: str | list[str]


class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is supported."""

    model_config = _STRICT
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat turn."""

    model_config = _STRICT
    role: str
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``: messages rendered with the GGUF's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


#: OpenAI options edgespec does not implement, and the values that mean "not used".
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

_FIELD_NAMES = set().union(*(m.model_fields for m in (
    CompletionRequest, ChatCompletionRequest, ChatMessage, ContentPart, StreamOptions)))

R = TypeVar("R", bound=GenerationRequest)


@dataclass(frozen=True)
class Defaults:
    """The server's settings for fields a request leaves out (``edgespec serve`` options)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = DEFAULT_MAX_TOKENS


@dataclass
class Generation:
    """What a request asks for: ``engine.stream(prompt, **kwargs)``, streamed or not."""

    prompt: str | list[dict[str, str]]
    kwargs: dict[str, Any]
    stream: bool
    include_usage: bool


def parse_body(model: type[R], body: bytes) -> R:
    """Validate a JSON body: :class:`APIError` 400 if it is not a JSON object, 422 if a field
    has the wrong type or a required one is missing."""
    try:
        return model.model_validate_json(body or b"null")
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid" or (first["type"] == "model_type" and not first["loc"]):
            raise bad_request("the request body must be a JSON object",
                              code="invalid_json") from None
        param = _param(first["loc"])
        raise APIError(422, f"{param}: {first['msg']}", param=param, code="invalid_type") from None


def _param(loc: tuple[Any, ...]) -> str:
    """``messages[0].content`` from pydantic's ``('messages', 0, 'content', 'str')``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELD_NAMES:
            out += f".{part}" if out else part
        else:  # a union member's tag ('str', 'list[str]', ...): not part of the path
            break
    return out or "body"


def to_generation(req: GenerationRequest, defaults: Defaults) -> Generation:
    """Check a request's values and translate it into ``engine.stream`` arguments (400 on bad
    or unsupported values)."""
    for name, unused in UNSUPPORTED.items():
        if (req.model_extra or {}).get(name) not in unused:
            raise bad_request(f"{name} is not supported by edgespec", param=name,
                              code="unsupported_parameter")
    if isinstance(req, ChatCompletionRequest):
        prompt: str | list[dict[str, str]] = _messages(req.messages)
        max_tokens = req.max_completion_tokens or req.max_tokens
        chat = True
    elif isinstance(req, CompletionRequest):
        prompt = _prompt(req.prompt)
        max_tokens = req.max_tokens
        chat = False
    else:
        raise TypeError(type(req))
    max_tokens = defaults.max_tokens if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "sampling": _sampling(req, defaults.sampling),
        "stop": _stop(req.stop),
        "chat": chat,
    }
    if req.drafter is not None:
        kwargs["drafter"] = _checked(check_drafter_name, req.drafter, "drafter")
    if req.draft_length is not None:
        kwargs["draft_length"] = _checked(validate_draft_length, req.draft_length, "draft_length")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Generation(prompt, kwargs, req.stream, include_usage)


def _checked(check, value, param: str):
    try:
        return check(value)
    except ConfigError as err:
        raise bad_request(str(err), param=param) from None


def _sampling(req: GenerationRequest, base: SamplingParams) -> SamplingParams:
    values = {name: getattr(req, name) for name in ("temperature", "top_p", "top_k", "min_p", "seed")}
    try:
        return SamplingParams(**{name: getattr(base, name) if v is None else v
                                 for name, v in values.items()})
    except ConfigError as err:
        # SamplingParams' messages start with the field's name ("top_p must be ...")
        param = str(err).split(" ", 1)[0]
        raise bad_request(str(err), param=param if param in values else None) from None


def _stop(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    return stops


def _prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise bad_request("prompt: batches are not supported; send one string", param="prompt")
        prompt = prompt[0]
    if not prompt.strip():
        raise bad_request("the prompt is empty", param="prompt")
    return prompt


def _messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    if not messages:
        raise bad_request("messages must not be empty", param="messages")
    out = []
    for i, message in enumerate(messages):
        role = CHAT_ROLES.get(message.role)
        if role is None:
            raise bad_request(f"messages[{i}].role: unsupported role {message.role!r} (use "
                              f"{', '.join(CHAT_ROLES)})", param=f"messages[{i}].role")
        out.append({"role": role, "content": _content(message.content, i)})
    return out


def _content(content: str | list[ContentPart] | None, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(f"messages[{i}].content[{j}]: only text content is supported, "
                              f"got type {part.type!r}", param=f"messages[{i}].content")
        texts.append(part.text)
    return "\n".join(texts)
