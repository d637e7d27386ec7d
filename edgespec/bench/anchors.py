"""llama.cpp's own tools as anchors for ``edgespec bench --llama-cpp-bin DIR``.

Next to edgespec's runs, the bench can run three programs of the llama.cpp the user built, on
the same model files, prompts and settings, and report their speeds as anchors (llama.cpp's
numbers, not edgespec's):

- ``llama-bench``: plain decoding (its ``tg`` test) of the prompt's ``max_tokens`` at a context
  depth of the prompt's length, the counterpart of edgespec's ``none``. It decodes synthetic
  tokens (it takes no prompt text) and sizes its own context.
- ``llama-speculative-simple``: the draft model proposing k tokens a round
  (``--spec-type draft-simple``), the counterpart of edgespec's ``model``.
- ``llama-lookup``: n-gram prompt lookup proposing up to k tokens, the counterpart of
  edgespec's ``lookup`` (its n-gram sizes are llama.cpp's own, 1 to 4).

All decode greedily with the same threads, offload (``-ngl``, ``-ngld``), batch, context size
and flash attention as edgespec's target (off in its default batch-consistent mode). The two
generating tools read the prompt from a file: the exact text edgespec decodes (for chat
prompts, the model's chat template applied), tokenized as edgespec does it (special tokens
parsed, BOS added). The speeds are the tools' own: tokens decoded over the time after the
prompt's prefill.

The command builders and output parsers are pure functions; :func:`run_anchors` runs the
tools. A missing tool, a failing run or output that cannot be parsed becomes one line in the
result's ``errors``, never an exception. The aggregates (against edgespec's runs) are
:func:`edgespec.bench.run.aggregate_anchors`, with the bench's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .. import config
from ..errors import ConfigError
from ..runtime.kernels import flash_attention_off
from .prompts import BenchPrompt

if TYPE_CHECKING:
    from ..runtime.engine import Engine

LLAMA_BENCH = "llama-bench"
SPECULATIVE_SIMPLE = "llama-speculative-simple"
LOOKUP = "llama-lookup"
#: Each tool and the edgespec configuration it is the llama.cpp counterpart of.
TOOLS: dict[str, str] = {LLAMA_BENCH: "none", SPECULATIVE_SIMPLE: "model", LOOKUP: "lookup"}
#: Longest one tool run may take (a long prompt's prefill with a large model on a slow CPU).
TOOL_TIMEOUT_S = 1800.0

Execute = Callable[[Sequence[str], float], tuple[str, str]]


class AnchorError(Exception):
    """Why one tool run gave no number, in one line."""


@dataclass(frozen=True)
class AnchorSettings:
    """The settings every tool mirrors: edgespec's target (and draft) as loaded."""

    target: Path
    draft: Path | None
    threads: int
    n_ctx: int
    n_batch: int
    n_gpu_layers: int  #: edgespec's meaning: -1 = every layer
    draft_n_gpu_layers: int | None
    flash_attn: str  #: "off" (batch-consistent target) or "auto" (llama.cpp's default)
    draft_length: int
    seed: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target"], d["draft"] = str(self.target), self.draft and str(self.draft)
        return d


@dataclass(frozen=True)
class AnchorPrompt:
    """One bench prompt as the tools get it."""

    id: str
    kind: str
    text: str  #: exactly what edgespec decodes (chat template applied)
    n_tokens: int  #: edgespec's token count of ``text``
    max_tokens: int


@dataclass
class AnchorRun:
    """What one tool run on one prompt measured."""

    tool: str
    prompt: str
    kind: str
    repeat: int
    tokens_per_second: float
    generated: int
    decode_time: float
    prompt_tokens: int | None
    drafted: int | None = None
    accepted: int | None = None
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- settings and prompts from a loaded engine ------------------------------------------------


def flash_attn_mode(options: object) -> str:
    """``-fa`` as edgespec's target runs (:func:`edgespec.runtime.kernels.flash_attention_off`):
    off in batch-consistent mode without a fixed width, else llama.cpp's default (``auto``)."""
    return "off" if flash_attention_off(options) else "auto"


def settings_from_engine(engine: Engine, *, draft_length: int | None,
                         seed: int | None) -> AnchorSettings:
    """The tools' settings from a loaded :class:`edgespec.Engine` (its target's and draft's
    ``ModelOptions``). ``draft_length`` None means edgespec's default for fixed drafters."""
    opts = engine.target.options
    draft = engine.draft
    return AnchorSettings(
        target=Path(engine.target.path), draft=Path(draft.path) if draft is not None else None,
        threads=opts.n_threads, n_ctx=opts.n_ctx, n_batch=opts.n_batch,
        n_gpu_layers=opts.n_gpu_layers,
        draft_n_gpu_layers=draft.options.n_gpu_layers if draft is not None else None,
        flash_attn=flash_attn_mode(opts),
        draft_length=config.DEFAULT_DRAFT_LENGTH if draft_length is None else draft_length,
        seed=seed or 0)


def anchor_prompts(engine: Engine, prompts: Sequence[BenchPrompt],
                   max_tokens: int) -> list[AnchorPrompt]:
    """Each prompt's text as edgespec decodes it (see :meth:`edgespec.Engine.prompt_tokens`)."""
    out = []
    for p in prompts:
        text = p.prompt if p.raw else engine.target.chat_prompt(p.as_messages())
        n = len(engine.prompt_tokens(p.payload, chat=not p.raw))
        out.append(AnchorPrompt(p.id, p.kind, text, n, p.max_tokens or max_tokens))
    return out


# ---- commands ----------------------------------------------------------------------------------


def _ngl(n: int) -> str:
    # llama.cpp's common arguments read -1 as "auto" (fit to free memory): every layer is "all"
    return "all" if n < 0 else str(n)


def _generation_flags(s: AnchorSettings, prompt: AnchorPrompt, prompt_file: Path) -> list[str]:
    """Flags llama-speculative-simple and llama-lookup share (llama.cpp's common arguments)."""
    return [
        "-m", str(s.target), "-f", str(prompt_file), "-n", str(prompt.max_tokens),
        "--temp", "0", "--top-k", "1", "-s", str(s.seed),
        "-c", str(s.n_ctx),
        # the tools prefill the whole prompt in one call: the logical batch must hold it
        "-b", str(max(s.n_ctx, s.n_batch)), "-ub", str(s.n_batch),
        "-t", str(s.threads), "-tb", str(s.threads),
        "-ngl", _ngl(s.n_gpu_layers), "-fa", s.flash_attn,
        "-fit", "off",  # no automatic changes to the offload or context settings
        "--spec-draft-n-max", str(s.draft_length),
    ]


def llama_bench_command(exe: Path, s: AnchorSettings, prompt: AnchorPrompt) -> list[str]:
    """``llama-bench``: one ``tg`` test of the prompt's max_tokens after a context of the
    prompt's length (minus its last token, which edgespec's first round scores), JSON lines."""
    return [str(exe), "-m", str(s.target), "-p", "0", "-n", str(prompt.max_tokens),
            "-d", str(max(prompt.n_tokens - 1, 0)), "-t", str(s.threads),
            # llama-bench parses -ngl itself: a negative count is every layer (its memory
            # fitting, -fitt, is off unless asked), so edgespec's -1 goes as it is, not "all"
            "-ngl", str(s.n_gpu_layers), "-fa", s.flash_attn,
            "-b", str(s.n_batch), "-ub", str(s.n_batch), "-r", "1", "-o", "jsonl"]


def speculative_simple_command(exe: Path, s: AnchorSettings, prompt: AnchorPrompt,
                               prompt_file: Path) -> list[str]:
    """``llama-speculative-simple``: the draft model drafts exactly k tokens a round."""
    if s.draft is None:
        raise AnchorError("no draft model loaded")
    draft_ngl = s.n_gpu_layers if s.draft_n_gpu_layers is None else s.draft_n_gpu_layers
    return [str(exe), *_generation_flags(s, prompt, prompt_file),
            "-md", str(s.draft), "--spec-type", "draft-simple", "--spec-draft-n-min", "0",
            "--spec-draft-p-min", "0", "-ngld", _ngl(draft_ngl)]


def lookup_command(exe: Path, s: AnchorSettings, prompt: AnchorPrompt,
                   prompt_file: Path) -> list[str]:
    """``llama-lookup``: n-gram lookup over the prompt and the output, up to k tokens a round."""
    return [str(exe), *_generation_flags(s, prompt, prompt_file)]


# ---- parsing the tools' output -----------------------------------------------------------------

_SPEED = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds, "
                    r"speed:\s+(-?(?:[\d.]+|inf|nan)) t/s")
_COUNT = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)")


def parse_llama_bench(stdout: str) -> dict:
    """The ``tg`` test of ``llama-bench -o jsonl`` output: tokens_per_second (``avg_ts``),
    generated, decode_time, depth and the build's provenance."""
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("n_gen", 0) > 0 and rec.get("n_prompt", 0) == 0 and "avg_ts" in rec:
            return {"tokens_per_second": float(rec["avg_ts"]), "generated": int(rec["n_gen"]),
                    "decode_time": rec["avg_ns"] / 1e9, "prompt_tokens": int(rec.get("n_depth", 0)),
                    "detail": {k: rec.get(k) for k in ("build_commit", "build_number", "backends",
                                                       "n_gpu_layers", "flash_attn", "n_threads",
                                                       "n_depth", "stddev_ts")}}
    raise AnchorError("no tg test result in its JSON output")


def parse_generation(stderr: str) -> dict:
    """The summary ``llama-speculative-simple`` and ``llama-lookup`` log at the end: prompt
    tokens, tokens decoded and their time and speed, drafted and accepted tokens."""
    speeds = {m[1]: m for m in _SPEED.finditer(stderr)}
    if "decoded" not in speeds:
        raise AnchorError("no 'decoded N tokens in T seconds, speed: S t/s' line in its log")
    counts = {m[1]: int(m[2]) for m in _COUNT.finditer(stderr)}
    dec = speeds["decoded"]
    enc = speeds.get("encoded")
    return {"tokens_per_second": float(dec[4]), "generated": int(dec[2]),
            "decode_time": float(dec[3]), "prompt_tokens": int(enc[2]) if enc else None,
            "drafted": counts.get("n_drafted"), "accepted": counts.get("n_accept"),
            "detail": {"n_draft": counts.get("n_draft")}}


#: llama.cpp's log prefix: time since start and level, e.g. ``0.00.003.379 E ``
_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] +")


def failure_reason(stderr: str, returncode: int) -> str:
    """One line for a failed run: how it ended and its first error line (the cause, before
    the errors that follow from it), else its last line."""
    lines = [_LOG_PREFIX.sub("", ln).strip() for ln in stderr.splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    line = errors[0] if errors else (lines[-1] if lines else "no output")
    if len(line) > 200:
        line = line[:197] + "..."
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}: {line}"
    return f"exit code {returncode}: {line}"


# ---- running -----------------------------------------------------------------------------------


def find_tools(bin_dir: Path) -> dict[str, Path | None]:
    """Each tool's executable in ``bin_dir`` (None where it is missing)."""
    return {name: next((p for p in (bin_dir / name, bin_dir / f"{name}.exe")
                        if p.is_file() and os.access(p, os.X_OK)), None)
            for name in TOOLS}


def check_bin_dir(bin_dir: Path) -> dict[str, Path | None]:
    """:func:`find_tools` of the directory the user named, checked before anything runs:
    :class:`ConfigError` when it is not a directory or holds none of the tools (a wrong
    directory, not a partial build: a missing tool among others is a line in the results)."""
    if not bin_dir.exists():
        raise ConfigError(f"--llama-cpp-bin: {bin_dir} does not exist")
    if not bin_dir.is_dir():
        raise ConfigError(f"--llama-cpp-bin: {bin_dir} is not a directory")
    tools = find_tools(bin_dir)
    if not any(tools.values()):
        raise ConfigError(f"--llama-cpp-bin: {bin_dir} holds none of {', '.join(TOOLS)} "
                          "as an executable (to build them: README, Benchmark)")
    return tools


def run_tool(cmd: Sequence[str], timeout: float = TOOL_TIMEOUT_S) -> tuple[str, str]:
    """Run one tool; its (stdout, stderr). :class:`AnchorError` when it cannot start, runs out
    of time or exits with an error."""
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace",
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except OSError as err:
        raise AnchorError(f"cannot run it: {err.strerror or err}") from None
    except subprocess.TimeoutExpired:
        raise AnchorError(f"no result within {timeout:.0f} s") from None
    if res.returncode != 0:
        raise AnchorError(failure_reason(res.stderr, res.returncode))
    return res.stdout, res.stderr


def tool_command(tool: str, exe: Path, s: AnchorSettings, prompt: AnchorPrompt,
                 prompt_file: Path) -> list[str]:
    """The command line of ``tool`` on ``prompt`` (see the ``*_command`` functions)."""
    if tool == LLAMA_BENCH:
        return llama_bench_command(exe, s, prompt)
    if tool == SPECULATIVE_SIMPLE:
        return speculative_simple_command(exe, s, prompt, prompt_file)
    return lookup_command(exe, s, prompt, prompt_file)


def measure(tool: str, cmd: Sequence[str], prompt: AnchorPrompt, repeat: int,
            execute: Execute = run_tool) -> AnchorRun:
    """Run ``cmd`` and parse its output into an :class:`AnchorRun` (AnchorError when either fails)."""
    stdout, stderr = execute(cmd, TOOL_TIMEOUT_S)
    if tool == LLAMA_BENCH:
        parsed = parse_llama_bench(stdout)
    else:
        parsed = parse_generation(stderr)
        parsed["detail"]["edgespec_prompt_tokens"] = prompt.n_tokens
    return AnchorRun(tool=tool, prompt=prompt.id, kind=prompt.kind, repeat=repeat, **parsed)


def write_prompt(text: str, path: Path) -> Path:
    """Write a prompt for the tools' ``-f``, which drops one trailing newline of the file."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text + "\n")
    return path


def unusable_reason(tool: str, exe: Path | None, settings: AnchorSettings,
                    bin_dir: Path | str) -> str | None:
    """Why ``tool`` cannot run at all here (None: it can)."""
    if exe is None:
        if (Path(bin_dir) / tool).is_file():
            return f"not executable in {bin_dir}"
        return f"not found in {bin_dir}"
    if tool == SPECULATIVE_SIMPLE and settings.draft is None:
        return "no draft model loaded"
    return None


def new_result(bin_dir: Path, settings: AnchorSettings) -> dict:
    """The anchors' part of the results, before anything ran (filled by :func:`run_anchors`)."""
    return {"bin": str(bin_dir), "settings": settings.to_dict(), "tools": {}, "commands": {},
            "runs": [], "errors": []}


def run_anchors(result: dict, tools: Mapping[str, Path | None], settings: AnchorSettings,
                prompts: Sequence[AnchorPrompt], repeats: int, workdir: Path, *,
                execute: Execute = run_tool,
                on_run: Callable[[str, AnchorPrompt, int], None] | None = None) -> dict:
    """Run every available tool on every prompt, ``repeats`` times (per repeat and prompt, the
    tools back to back), adding runs and one-line errors to ``result`` as they come (an
    interruption keeps what was measured). A (tool, prompt) that failed is not run again."""
    result["tools"] = {t: str(p) if p else None for t, p in tools.items()}
    usable = []
    for tool, exe in tools.items():
        reason = unusable_reason(tool, exe, settings, result["bin"])
        if reason is None:
            usable.append((tool, exe))
        else:
            result["errors"].append({"tool": tool, "prompt": None, "error": reason})
    files = {p.id: write_prompt(p.text, workdir / f"prompt-{i}.txt") for i, p in enumerate(prompts)}
    failed: set[tuple[str, str]] = set()
    for r in range(repeats):
        for prompt in prompts:
            for tool, exe in usable:
                if (tool, prompt.id) in failed:
                    continue
                if on_run:
                    on_run(tool, prompt, r)
                cmd = tool_command(tool, exe, settings, prompt, files[prompt.id])
                result["commands"].setdefault(tool, shlex.join(cmd))
                try:
                    result["runs"].append(measure(tool, cmd, prompt, r, execute).to_dict())
                except AnchorError as err:
                    failed.add((tool, prompt.id))
                    result["errors"].append({"tool": tool, "prompt": prompt.id, "error": str(err)})
    return result
