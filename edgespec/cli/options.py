"""What the ``edgespec`` subcommands share: click settings and options, loading an engine from
them, reading the prompt, and turning user errors into one ``error:`` line."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from .. import config
from ..errors import ConfigError, EdgespecError, read_text_file
from ..runtime import sources
from ..runtime.options import LoadOptions, one_constraint, validate_draft_length
from ..runtime.rpc import DEFAULT_RPC_TIMEOUT_S

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Print :class:`EdgespecError` as ``error: <message>`` and exit with its code, no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EdgespecError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


class Checked(click.ParamType):
    """An integer option checked by the engine's own validator (``check``: the value, or a
    ConfigError), so the command line accepts what the API and the server do."""

    name = "integer"

    def __init__(self, check: Callable[[int], int | None]) -> None:
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.INT.convert(value, param, ctx)
        try:
            return self.check(number)
        except ConfigError as err:
            self.fail(str(err), param, ctx)


def model_options(func):
    """Options shared by every command that loads models."""
    options = [
        click.option("--pair", default=config.DEFAULT_PAIR, show_default=True,
                     help="Catalog pair giving target and draft (see `edgespec models list`)."),
        click.option("--target", "-m", metavar="MODEL",
                     help="Target model (overrides --pair): a catalog name, a hub reference "
                          "OWNER/REPO[:QUANT] (Q4_K_M by default) or OWNER/REPO/FILE.gguf, or a "
                          "GGUF path."),
        click.option("--draft", "-d", "draft", metavar="MODEL",
                     help="Draft model, given as --target is (default: the pair's draft; with "
                          "--target, the catalog draft that fits it: see `edgespec models drafts`)."),
        click.option("--drafter", type=click.Choice(sources.NAMES), default=config.DEFAULT_DRAFTER,
                     show_default=True, help="Who proposes tokens: `auto` picks plain decoding, lookup or the draft "
                          "model (and k) each round by measured cost; `none` is plain decoding."),
        click.option("--draft-length", "-k", type=Checked(validate_draft_length), default=None,
                     help=f"Tokens drafted per round, 0-{config.MAX_DRAFT_LENGTH} [default: auto chooses 0-"
                          f"{config.AUTO_MAX_DRAFT_LENGTH} each round; other drafters "
                          f"{config.DEFAULT_DRAFT_LENGTH}]. With auto, a cap."),
        click.option("--max-ngram", type=click.IntRange(1, 64), default=config.DEFAULT_MAX_NGRAM,
                     show_default=True, help="Longest n-gram prompt lookup matches."),
        click.option("--min-ngram", type=click.IntRange(1, 64), default=config.DEFAULT_MIN_NGRAM,
                     show_default=True, help="Shortest n-gram prompt lookup accepts as a match."),
        click.option("--draft-window", type=click.IntRange(0), default=config.DRAFT_WINDOW,
                     show_default=True,
                     help="A sampled draft model proposes from its this many most likely tokens "
                          "(exact for any window; 0 = its whole row, slower)."),
        click.option("--ngl", "n_gpu_layers", type=click.IntRange(-1), default=None,
                     help="Target layers offloaded to the GPU or the --rpc workers (-1 = all) "
                          "[default: 0; all with --rpc]."),
        click.option("--draft-ngl", "draft_n_gpu_layers", type=click.IntRange(-1), default=None,
                     help="Draft layers offloaded (default: all with --draft-rpc, none when the "
                          "target is on workers, else as --ngl)."),
        click.option("--rpc", metavar="HOST:PORT[,...]", default=None,
                     help="Put the target's layers on these `edgespec worker` processes "
                          "(llama.cpp RPC: trusted networks only)."),
        click.option("--draft-rpc", metavar="HOST:PORT[,...]", default=None,
                     help="Put the draft's layers on these workers (default: the draft runs here)."),
        click.option("--tensor-split", metavar="W[,W...]", default=None,
                     help="Share the target's offloaded layers by weight: the --rpc workers' "
                          "devices in order, then this machine's GPUs (see `edgespec info --rpc`)."),
        click.option("--rpc-timeout", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULT_RPC_TIMEOUT_S,
                     show_default=True,
                     help="Seconds one call to the workers may take before giving up on them."),
        click.option("--threads", "-t", type=click.IntRange(1), default=None,
                     help=f"CPU threads (default: {config.default_threads()}, one per core)."),
        click.option("--ctx", "n_ctx", type=click.IntRange(16), default=config.DEFAULT_N_CTX,
                     show_default=True, help="Context window in tokens (prompt + answer)."),
        click.option("--fast-kernels", is_flag=True,
                     help="Use llama.cpp's fastest CPU kernels even though their logits depend on "
                          "batch size (greedy output may then differ from plain decoding at "
                          "near-ties)."),
        click.option("--fixed-width", type=click.IntRange(0, config.MAX_FIXED_WIDTH), default=0,
                     metavar="W",
                     help="Make every target call that reads logits exactly W tokens wide (pads "
                          "removed after it): greedy speculation then equals plain decoding bit for "
                          "bit on a GPU too, where kernels depend on batch width; each plain step "
                          "costs a W-wide call. 0 = off [default: 0]."),
        click.option("--exact", is_flag=True,
                     help="Greedy speculation equal to plain decoding bit for bit wherever the "
                          "target runs: on this CPU it already is; with layers on a GPU or RPC "
                          f"workers this is --fixed-width {config.EXACT_FIXED_WIDTH} (a plain "
                          "step then costs a wide call: README, Exactness)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's own log."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def sampling_options(func):
    options = [
        click.option("--temperature", "--temp", type=float, default=config.DEFAULT_TEMPERATURE,
                     show_default=True, help="0 = greedy."),
        click.option("--top-k", type=int, default=config.DEFAULT_TOP_K, show_default=True,
                     help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=config.DEFAULT_TOP_P, show_default=True,
                     help="Nucleus mass in (0, 1] (1 = off)."),
        click.option("--min-p", type=float, default=config.DEFAULT_MIN_P, show_default=True,
                     help="Drop tokens below this fraction of the top probability (0 = off)."),
        click.option("--seed", type=int, default=None, help="Seed for reproducible sampling."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def penalty_options(func):
    """Penalties and logit bias (llama.cpp's meaning): what :func:`make_sampling` adds to the
    sampling settings. Commands that take them: ``complete``, ``chat``, ``serve``, ``verify``."""
    options = [
        click.option("--presence-penalty", type=float, default=0.0, show_default=True,
                     help="Lower the logit of each token among the last --repeat-last-n by this, "
                          "in [-2, 2] (OpenAI's; 0 = off)."),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
                     help="Lower the logit of each token among the last --repeat-last-n by this "
                          "times its count there, in [-2, 2] (OpenAI's; 0 = off)."),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True,
                     help="Divide a repeated token's positive logit by this, multiply a negative "
                          "one (llama.cpp's; 1 = off)."),
        click.option("--repeat-last-n", "penalty_last_n", type=int,
                     default=config.DEFAULT_PENALTY_LAST_N, show_default=True,
                     help="Tokens the penalties look back over (-1 = the whole context, 0 = off)."),
        click.option("--logit-bias", "logit_bias", multiple=True, metavar="TOKEN=BIAS",
                     help="Add BIAS (-100..100) to token id TOKEN's logit (repeatable; -100 "
                          "bans it)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def constraint_options(func):
    """Constrained output: ``--schema``, ``--json-object``, ``--grammar``; :func:`make_constraint`
    reads them. Commands that take them: ``complete``, ``chat``, ``verify``."""
    options = [
        click.option("--schema", "schema", metavar="FILE|JSON", default=None,
                     help="Answer as JSON matching this JSON schema: a file, or the schema "
                          "itself as JSON text."),
        click.option("--json-object", is_flag=True, help="Answer as one JSON object."),
        click.option("--grammar", "grammar", metavar="FILE", default=None,
                     help="Answer matching this GBNF grammar (llama.cpp's format): a file, or "
                          "the grammar itself (text with '::=')."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_engine(opts: dict, *, progress: bool = True):
    """Load an Engine from the shared model options."""
    from ..runtime.backend import set_verbose
    from ..runtime.engine import Engine

    options = LoadOptions.from_cli(opts)  # checked before llama.cpp's log is switched on
    set_verbose(opts["verbose"])
    return Engine.load(options=options, progress=progress)


def make_sampling(opts: dict):
    """SamplingParams from :func:`sampling_options` and, where the command has them,
    :func:`penalty_options`; a ConfigError naming the first bad value."""
    from ..core.sampling import SamplingParams

    shaping = {name: opts[name] for name in ("presence_penalty", "frequency_penalty",
                                             "repeat_penalty", "penalty_last_n") if name in opts}
    bias = parse_logit_bias(opts.get("logit_bias", ()))
    try:
        return SamplingParams(temperature=opts["temperature"], top_k=opts["top_k"],
                              top_p=opts["top_p"], min_p=opts["min_p"], seed=opts["seed"],
                              logit_bias=bias, **shaping)
    except ConfigError as err:  # (its messages start with the field's name)
        message = str(err)
        if message.startswith("penalty_last_n "):  # the one field named unlike its option
            raise ConfigError("--repeat-last-n" + message[len("penalty_last_n"):]) from None
        raise


def parse_logit_bias(items) -> dict[int, float]:
    """``--logit-bias TOKEN=BIAS`` values as {token id: bias} (ranges are checked by
    SamplingParams)."""
    bias: dict[int, float] = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            if not sep or not token.strip().isdigit():
                raise ValueError
            bias_value = float(value)
        except ValueError:
            raise ConfigError(f"--logit-bias takes TOKEN=BIAS, a token id and a number "
                              f"(e.g. 13=-100), got {item!r}") from None
        if int(token) in bias:
            raise ConfigError(f"--logit-bias names token {int(token)} twice")
        bias[int(token)] = bias_value
    return bias


def make_constraint(opts: dict):
    """The :class:`~edgespec.runtime.constraint.Constraint` that :func:`constraint_options`
    ask for, or None; checked (compiled without a vocabulary) before any model loads, so a
    missing file, bad JSON, a bad schema or a bad grammar is one ConfigError naming it."""
    from ..runtime.constraint import Constraint, check

    # (which one, before any file is read)
    chosen = one_constraint([("--schema", opts.get("schema")),
                             ("--json-object", opts.get("json_object") or None),
                             ("--grammar", opts.get("grammar"))])
    if chosen is None:
        return None
    flag, value = chosen
    if flag == "--schema":
        constraint = Constraint.json_schema(_schema(value))
    elif flag == "--grammar":
        constraint = Constraint.grammar(_grammar(value))
    else:
        constraint = Constraint.json_object()
    try:
        check(constraint)
    except ConfigError as err:
        raise ConfigError(f"{flag}: {_one_line(str(err))}") from None
    return constraint


def _schema(value: str) -> dict:
    """``--schema``'s JSON schema: inline JSON text (it starts with ``{``) or a file's."""
    if value.lstrip().startswith("{"):
        text, where = value, "the schema given"
    else:
        where = value
        text = _read_text(value, "--schema", "a JSON schema, or the schema itself as JSON")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--schema: {where} is not valid JSON: {err}") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"--schema: a JSON schema is a JSON object, {where} holds "
                          f"{type(schema).__name__}")
    return schema


def _grammar(value: str) -> str:
    """``--grammar``'s GBNF text: a file's, or the value itself where it holds a rule."""
    if "::=" in value and not Path(value).is_file():
        return value
    text = _read_text(value, "--grammar", "a GBNF grammar, or the grammar itself")
    if not text.strip():
        raise ConfigError(f"--grammar: {value} is empty")
    return text


def _read_text(path: str, flag: str, what: str) -> str:
    return read_text_file(path, flag, f"give a file holding {what}")


def _one_line(message: str) -> str:
    """A message on one line (llguidance's may span several)."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or standard input when it is absent or ``-``."""
    if prompt is not None and prompt != "-":
        return prompt
    if sys.stdin.isatty():
        raise ConfigError("no prompt: pass it as an argument or on standard input")
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"standard input is not valid UTF-8 (byte {err.start})") from None
