"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, and what they ask the engine.

:func:`parse_body` validates the JSON against a pydantic model (types only: a malformed body is a
400, a body of the wrong shape a 422). :func:`to_generation` turns a valid request into the
arguments of ``engine.stream``, checking values with the engine's own validators (400, naming
the parameter), and refusing OpenAI features that edgespec does not implement rather than
ignoring them silently. Fields no one here knows (``user``, ``metadata``, ...) are ignored, as
most OpenAI-compatible servers do.

Beyond sampling: ``response_format`` (OpenAI's ``text``, ``json_object``, ``json_schema``;
llama-server's ``json_object`` with a ``schema``), llama-server's ``json_schema`` and
``grammar`` (GBNF) fields, ``tools`` and ``tool_choice``, ``logprobs`` (and chat's
``top_logprobs``), ``logit_bias``, the OpenAI penalties and llama-server's ``repeat_penalty``
and ``repeat_last_n``, and ``n`` (choices generated one after another; with a ``seed``,
choice ``i`` uses ``seed + i``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..config import DEFAULT_MAX_TOKENS, MAX_TOP_LOGPROBS
from ..core.sampling import SamplingParams
from ..errors import ConfigError
from ..runtime.constraint import Constraint, check
from ..runtime import sources
from ..runtime.options import TOOL_CHOICE, ConstraintConflict, one_constraint, validate_draft_length
from ..runtime.tools import check_tools, requires_call
from .errors import APIError, bad_request

_STRICT = ConfigDict(strict=True, extra="allow")

#: most choices one request may ask for (``n``): they run one after another
MAX_CHOICES = 16


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices."""

    model_config = _STRICT
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions (OpenAI names), plus edgespec's
    extras ``top_k``, ``min_p``, ``drafter`` and ``draft_length`` and llama-server's
    ``repeat_penalty``, ``repeat_last_n``, ``json_schema`` and ``grammar``."""

    model_config = _STRICT
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    drafter: str | None = None
    draft_length: int | None = None


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: a raw prompt, no chat template. ``logprobs``: how many
    alternatives per token (0: the chosen token's own)."""

    prompt: str | list[str]
    logprobs: int | None = None


class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is supported."""

    model_config = _STRICT
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    """A call an earlier assistant turn made: ``arguments`` as JSON text (OpenAI) or an object."""

    model_config = _STRICT
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = _STRICT
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One chat turn: an assistant turn may carry ``tool_calls``; a ``tool`` turn answers one
    (``tool_call_id``)."""

    model_config = _STRICT
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``: messages rendered with the GGUF's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


#: OpenAI options edgespec does not implement, and the values that mean "not used".
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "functions": (None, []),
    "function_call": (None, "none"),
}

#: chat's options, refused on ``/v1/completions`` rather than ignored
CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls", "top_logprobs", "messages")

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
              "tool": "tool"}

_FIELD_NAMES = set().union(*(m.model_fields for m in (
    CompletionRequest, ChatCompletionRequest, ChatMessage, ContentPart, StreamOptions, ToolCall,
    FunctionCall)))

#: OpenAI's rule for a response format's name
_SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

R = TypeVar("R", bound=GenerationRequest)


@dataclass(frozen=True)
class Defaults:
    """The server's settings for fields a request leaves out (``edgespec serve`` options)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = DEFAULT_MAX_TOKENS


@dataclass
class Generation:
    """What a request asks for: ``n`` runs of ``engine.stream(prompt, **kwargs)`` (see
    :meth:`choice_kwargs`), streamed or not. ``tools``: whether the answer is read for calls
    (tools given and ``tool_choice`` not ``"none"``); ``logprobs``: None (off) or how many
    alternatives per token; ``single_call``: ``parallel_tool_calls`` false."""

    prompt: str | list[dict[str, Any]]
    kwargs: dict[str, Any]
    stream: bool
    include_usage: bool
    n: int = 1
    tools: bool = False
    logprobs: int | None = None
    single_call: bool = False

    def choice_kwargs(self, index: int) -> dict[str, Any]:
        """The arguments of choice ``index``: with a seed, choice ``i`` samples with
        ``seed + i``."""
        sampling: SamplingParams = self.kwargs["sampling"]
        if index == 0 or sampling.seed is None:
            return self.kwargs
        return {**self.kwargs, "sampling": replace(sampling, seed=sampling.seed + index)}


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
    extra = req.model_extra or {}
    for name, unused in UNSUPPORTED.items():
        if extra.get(name) not in unused:
            raise bad_request(f"{name} is not supported by edgespec", param=name,
                              code="unsupported_parameter")
    if isinstance(req, CompletionRequest):
        for name in CHAT_ONLY:
            if extra.get(name) is not None:
                raise bad_request(f"{name} is only supported on /v1/chat/completions", param=name,
                                  code="unsupported_parameter")
    kwargs: dict[str, Any] = {}
    tools = single_call = False
    if isinstance(req, ChatCompletionRequest):
        prompt: str | list[dict[str, Any]] = _messages(req.messages)
        max_tokens = req.max_completion_tokens or req.max_tokens
        chat = True
        logprobs = _chat_logprobs(req.logprobs, req.top_logprobs)
        if req.tools is not None or req.tool_choice is not None:
            _checked(check_tools, req.tools, req.tool_choice)
            if req.tools:
                kwargs["tools"] = req.tools
            if req.tool_choice is not None:
                kwargs["tool_choice"] = req.tool_choice
            tools = bool(req.tools) and req.tool_choice != "none"
            single_call = req.parallel_tool_calls is False
    elif isinstance(req, CompletionRequest):
        prompt = _prompt(req.prompt)
        max_tokens = req.max_tokens
        chat = False
        logprobs = _range(req.logprobs, "logprobs", 0, MAX_TOP_LOGPROBS)
    else:
        raise TypeError(type(req))
    max_tokens = defaults.max_tokens if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    n = _range(req.n, "n", 1, MAX_CHOICES, "choices run one after another") or 1
    kwargs = {"max_tokens": max_tokens, "sampling": _sampling(req, defaults.sampling),
              "stop": _stop(req.stop), "chat": chat, **kwargs}
    constraint = _constraint(req, kwargs.get("tool_choice"))
    if constraint is not None:
        kwargs["constraint"] = constraint
    if logprobs is not None:
        kwargs["logprobs"] = logprobs
    if req.drafter is not None:
        kwargs["drafter"] = _checked(sources.check_name, req.drafter, param="drafter")
    if req.draft_length is not None:
        kwargs["draft_length"] = _checked(validate_draft_length, req.draft_length,
                                          param="draft_length")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Generation(prompt, kwargs, req.stream, include_usage, n=n, tools=tools,
                      logprobs=logprobs, single_call=single_call)


def _checked(check_value, *args, param: str | None = None):
    """``check_value(*args)``, its ConfigError a 400 naming ``param`` (by default the path its
    message starts with: ``tools[0].function.name: ...``)."""
    try:
        return check_value(*args)
    except ConfigError as err:
        message = str(err)
        raise bad_request(message, param=param or message.split(":", 1)[0]) from None


def _range(value: int | None, name: str, lo: int, hi: int, why: str = "") -> int | None:
    if value is not None and not lo <= value <= hi:
        raise bad_request(f"{name} must be an integer in [{lo}, {hi}]{f' ({why})' if why else ''}, "
                          f"got {value}", param=name)
    return value


def _chat_logprobs(logprobs: bool | None, top: int | None) -> int | None:
    """Chat's ``logprobs`` and ``top_logprobs`` as the engine's count of alternatives."""
    _range(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", param="top_logprobs")
    return (top or 0) if logprobs else None


_SHAPING = {"presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
            "repeat_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n",
            "logit_bias": "logit_bias"}


def _sampling(req: GenerationRequest, base: SamplingParams) -> SamplingParams:
    names = ("temperature", "top_p", "top_k", "min_p", "seed")
    values = {name: getattr(req, name) for name in names}
    values.update({field_: getattr(req, name) for name, field_ in _SHAPING.items()})
    try:
        return SamplingParams(**{name: getattr(base, name) if v is None else v
                                 for name, v in values.items()})
    except ConfigError as err:
        # SamplingParams' messages start with the field's name ("top_p must be ...",
        # "logit_bias[5] must be ..."); the request may call it otherwise
        field_ = re.split(r"[ \[]", str(err), maxsplit=1)[0]
        param = {v: k for k, v in _SHAPING.items()}.get(field_, field_)
        message = str(err).replace("penalty_last_n", "repeat_last_n", 1)
        raise bad_request(message, param=param if param in values or param in _SHAPING
                          else None) from None


def _constraint(req: GenerationRequest, tool_choice: Any = None) -> Constraint | None:
    """The one constraint ``response_format``, ``json_schema`` or ``grammar`` asks for,
    compiled once here so that a bad schema or grammar is a 400 naming its parameter; a
    ``tool_choice`` that requires a call (the engine builds it) is one too."""
    given = [
        ("response_format", _response_format(req.response_format)),
        ("json_schema", None if req.json_schema is None
         else _schema(req.json_schema, "json_schema", "json_schema")),
        ("grammar", None if req.grammar is None
         else _compiled(lambda: Constraint.grammar(req.grammar), "grammar", "grammar")),
        (TOOL_CHOICE, tool_choice if requires_call(tool_choice) else None)]
    try:
        chosen = one_constraint(given)
    except ConstraintConflict as err:
        raise bad_request(str(err), param=err.name) from None
    return chosen[1] if chosen is not None and chosen[0] != TOOL_CHOICE else None


def _response_format(value: dict[str, Any] | None) -> Constraint | None:
    if value is None:
        return None
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")  # llama-server's extension
        if schema is None:
            return Constraint.json_object()
        return _schema(schema, "response_format.schema")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request('response_format.json_schema: must be an object {"name": ..., '
                              '"schema": {...}, "strict": ...}', param="response_format")
        name = spec.get("name")
        if name is not None and (not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name)):
            raise bad_request(f"response_format.json_schema.name: must be 1 to 64 letters, digits, "
                              f"'_' or '-', got {name!r}", param="response_format")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"response_format.json_schema.strict: must be true or false, got "
                              f"{strict!r}", param="response_format")
        schema = spec.get("schema")
        if schema is None:  # OpenAI's schema is optional: any JSON object then
            return Constraint.json_object()
        return _schema(schema, "response_format.json_schema.schema")
    raise bad_request(f'response_format.type: must be "text", "json_object" or "json_schema", '
                      f"got {kind!r}", param="response_format")


def _schema(schema: Any, where: str, param: str = "response_format") -> Constraint:
    if not isinstance(schema, dict):
        raise bad_request(f"{where}: a JSON schema must be an object, got "
                          f"{type(schema).__name__}", param=param)
    return _compiled(lambda: Constraint.json_schema(schema), where, param)


def _compiled(make, where: str, param: str) -> Constraint:
    try:
        constraint = make()
        check(constraint)
    except ConfigError as err:
        raise bad_request(f"{where}: {err}", param=param) from None
    return constraint


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


def _messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as the chat template takes them: roles mapped, text parts joined, a tool
    turn's ``tool_call_id`` and an assistant turn's ``tool_calls`` kept, with each call's
    ``arguments`` as an object (the templates write them with ``tojson``)."""
    if not messages:
        raise bad_request("messages must not be empty", param="messages")
    out = []
    for i, message in enumerate(messages):
        role = CHAT_ROLES.get(message.role)
        if role is None:
            raise bad_request(f"messages[{i}].role: unsupported role {message.role!r} (use "
                              f"{', '.join(CHAT_ROLES)})", param=f"messages[{i}].role")
        turn: dict[str, Any] = {"role": role, "content": _content(message.content, i)}
        if message.tool_calls is not None:
            if role != "assistant":
                raise bad_request(f"messages[{i}].tool_calls: only an assistant turn makes calls",
                                  param=f"messages[{i}].tool_calls")
            turn["tool_calls"] = [_past_call(call, i, j)
                                  for j, call in enumerate(message.tool_calls)]
        if role == "tool":
            if message.tool_call_id is not None:
                turn["tool_call_id"] = message.tool_call_id
            if message.name is not None:
                turn["name"] = message.name
        out.append(turn)
    return out


def _past_call(call: ToolCall, i: int, j: int) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}]"
    if call.type != "function":
        raise bad_request(f"{where}.type: only function calls are supported, got {call.type!r}",
                          param=f"messages[{i}].tool_calls")
    arguments = call.function.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise bad_request(f"{where}.function.arguments: not valid JSON ({err})",
                              param=f"messages[{i}].tool_calls") from None
        if not isinstance(arguments, dict):
            raise bad_request(f"{where}.function.arguments: must be a JSON object, got "
                              f"{type(arguments).__name__}", param=f"messages[{i}].tool_calls")
    out: dict[str, Any] = {"type": "function",
                           "function": {"name": call.function.name, "arguments": arguments}}
    if call.id is not None:
        out["id"] = call.id
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
