"""OpenAI response bodies and stream chunks, with edgespec's stats in an ``edgespec`` field.

``usage`` follows OpenAI (prompt, completion and total tokens; with ``n`` choices the prompt
counts once and the completions add up). ``edgespec`` carries ``Stats.to_dict()``
(acceptance rate, mean accepted, tokens per second, where time went) plus the engine's own
finish reason: OpenAI has no ``"context"`` (context window full), which is sent as
``"length"`` in ``finish_reason`` and kept as is in ``edgespec.finish_reason``.

Log-probabilities come in OpenAI's two shapes: chat's ``{"content": [{"token", "logprob",
"bytes", "top_logprobs": [...]}]}`` and the legacy completions' ``{"tokens",
"token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}``.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: what a log-probability of -inf is sent as (JSON has no infinity; OpenAI's own floor)
LOGPROB_FLOOR = -9999.0


def usage(stats: dict[str, Any] | Sequence[dict[str, Any]]) -> dict[str, int]:
    """OpenAI ``usage`` from ``Stats.to_dict()``, or from each choice's."""
    each = [stats] if isinstance(stats, dict) else list(stats)
    prompt = each[0]["prompt_tokens"]
    generated = sum(s["generated"] for s in each)
    return {"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated}


def openai_finish_reason(reason: str) -> str:
    """``stop``, ``length`` and ``tool_calls`` as they are; ``context`` (window full) becomes
    ``length``."""
    return "length" if reason == "context" else reason


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


DONE = sse("[DONE]")


# ---- log-probabilities --------------------------------------------------------------------


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and its alternatives, as plain data (made on the
    worker's thread, read on the event loop's). ``chars``: the characters of text the token
    completed (completions' ``text_offset`` adds them up)."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...]
    chars: int


def token_logprobs(tokens: Sequence[Any],
                   token_bytes: Callable[[int], bytes]) -> tuple[TokenLogprob, ...]:
    """The engine's ``TokenInfo`` items with their log-probabilities, as plain data."""
    return tuple(
        TokenLogprob(token_bytes(t.id), _finite(t.logprob),
                     tuple((token_bytes(i), _finite(lp)) for i, lp in t.top_logprobs), len(t.text))
        for t in tokens if t.logprob is not None)


def _finite(logprob: float) -> float:
    return LOGPROB_FLOOR if math.isinf(logprob) or math.isnan(logprob) else float(logprob)


def token_text(piece: bytes) -> str:
    """A token's text; the bytes of a character it only begins show as ``\\xNN`` (as OpenAI)."""
    return piece.decode("utf-8", "backslashreplace")


def chat_logprobs(items: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Chat's ``logprobs``: ``{"content": [...]}``."""
    return {"content": [
        {"token": token_text(item.token), "logprob": item.logprob, "bytes": list(item.token),
         "top_logprobs": [{"token": token_text(t), "logprob": lp, "bytes": list(t)}
                          for t, lp in item.top]}
        for item in items]}


def completion_logprobs(items: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy completions' ``logprobs``; ``offset``: the characters of text before these
    tokens (a stream's later chunks). ``top_logprobs`` maps each alternative's text to its
    log-probability, the chosen token's included (up to ``logprobs + 1`` entries, as OpenAI)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for item in items:
        tokens.append(token_text(item.token))
        logprobs.append(item.logprob)
        top: dict[str, float] = {}
        for piece, lp in (*item.top, (item.token, item.logprob)):
            top.setdefault(token_text(piece), lp)
        tops.append(top)
        offsets.append(offset)
        offset += item.chars
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
            "text_offset": offsets}


# ---- bodies -------------------------------------------------------------------------------


class Reply:
    """Builds the bodies of one response: ``chat`` (chat.completion) or text (text_completion)."""

    def __init__(self, *, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str | None, reason: str, *,
               tool_calls: list[dict] | None = None,
               logprobs: Sequence[TokenLogprob] | None = None) -> dict[str, Any]:
        """One choice of a whole response. Chat: ``text`` is the message's content (None
        beside tool calls)."""
        out: dict[str, Any] = {"index": index, "finish_reason": openai_finish_reason(reason),
                               "logprobs": None}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            out["message"] = message
            if logprobs is not None:
                out["logprobs"] = chat_logprobs(logprobs)
        else:
            out["text"] = text or ""
            if logprobs is not None:
                out["logprobs"] = completion_logprobs(logprobs)
        return out

    def body(self, choices: list[dict[str, Any]], stats: list[dict[str, Any]],
             reasons: list[str]) -> dict[str, Any]:
        """The whole (non-streamed) response; ``stats`` and ``reasons``: each choice's
        ``Stats.to_dict()`` and engine finish reason. ``edgespec`` holds the first choice's,
        and with several choices each one's under ``choices``."""
        extra = {**stats[0], "finish_reason": reasons[0]}
        if len(stats) > 1:
            extra["choices"] = [{**s, "finish_reason": r} for s, r in zip(stats, reasons)]
        return {**self._envelope("chat.completion" if self.chat else "text_completion"),
                "choices": choices, "usage": usage(stats), "edgespec": extra}

    def chunk(self, text: str | None = None, *, index: int = 0, role: bool = False,
              delta: dict[str, Any] | None = None, reason: str | None = None,
              stats: dict[str, Any] | None = None, engine_reason: str | None = None,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One stream chunk of choice ``index``: ``text`` (content), or a ready ``delta``
        (tool calls). The last one of a choice (``reason`` set) also carries ``usage`` and
        ``edgespec`` (``engine_reason``: the engine's own, where ``reason`` differs)."""
        choice: dict[str, Any] = {"index": index,
                                  "finish_reason": reason and openai_finish_reason(reason),
                                  "logprobs": logprobs}
        if self.chat:
            out_delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                out_delta["content"] = text
            out_delta.update(delta or {})
            choice["delta"] = out_delta
        else:
            choice["text"] = text or ""
        out = {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
               "choices": [choice]}
        if stats is not None:
            out["usage"] = usage(stats)
            out["edgespec"] = {**stats, "finish_reason": engine_reason or reason}
        return out

    def usage_chunk(self, stats: dict[str, Any] | Sequence[dict[str, Any]]) -> dict[str, Any]:
        """``stream_options.include_usage``: a last chunk with no choices and the usage."""
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [], "usage": usage(stats)}
