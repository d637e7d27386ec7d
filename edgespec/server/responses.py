"""OpenAI response bodies and stream chunks, with edgespec's stats in an ``edgespec`` field.

``usage`` follows OpenAI (prompt, completion and total tokens). ``edgespec`` carries
``Stats.to_dict()`` (acceptance rate, mean accepted, tokens per second, where time went) plus the
engine's own finish reason: OpenAI has no ``"context"`` (context window full), which is sent as
``"length"`` in ``finish_reason`` and kept as is in ``edgespec.finish_reason``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any


def usage(stats: dict[str, Any]) -> dict[str, int]:
    """OpenAI ``usage`` from ``Stats.to_dict()``."""
    prompt, generated = stats["prompt_tokens"], stats["generated"]
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def openai_finish_reason(reason: str) -> str:
    """``stop`` and ``length`` as they are; ``context`` (window full) becomes ``length``."""
    return "length" if reason == "context" else reason


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


DONE = sse("[DONE]")


class Reply:
    """Builds the bodies of one response: ``chat`` (chat.completion) or text (text_completion)."""

    def __init__(self, *, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, text: str, reason: str, stats: dict[str, Any]) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": openai_finish_reason(reason),
                                  "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._envelope("chat.completion" if self.chat else "text_completion"),
                "choices": [choice], "usage": usage(stats),
                "edgespec": {**stats, "finish_reason": reason}}

    def chunk(self, text: str | None = None, *, role: bool = False, reason: str | None = None,
              stats: dict[str, Any] | None = None) -> dict[str, Any]:
        """One stream chunk. The last one (``reason`` set) also carries ``usage`` and ``edgespec``."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason and openai_finish_reason(reason),
                                  "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        out = {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
               "choices": [choice]}
        if stats is not None:
            out["usage"] = usage(stats)
            out["edgespec"] = {**stats, "finish_reason": reason}
        return out

    def usage_chunk(self, stats: dict[str, Any]) -> dict[str, Any]:
        """``stream_options.include_usage``: a last chunk with no choices and the usage."""
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [], "usage": usage(stats)}
