"""Tool calls (OpenAI function tools): checking them, constraining the output to a call, and
reading the model's calls out of its text, whole or while it streams.

Two families of chat template are known, found by :func:`tool_family` in the template's text:

- ``hermes`` (Qwen2.5, Qwen3, Hermes): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, several in a row for
  parallel calls, possibly after some text. In the Qwen vocabularies ``<tool_call>`` and
  ``</tool_call>`` are tokens of their own, which a Lark grammar names as ``<tool_call>``.
  Small models left free often write the call object in a ``json`` code fence, or as the
  whole answer, instead: those are read as calls too (as llama-server reads them).
- ``llama3`` (Llama 3.1 and later): the whole answer is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``; several calls are separated by ``;``.

With ``tool_choice`` ``"required"`` or a named function, :func:`tool_constraint` gives an
llguidance Lark grammar whose calls embed each function's parameter schema with ``%json``: the
arguments are then valid by construction. With ``"auto"`` the model is free, and a call it
writes is read as it comes (:class:`ToolCallStream`); a call that does not parse is left in
the content, never dropped.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from typing import Any, Iterable

from ..errors import ConfigError
from .constraint import JSON_LAYOUT, Constraint, check

FAMILIES = ("hermes", "llama3", "none")

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"

#: the key each family writes the arguments under (the other is read too)
ARGUMENT_KEYS = {"hermes": ("arguments", "parameters"), "llama3": ("parameters", "arguments")}

#: OpenAI's rule for function names
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

_CHOICES = ("auto", "none", "required")

#: a function without ``parameters`` takes none (OpenAI)
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}

Event = dict[str, Any]


# ---- checking -----------------------------------------------------------------------------


def check_tools(tools: list[dict] | None, tool_choice: Any = None) -> None:
    """ConfigError, its message starting with the parameter's path (``tools[1].function.name:
    ...``, ``tool_choice: ...``), for tools or a tool choice that cannot be used: a tool that
    is not a function, a bad or repeated name, parameters that are not an object schema or
    do not compile, an unknown tool choice, a named function that is not among the tools."""
    if tools is not None and not isinstance(tools, list):
        raise ConfigError(f"tools: must be a list of tools, got {type(tools).__name__}")
    names: set[str] = set()
    for i, tool in enumerate(tools or []):
        name = _check_tool(tool, f"tools[{i}]")
        if name in names:
            raise ConfigError(f"tools[{i}].function.name: {name!r} names two tools")
        names.add(name)
    named = _named(tool_choice)
    if named is None and tool_choice not in (None, *_CHOICES):
        raise ConfigError(f"tool_choice: must be one of {', '.join(map(repr, _CHOICES))} or "
                          f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, "
                          f"got {tool_choice!r}")
    if requires_call(tool_choice) and not names:
        raise ConfigError(f"tool_choice: {_describe_choice(tool_choice)} needs tools, and none "
                          f"were given")
    if named is not None and named not in names:
        raise ConfigError(f"tool_choice: the function {named!r} is not among the tools "
                          f"({', '.join(sorted(names))})")


def _check_tool(tool: Any, where: str) -> str:
    if not isinstance(tool, dict):
        raise ConfigError(f"{where}: a tool must be an object, got {type(tool).__name__}")
    if tool.get("type") != "function":
        raise ConfigError(f"{where}.type: only function tools are supported "
                          f"(\"type\": \"function\"), got {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ConfigError(f"{where}.function: must be an object with a name, got {function!r}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{where}.function.name: must be 1 to 64 letters, digits, '_' or '-', "
                          f"got {name!r}")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ConfigError(f"{where}.function.description: must be a string, got {description!r}")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ConfigError(f"{where}.function.strict: must be true or false, got {strict!r}")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise ConfigError(f"{where}.function.parameters: must be a JSON schema object, "
                              f"got {type(parameters).__name__}")
        kind = parameters.get("type", "object")
        if kind != "object":
            raise ConfigError(f"{where}.function.parameters: the arguments are a JSON object, so "
                              f"the schema's type must be \"object\", got {kind!r}")
        try:
            check(Constraint.json_schema(parameters))
        except ConfigError as err:
            raise ConfigError(f"{where}.function.parameters: {err}") from None
    return name


def requires_call(tool_choice: Any) -> bool:
    """Whether ``tool_choice`` makes the answer a call: ``"required"`` or a named function."""
    return tool_choice == "required" or isinstance(tool_choice, dict)


def call_finish_reason(reason: str, called: bool) -> str:
    """OpenAI's ``finish_reason`` for an answer read for tool calls: ``"tool_calls"`` where it
    made calls and ended by itself (``"stop"``); a call cut short keeps ``"length"``."""
    return "tool_calls" if called and reason == "stop" else reason


def _named(tool_choice: Any) -> str | None:
    """The function a ``{"type": "function", "function": {"name": ...}}`` choice names."""
    if not isinstance(tool_choice, dict):
        return None
    function = tool_choice.get("function")
    if tool_choice.get("type") != "function" or not isinstance(function, dict):
        raise ConfigError(f"tool_choice: a named choice is {{\"type\": \"function\", \"function\": "
                          f"{{\"name\": ...}}}}, got {tool_choice!r}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"tool_choice.function.name: must be a function's name, got {name!r}")
    return name


def _describe_choice(tool_choice: Any) -> str:
    named = _named(tool_choice)
    return f"the function {named!r}" if named else repr(tool_choice)


# ---- the chat template's format -----------------------------------------------------------


def tool_family(chat_template: str | None) -> str:
    """How the chat template has the model write calls: ``hermes`` (``<tool_call>`` tags),
    ``llama3`` (a JSON object with ``parameters``) or ``none`` (no tool format known)."""
    text = chat_template or ""
    if OPEN in text:
        return "hermes"
    if PYTHON_TAG in text or ("<|start_header_id|>" in text and "tools" in text):
        return "llama3"
    return "none"


# ---- constraining -------------------------------------------------------------------------


def tool_constraint(tools: list[dict] | None, tool_choice: Any, family: str, *,
                    parallel: bool = True, tokenizer: Any = None) -> Constraint | None:
    """The constraint that makes the answer tool calls, or None where the model is free
    (``tool_choice`` absent, ``"auto"`` or ``"none"``). Tools for a template of family
    ``none`` are a ConfigError, unless ``tool_choice`` is ``"none"`` (they are not used).

    ``"required"``: one call to any of the tools (``hermes``: one or more where ``parallel``);
    a named function: one call to it. Each call's arguments follow that function's parameter
    schema, laid out as :data:`~edgespec.runtime.constraint.JSON_LAYOUT` (``", "``, ``": "``).
    ``tokenizer`` (llguidance's), if given, says whether ``<tool_call>`` is a token of its own
    (a special token in the grammar) or text."""
    check_tools(tools, tool_choice)
    if family not in FAMILIES:
        raise ConfigError(f"unknown tool family {family!r}: one of {', '.join(FAMILIES)}")
    if tools and family == "none" and tool_choice != "none":
        raise ConfigError("tools: this model's chat template has no tool-call format edgespec "
                          "knows (Qwen/Hermes <tool_call> tags, Llama 3.1 JSON)")
    if not requires_call(tool_choice):
        return None
    named = _named(tool_choice)
    chosen = [t["function"] for t in tools or [] if named is None or t["function"]["name"] == named]
    key = ARGUMENT_KEYS[family][0]
    lines = ["%llguidance {}"]
    if family == "hermes":
        several = parallel and named is None
        lines.append('start: call ("\\n" call)*' if several else "start: call")
        open_, close = _tag(OPEN, tokenizer), _tag(CLOSE, tokenizer)
        body = '{open} "\\n" {json} "\\n" {close}'
    else:
        lines.append("start: call")
        open_ = close = ""
        body = "{json}"
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(chosen))))
    for i, function in enumerate(chosen):
        schema = {"x-guidance": JSON_LAYOUT, "type": "object",
                  "properties": {"name": {"const": function["name"]},
                                 key: function.get("parameters") or _NO_PARAMETERS},
                  "required": ["name", key], "additionalProperties": False}
        json_rule = "%json " + json.dumps(schema, ensure_ascii=False)
        lines.append(f"call_{i}: " + body.format(open=open_, json=json_rule, close=close))
    return Constraint.lark("\n".join(lines) + "\n")


def _tag(text: str, tokenizer: Any) -> str:
    """``<tool_call>`` as the grammar writes it: the special token where the tokenizer has it
    as one token of its own (or no tokenizer is given), else the text."""
    if tokenizer is None:
        return text
    ids = tokenizer.tokenize_str(text)
    if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


# ---- reading calls ------------------------------------------------------------------------


def new_call_id() -> str:
    """An OpenAI-style call id: ``call_`` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(text: str, family: str) -> tuple[str | None, list[dict]]:
    """The content outside the calls (None where there is none beside them) and the calls,
    as OpenAI's ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
    ``arguments`` a JSON string. Text without calls comes back as it is. The same reading as
    :class:`ToolCallStream`: a streamed answer's deltas add up to this."""
    stream = ToolCallStream(family)
    return merge_events([*stream.feed(text), *stream.finish()], text)


def merge_events(events: Iterable[Event], text: str | None = None) -> tuple[str | None, list[dict]]:
    """Join :class:`ToolCallStream` deltas into (content, calls)."""
    content: list[str] = []
    calls: list[dict] = []
    for event in events:
        if "content" in event:
            content.append(event["content"])
        for delta in event.get("tool_calls", ()):
            if delta["index"] == len(calls):
                calls.append({"id": delta["id"], "type": "function",
                              "function": {"name": delta["function"]["name"], "arguments": ""}})
            calls[delta["index"]]["function"]["arguments"] += delta["function"].get("arguments", "")
    joined = "".join(content)
    if not calls:
        return (joined if text is None else text), []
    return joined or None, calls


class ToolCallStream:
    """Reads a streamed answer into OpenAI deltas: ``{"content": text}`` and
    ``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}`` (a call's
    first delta) or ``{"tool_calls": [{"index", "function": {"arguments": piece}}]}``.

    ``hermes`` calls are ``<tool_call>`` tags, or, as llama-server also reads them from models
    that do not use the tags, a call object in a ``json`` code fence or opening the answer.
    Text that may still become a call (a partial ``<tool_call>``, a call's head before its
    name is known) is held back. A call written as ``{"name": ..., "arguments": {`` is
    announced as soon as its name is read and its arguments stream piece by piece; one in
    tags written otherwise is read whole at its end, and a fence or a ``{`` that does not open
    a call is content. Whitespace between content and calls is dropped (content after a call
    keeps what separates it from content before). Without calls, the content deltas add up
    to the text exactly.
    """

    def __init__(self, family: str) -> None:
        if family not in FAMILIES:
            raise ConfigError(f"unknown tool family {family!r}: one of {', '.join(FAMILIES)}")
        self.family = family
        self.calls = 0  #: calls announced so far
        self._buf = ""
        self._state = "start"
        self._opener = ""  #: the text that opened the call being read ("" for a bare one)
        self._raw = ""  #: llama3: the whole text, for content where the calls do not parse
        self._ws = ""  #: trailing whitespace of the content, held until more content comes
        self._ws_before = ""  #: the whitespace held where the call being read opened
        self._after_call = False
        self._said = False  #: whether any content was sent
        self._events: list[Event] = []
        # the arguments being streamed: nesting depth, inside a string, after a backslash
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> list[Event]:
        """Deltas for the next piece of text."""
        if self.family == "none":
            return [{"content": text}] if text else []
        self._buf += text
        if self.family == "llama3":
            self._raw += text
        while self._step():
            pass
        return self._take()

    def finish(self) -> list[Event]:
        """Deltas for whatever was held back, at the end of the answer."""
        if self.family == "none":
            return []
        state, buf = self._state, self._buf
        self._buf = ""
        if state in ("text", "start", "plain"):
            self._content(buf)
        elif state == "head":  # cut off before the call's name: it was text after all
            self._content(self._ws_before + self._opener + buf)
        elif state == "whole":
            self._whole(buf, closed=False)
        elif state in ("l3_head", "l3_whole"):
            self._llama3_whole(buf)
        # "args", "tail": nothing held but the end of a call
        if not self.calls and self._ws:
            self._emit({"content": self._ws})
        self._ws = ""
        return self._take()

    # ---- the states ----------------------------------------------------------------------

    def _step(self) -> bool:
        """Advance through the buffer; False when more text is needed."""
        state = self._state
        if state == "text":
            return self._text()
        if state in ("head", "l3_head"):
            return self._head()
        if state == "args":
            return self._args()
        if state == "tail":
            return self._tail()
        if state == "whole":
            end = self._buf.find(CLOSE)
            if end < 0:
                return False
            body, self._buf = self._buf[:end], self._buf[end + len(CLOSE):]
            self._whole(body, closed=True)
            self._state = "text"
            return True
        if state == "start":
            return self._start()
        if state == "plain":
            self._content(self._buf)
            self._buf = ""
            return False
        if state == "l3_whole":
            return False
        raise AssertionError(state)

    def _text(self) -> bool:
        """hermes content, up to the next opener (a partial one at the end held back)."""
        buf = self._buf
        at, opener = _find_opener(buf)
        if opener:
            self._content(buf[:at])
            self._opened()
            self._opener = opener
            self._buf = buf[at + len(opener):]
            self._state = "head"
            return True
        self._content(buf[:at])
        self._buf = buf[at:]
        return False

    def _start(self) -> bool:
        """The answer's start (or, llama3, what follows a call): a call if it opens with
        ``{`` (llama3: or ``<|python_tag|>``)."""
        tag = PYTHON_TAG if self.family == "llama3" else ""
        if tag and self.calls:  # between calls: separators
            self._buf = self._buf.lstrip(" \t\r\n;")
        head = self._buf.lstrip()
        if not head or (tag.startswith(head) and head != tag):
            return False
        if tag and head.startswith(tag):
            self._buf = head[len(tag):]
            self._state = "l3_head"
        elif head.startswith("{"):
            self._opened()
            self._opener = self._buf[:len(self._buf) - len(head)]
            self._buf = head
            self._state = "l3_head" if tag else "head"
        else:
            self._state = "plain" if tag else "text"
        return True

    def _head(self) -> bool:
        found = _read_head(self._buf, ARGUMENT_KEYS[self.family])
        if found is None:
            return False
        if found is False:  # not the usual shape
            if self._state == "l3_head":
                self._state = "l3_whole"  # read whole at the end
            elif self._opener == OPEN:
                self._state = "whole"  # read whole at the closing tag
            else:  # a code fence or a brace that does not open a call: content
                self._content(self._ws_before + self._opener)
                self._state = "text"
            return True
        name, at = found
        self._announce(name, "")
        self._buf = self._buf[at:]
        self._state = "args"
        self._depth, self._in_string, self._escaped = 0, False, False
        return True

    def _args(self) -> bool:
        """Stream the arguments' JSON up to the end of its outer object."""
        buf = self._buf
        end = None
        for i, ch in enumerate(buf):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = i + 1
                    break
        piece = buf if end is None else buf[:end]
        if piece:
            self._emit({"tool_calls": [{"index": self.calls - 1,
                                        "function": {"arguments": piece}}]})
        self._buf = "" if end is None else buf[end:]
        if end is None:
            return False
        self._state = "tail"
        return True

    def _tail(self) -> bool:
        """After the arguments: the call's closing ``}`` and its closer (``</tool_call>``, the
        fence's closing backticks; llama3: ``;`` before the next call)."""
        buf = self._buf
        closer = {OPEN: CLOSE, "": ""}.get(self._opener.strip(), FENCE)
        if self.family == "hermes" and closer:
            close, again = buf.find(closer), buf.find(OPEN)
            if again >= 0 and (close < 0 or again < close):  # the next call, unclosed before it
                self._buf = buf[again:]
            elif close >= 0:
                self._buf = buf[close + len(closer):]
            else:
                keep = max(_partial_suffix(buf, closer), _partial_suffix(buf, OPEN))
                self._buf = buf[len(buf) - keep:]
                return False
            self._state = "text"
            self._after_call = True
            return True
        rest = buf.lstrip()
        if not rest:
            return False
        if rest.startswith("}"):
            rest = rest[1:]
        self._buf = rest
        self._state = "start" if self.family == "llama3" else "text"
        self._after_call = True
        return True

    # ---- output ----------------------------------------------------------------------------

    def _content(self, text: str) -> None:
        """Content, its trailing whitespace held (it is dropped if a call follows)."""
        if self._after_call and not self._said:  # the answer's content starts here
            text = text.lstrip()
            if not text:
                return
        self._after_call = False
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body):]
        if body:
            self._emit({"content": body})
            self._said = True

    def _opened(self) -> None:
        """A call may start here: the whitespace before it is not content, unless it is not
        a call after all."""
        self._ws_before, self._ws = self._ws, ""

    def _announce(self, name: str, arguments: str) -> None:
        self._emit({"tool_calls": [{"index": self.calls, "id": new_call_id(), "type": "function",
                                    "function": {"name": name, "arguments": arguments}}]})
        self.calls += 1

    def _whole(self, body: str, *, closed: bool) -> None:
        """A call in tags read whole: announced if it parses, else its text is content."""
        call = _call_of(_loads(body.strip()), self.family)
        if call is None:
            self._content(self._ws_before + self._opener + body + (CLOSE if closed else ""))
            return
        self._announce(*call)
        self._after_call = True

    def _llama3_whole(self, rest: str) -> None:
        """llama3 calls read whole at the end: every object a call, or all of it content."""
        text = self._raw.lstrip()
        if text.startswith(PYTHON_TAG):
            text = text[len(PYTHON_TAG):]
        calls = _llama3_calls(text)
        if calls is None:
            # what was announced stays announced; the rest is content
            self._content(self._raw if not self.calls else rest)
            return
        for call in calls[self.calls:]:
            self._announce(*call)

    def _emit(self, event: Event) -> None:
        self._events.append(event)

    def _take(self) -> list[Event]:
        """The deltas so far, adjacent ones of the same kind joined."""
        out: list[Event] = []
        for event in self._events:
            last = out[-1] if out else None
            if last is not None and "content" in event and "content" in last:
                last["content"] += event["content"]
            elif (last is not None and "tool_calls" in event and "tool_calls" in last
                  and "id" not in event["tool_calls"][0]
                  and event["tool_calls"][0]["index"] == last["tool_calls"][-1]["index"]):
                last["tool_calls"][-1]["function"]["arguments"] += \
                    event["tool_calls"][0]["function"]["arguments"]
            else:
                out.append(copy.deepcopy(event))  # the joining changes it
        self._events = []
        return out


#: the code fences a hermes call may come in (the answer's text before the call's object)
FENCE = "```"
FENCE_OPENERS = ("```json\n", "```\n")
OPENERS = (OPEN, *FENCE_OPENERS)


def _find_opener(buf: str) -> tuple[int, str]:
    """(where, opener) of the first call opener in ``buf``; where none is, (where the text
    that may still begin one starts, or ``len(buf)``, "")."""
    i = 0
    while True:
        i = min((j for j in (buf.find("<", i), buf.find("`", i)) if j >= 0), default=-1)
        if i < 0:
            return len(buf), ""
        rest = buf[i:]
        for opener in OPENERS:
            if rest.startswith(opener):
                return i, opener
        if any(opener.startswith(rest) for opener in OPENERS):
            return i, ""
        i += 1


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _read_head(buf: str, keys: tuple[str, ...]) -> tuple[str, int] | bool | None:
    """A call's head ``{"name": "...", "<key>": `` followed by ``{``: (name, where the
    arguments start); None where the text so far may still be one; False where it is not."""
    n = len(buf)
    name = None
    i = 0
    for step in ("{", '"name"', ":", "string", ",", "key", ":", "arguments"):
        while i < n and buf[i] in " \t\r\n":
            i += 1
        if i >= n:
            return None
        if step == "arguments":
            return (name, i) if buf[i] == "{" else False
        if step == "string":
            if buf[i] != '"':
                return False
            j, escaped = i + 1, False
            while j < n and (escaped or buf[j] != '"'):
                escaped = not escaped and buf[j] == "\\"
                j += 1
            if j >= n:
                return None
            name = _loads(buf[i:j + 1])
            if not isinstance(name, str):
                return False
            i = j + 1
            continue
        options = tuple(f'"{k}"' for k in keys) if step == "key" else (step,)
        for option in options:
            piece = buf[i:i + len(option)]
            if piece == option:
                i += len(option)
                break
            if option.startswith(piece):  # the text ends inside it
                return None
        else:
            return False
    raise AssertionError("unreachable")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _call_of(obj: Any, family: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a parsed call object, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in ARGUMENT_KEYS.get(family, ARGUMENT_KEYS["hermes"]):
        if key in obj:
            arguments = obj[key]
            break
    else:
        return None
    if isinstance(arguments, str):  # already JSON text (some models write it so)
        return obj["name"], arguments
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def _llama3_calls(text: str) -> list[tuple[str, str]] | None:
    """llama3: the text as calls separated by ``;`` or whitespace, or None where it is not."""
    decoder = json.JSONDecoder()
    calls, i = [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i >= len(text):
            return calls or None
        if text.startswith(PYTHON_TAG, i):
            i += len(PYTHON_TAG)
            continue
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        call = _call_of(obj, "llama3")
        if call is None:
            return None
        calls.append(call)
