"""Prompt sets for ``edgespec bench``: the built-in one (package data) or a user's JSONL file.

One JSON object per line::

    {"id": "edit-rename", "kind": "edit", "prompt": "Rename ...", "max_tokens": 256}
    {"id": "chat-trip", "kind": "chat", "messages": [{"role": "user", "content": "..."}]}

    {"id": "structured-orders", "kind": "structured", "prompt": "Turn the orders ...",
     "schema": {"type": "object", ...}, "answer": {"orders": [...]}, "max_tokens": 320}

``id`` (unique), ``kind`` (``edit``: copy-heavy edits of given code; ``code``: free code
generation; ``chat``: plain chat; ``structured``: JSON answers under a JSON schema), and
exactly one of ``prompt`` (a string, sent as one user message through the chat template) or
``messages`` (a list of ``{"role", "content"}``). Optional: ``max_tokens`` (overrides
``--max-tokens``) and ``raw`` (``true``: no chat template; only with ``prompt``).

A ``structured`` prompt carries its ``schema`` (a JSON schema, compiled by llguidance when the
file loads: a bad one is a ConfigError naming the line): every configuration answers under it
(edgespec through ``json_schema=``, llama-cpp-python through its grammar made from the schema),
and each answer is checked against it (:func:`check_answer`). Its optional ``answer`` is a
valid answer (checked when the file loads), the text ``bench --overhead --structured`` walks
the masks along (:mod:`edgespec.bench.masks`). Blank lines and lines starting with ``#`` are
skipped.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..errors import ConfigError, read_text_file

KINDS = ("edit", "code", "chat", "structured")
#: The kind whose prompts carry a JSON schema.
STRUCTURED = "structured"
BUILTIN_PROMPTS = Path(__file__).with_name("data") / "prompts.jsonl"

_FIELDS = {"id", "kind", "prompt", "messages", "max_tokens", "raw", "schema", "answer"}
_ROLES = {"system", "user", "assistant"}
_CODE_BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.S)


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a string (one user message) or a list of chat messages."""

    id: str
    kind: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int | None = None
    raw: bool = False
    #: ``structured``: the JSON schema every answer must match, as JSON text (its key order kept)
    schema: str | None = None
    #: ``structured``, optional: a valid answer, as JSON text
    answer: str | None = None

    @property
    def payload(self) -> str | list[dict[str, str]]:
        """What :meth:`edgespec.Engine.stream` takes as ``prompt``."""
        return self.prompt if self.messages is None else [dict(m) for m in self.messages]

    def as_messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (llama-cpp-python's ``create_chat_completion``)."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]

    def to_dict(self) -> dict:
        out: dict = {"id": self.id, "kind": self.kind}
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        else:
            out["prompt"] = self.prompt
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.raw:
            out["raw"] = True
        if self.schema is not None:
            out["schema"] = json.loads(self.schema)
        if self.answer is not None:
            out["answer"] = json.loads(self.answer)
        return out


#: A short prompt every configuration runs once before measuring (not recorded).
WARMUP_PROMPT = BenchPrompt("warmup", "chat", prompt="Say hello in five words.")


def parse_prompt(obj: object, where: str) -> BenchPrompt:
    """Validate one decoded JSON line; raise ConfigError naming ``where`` and the problem."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(_FIELDS))})")
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid.strip():
        raise ConfigError(f"{where}: 'id' must be a non-empty string")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise ConfigError(f"{where}: give exactly one of 'prompt' or 'messages'")
    prompt = messages = None
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
    else:
        raw_messages = obj["messages"]
        if not isinstance(raw_messages, list) or not raw_messages:
            raise ConfigError(f"{where}: 'messages' must be a non-empty list")
        checked = []
        for i, m in enumerate(raw_messages):
            if (not isinstance(m, dict) or set(m) != {"role", "content"}
                    or m["role"] not in _ROLES or not isinstance(m["content"], str)):
                raise ConfigError(f"{where}: messages[{i}] must be {{\"role\": "
                                  f"{'|'.join(sorted(_ROLES))}, \"content\": string}}")
            checked.append({"role": m["role"], "content": m["content"]})
        messages = tuple(checked)
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise ConfigError(f"{where}: 'max_tokens' must be an integer >= 1, got {max_tokens!r}")
    raw = obj.get("raw", False)
    if not isinstance(raw, bool):
        raise ConfigError(f"{where}: 'raw' must be true or false")
    if raw and messages is not None:
        raise ConfigError(f"{where}: 'raw' needs 'prompt' (messages always use the chat template)")
    schema, answer = _parse_schema(obj, kind, where)
    return BenchPrompt(pid, kind, prompt, messages, max_tokens, raw, schema, answer)


def _parse_schema(obj: dict, kind: str, where: str) -> tuple[str | None, str | None]:
    """A structured prompt's schema (compiled by llguidance: a bad one is a ConfigError) and
    answer (checked against it), as JSON text; (None, None) for the other kinds."""
    from ..runtime.constraint import Constraint, check

    if "schema" not in obj:
        if kind == STRUCTURED:
            raise ConfigError(f"{where}: a structured prompt needs a 'schema' (a JSON schema)")
        if "answer" in obj:
            raise ConfigError(f"{where}: 'answer' goes with a 'schema' (kind structured)")
        return None, None
    if kind != STRUCTURED:
        raise ConfigError(f"{where}: 'schema' goes with kind structured, not {kind}")
    try:
        check(Constraint.json_schema(obj["schema"]))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    schema = json.dumps(obj["schema"])
    answer = None
    if "answer" in obj:
        answer = json.dumps(obj["answer"])
        problem = check_answer(answer, schema)
        if problem is not None:
            raise ConfigError(f"{where}: 'answer' does not match the schema: {problem}")
    return schema, answer


def check_answer(text: str, schema: str | dict) -> str | None:
    """Why ``text`` is not a valid answer under ``schema`` (it does not parse as JSON, or,
    where ``jsonschema`` is installed, does not match), or None when it is valid."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"not JSON ({err.msg} at character {err.pos})"
    try:
        import jsonschema
    except ImportError:  # (a test dependency): parsing is the check
        return None
    if isinstance(schema, str):
        schema = json.loads(schema)
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return None
    path = "".join(f"[{p!r}]" for p in error.absolute_path)
    return f"{path or 'the answer'}: {error.message}"


def load_prompts(path: str | Path | None = None) -> list[BenchPrompt]:
    """The prompts in ``path`` (JSONL), or the built-in set when ``path`` is None."""
    path = Path(path) if path is not None else BUILTIN_PROMPTS
    text = read_text_file(path, "prompt file")
    prompts: list[BenchPrompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path.name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: invalid JSON ({err.msg}, column {err.colno})") from None
        prompt = parse_prompt(obj, where)
        if prompt.id in seen:
            raise ConfigError(f"{where}: duplicate id {prompt.id!r}")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise ConfigError(f"no prompts in {path}")
    return prompts


def select_prompts(prompts: Sequence[BenchPrompt], only: Sequence[str] = (),
                   kinds: Sequence[str] = KINDS) -> list[BenchPrompt]:
    """Filter by id (``--only``, in the file's order) and kind (``--kinds``)."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ConfigError(f"unknown prompt kind(s) {', '.join(bad)}: choose from {', '.join(KINDS)}")
    ids = [p.id for p in prompts]
    missing = [i for i in only if i not in ids]
    if missing:
        raise ConfigError(f"no prompt with id {', '.join(missing)}; ids: {', '.join(ids)}")
    chosen = [p for p in prompts if (not only or p.id in only) and p.kind in kinds]
    if not chosen:
        raise ConfigError("no prompt left after --only/--kinds")
    return chosen


def as_raw(prompt: BenchPrompt) -> BenchPrompt:
    """``prompt`` as raw text, for a model without a chat template (a base model, a synthetic
    one): a conversation's contents one after the other."""
    if prompt.raw:
        return prompt
    text = (prompt.prompt if prompt.messages is None
            else "\n\n".join(m["content"] for m in prompt.messages))
    return replace(prompt, prompt=text, messages=None, raw=True)


def for_model(prompts: Sequence[BenchPrompt], has_chat_template: bool) -> list[BenchPrompt]:
    """The prompts as a model takes them: as they are, or raw where it has no chat template."""
    return list(prompts) if has_chat_template else [as_raw(p) for p in prompts]


def code_blocks(prompts: Sequence[BenchPrompt]) -> list[str]:
    """The fenced code blocks of the ``edit`` prompts (material for a long prompt)."""
    blocks = []
    for p in prompts:
        if p.kind == "edit":
            for m in p.as_messages():
                blocks.extend(_CODE_BLOCK.findall(m["content"]))
    return blocks


def long_prompt(count_tokens: Callable[[str], int], n_tokens: int,
                blocks: Sequence[str] | None = None) -> str:
    """A raw prompt of about ``n_tokens`` tokens (never more): the built-in edit prompts' code,
    repeated line by line, between a short header and a question."""
    blocks = list(blocks) if blocks is not None else code_blocks(load_prompts())
    if not blocks:
        raise ConfigError("no code blocks to build a long prompt from")
    head = "Below are the Python modules of one project.\n\n"
    tail = "\n\nIn one sentence, what does the first module do?\n"

    def text(lines: list[str]) -> str:
        return head + "\n".join(lines) + tail

    # Fast: count line by line; then exact, on the whole text (tokens merge across lines).
    budget = n_tokens - count_tokens(head + tail)
    source = _cycle_lines(blocks)
    lines: list[str] = []
    used = 0
    for line in source:
        used += count_tokens(line + "\n")
        if used > budget:
            break
        lines.append(line)
    if count_tokens(text(lines)) > n_tokens:
        while lines and count_tokens(text(lines)) > n_tokens:
            lines.pop()
    else:
        nxt = line
        while count_tokens(text(lines + [nxt])) <= n_tokens:
            lines.append(nxt)
            nxt = next(source)
    return text(lines)


def _cycle_lines(blocks: Sequence[str]) -> Iterator[str]:
    """The blocks' lines, over and over, each copy headed by a file-name comment."""
    for n in itertools.count():
        block = blocks[n % len(blocks)]
        yield f"# file {n}.py"
        yield from block.splitlines()
        yield ""
