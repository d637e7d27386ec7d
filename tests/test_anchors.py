"""``edgespec bench --llama-cpp-bin``: llama.cpp's own tools as anchors. Their real output
(tests/data/llama_tools) is parsed, their command lines mirror edgespec's settings, a missing
or failing tool is one line, and the whole command runs over fake tools and fake models."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec import config
from edgespec.bench.anchors import (
    LLAMA_BENCH,
    LOOKUP,
    SPECULATIVE_SIMPLE,
    AnchorError,
    AnchorPrompt,
    AnchorSettings,
    anchor_prompts,
    failure_reason,
    find_tools,
    flash_attn_mode,
    llama_bench_command,
    lookup_command,
    new_result,
    parse_generation,
    parse_llama_bench,
    run_anchors,
    run_tool,
    settings_from_engine,
    speculative_simple_command,
    write_prompt,
)
from edgespec.bench.prompts import BenchPrompt
from edgespec.bench.report import print_anchors
from edgespec.bench.run import aggregate_anchors
from edgespec.cli import bench as bench_cli
from edgespec.cli.main import cli
from edgespec.runtime.backend import ModelOptions
from edgespec.runtime.engine import Engine

from .fakes import pair

DATA = Path(__file__).parent / "data" / "llama_tools"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def flag(cmd: list[str], name: str) -> str:
    """The value after ``name`` in ``cmd`` (exactly once)."""
    assert cmd.count(name) == 1, (name, cmd)
    return cmd[cmd.index(name) + 1]


SETTINGS = AnchorSettings(target=Path("/m/target.gguf"), draft=Path("/m/draft.gguf"), threads=3,
                          n_ctx=2048, n_batch=256, n_gpu_layers=-1, draft_n_gpu_layers=7,
                          flash_attn="off", draft_length=6, seed=5)
PROMPT = AnchorPrompt("p1", "edit", "<|user|>hi\n<|assistant|>\n", n_tokens=40, max_tokens=64)


# ---- parsing the tools' real output ---------------------------------------------------------------


def test_parse_llama_bench_reads_its_tg_test():
    got = parse_llama_bench(fixture("llama-bench.stdout"))
    assert got["tokens_per_second"] == pytest.approx(64.70875)
    assert got["generated"] == 32 and got["prompt_tokens"] == 37
    assert got["decode_time"] == pytest.approx(0.494523537)
    assert got["detail"]["build_commit"] == "0c1e570" and got["detail"]["n_gpu_layers"] == 0


def test_parse_llama_bench_skips_prompt_tests_and_noise():
    record = json.loads(fixture("llama-bench.stdout"))
    pp = dict(record, n_prompt=512, n_gen=0, avg_ts=900.0)
    text = "loading...\n" + json.dumps(pp) + "\n{not json\n" + json.dumps(record) + "\n"
    assert parse_llama_bench(text)["tokens_per_second"] == pytest.approx(64.70875)
    with pytest.raises(AnchorError, match="no tg test"):
        parse_llama_bench(json.dumps(pp))


def test_parse_speculative_simple_summary():
    got = parse_generation(fixture("llama-speculative-simple.stderr"))
    assert got["tokens_per_second"] == pytest.approx(30.687)
    assert got["generated"] == 37 and got["decode_time"] == pytest.approx(1.206)
    assert got["prompt_tokens"] == 39
    assert got["drafted"] == 29 and got["accepted"] == 29 and got["detail"]["n_draft"] == 4


def test_parse_lookup_summary():
    got = parse_generation(fixture("llama-lookup.stderr"))
    assert got["tokens_per_second"] == pytest.approx(56.882)
    assert got["generated"] == 31 and got["prompt_tokens"] == 63
    assert got["drafted"] == 36 and got["accepted"] == 17  # n_draft (k) is not n_drafted


@pytest.mark.parametrize("name", ["llama-lookup-missing-model.stderr", "llama-bench.stdout"])
def test_output_without_a_summary_is_an_anchor_error(name):
    with pytest.raises(AnchorError, match="no 'decoded"):
        parse_generation(fixture(name))


@pytest.mark.parametrize("name, code, expected", [
    ("llama-lookup-missing-model.stderr", -signal.SIGSEGV,
     "killed by SIGSEGV: gguf_init_from_file: failed to open GGUF file '/tmp/no-such-model.gguf' "
     "(No such file or directory)"),
    ("llama-speculative-simple-removed-flag.stderr", 1,
     'exit code 1: error while handling argument "--draft-max": the argument has been removed. '
     "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
    ("llama-bench-bad-value.stderr", 1, "exit code 1: error: invalid parameter for argument: -fa"),
])
def test_failure_reason_is_the_first_error_line(name, code, expected):
    assert failure_reason(fixture(name), code) == expected


def test_failure_reason_without_an_error_line():
    assert failure_reason("line one\nlast words\n", 3) == "exit code 3: last words"
    assert failure_reason("", 2) == "exit code 2: no output"
    assert len(failure_reason("error " + "x" * 500, 1)) < 220


# ---- command lines ------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [speculative_simple_command, lookup_command])
def test_generation_commands_mirror_the_settings(build, tmp_path):
    cmd = build(Path("/bin/tool"), SETTINGS, PROMPT, tmp_path / "p.txt")
    assert cmd[0] == "/bin/tool"
    assert flag(cmd, "-m") == "/m/target.gguf" and flag(cmd, "-f") == str(tmp_path / "p.txt")
    assert flag(cmd, "-n") == "64"  # the prompt's max_tokens
    assert flag(cmd, "--temp") == "0" and flag(cmd, "--top-k") == "1" and flag(cmd, "-s") == "5"
    assert flag(cmd, "-t") == "3" and flag(cmd, "-tb") == "3"
    assert flag(cmd, "-c") == "2048" and flag(cmd, "-ub") == "256"
    assert flag(cmd, "-b") == "2048"  # the whole prompt in one call, as the tools decode it
    assert flag(cmd, "-ngl") == "all"  # edgespec's -1; llama.cpp's -1 would be "auto" (fit)
    assert flag(cmd, "-fa") == "off" and flag(cmd, "-fit") == "off"
    assert flag(cmd, "--spec-draft-n-max") == "6"


def test_speculative_simple_drafts_with_the_draft_model_exactly_k_tokens():
    cmd = speculative_simple_command(Path("t"), SETTINGS, PROMPT, Path("p.txt"))
    assert flag(cmd, "-md") == "/m/draft.gguf" and flag(cmd, "-ngld") == "7"
    assert flag(cmd, "--spec-type") == "draft-simple"
    assert flag(cmd, "--spec-draft-p-min") == "0" and flag(cmd, "--spec-draft-n-min") == "0"
    assert "-md" not in lookup_command(Path("t"), SETTINGS, PROMPT, Path("p.txt"))


def test_speculative_simple_needs_a_draft_and_follows_the_targets_offload_by_default():
    with pytest.raises(AnchorError, match="no draft model"):
        speculative_simple_command(Path("t"), replace(SETTINGS, draft=None), PROMPT, Path("p.txt"))
    cpu = replace(SETTINGS, n_gpu_layers=0, draft_n_gpu_layers=None)
    cmd = speculative_simple_command(Path("t"), cpu, PROMPT, Path("p.txt"))
    assert flag(cmd, "-ngl") == "0" and flag(cmd, "-ngld") == "0"  # never llama.cpp's auto


def test_llama_bench_decodes_max_tokens_after_the_prompts_length():
    cmd = llama_bench_command(Path("/bin/llama-bench"), SETTINGS, PROMPT)
    assert flag(cmd, "-m") == "/m/target.gguf"
    assert flag(cmd, "-p") == "0" and flag(cmd, "-n") == "64"
    assert flag(cmd, "-d") == "39"  # the prompt but its last token: edgespec's first round scores it
    assert flag(cmd, "-ngl") == "-1"  # llama-bench's own parser: negative = every layer
    assert flag(cmd, "-t") == "3" and flag(cmd, "-fa") == "off"
    assert flag(cmd, "-b") == "256" and flag(cmd, "-ub") == "256"
    assert flag(cmd, "-o") == "jsonl" and flag(cmd, "-r") == "1"


@pytest.mark.parametrize("consistent, width, expected", [
    (True, 0, "off"), (True, 8, "auto"), (False, 0, "auto")])
def test_flash_attention_follows_edgespecs_target(consistent, width, expected):
    opts = ModelOptions(path=Path("m"), batch_consistent=consistent, fixed_width=width)
    assert flash_attn_mode(opts) == expected


def test_a_prompt_file_reads_back_exactly_as_the_tools_read_it(tmp_path):
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    raw = write_prompt(text, tmp_path / "p.txt").read_bytes().decode("utf-8")
    assert raw.removesuffix("\n") == text  # llama.cpp's -f drops one trailing newline


# ---- settings and prompts from an engine ------------------------------------------------------------


def fake_engine(tmp_path, *, target_ngl=-1, draft_ngl=2, width=0):
    target, draft = pair(16, n_ctx=512, draft="perturbed")
    target.path, draft.path = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.options = ModelOptions(path=target.path, n_gpu_layers=target_ngl, n_threads=3,
                                  n_ctx=512, n_batch=128, fixed_width=width)
    draft.options = ModelOptions(path=draft.path, n_gpu_layers=draft_ngl, n_threads=3, n_ctx=512)
    return Engine(target, draft, drafter="hybrid")


def test_settings_come_from_the_loaded_models(tmp_path):
    s = settings_from_engine(fake_engine(tmp_path), draft_length=None, seed=None)
    assert (s.target, s.draft) == (tmp_path / "t.gguf", tmp_path / "d.gguf")
    assert (s.threads, s.n_ctx, s.n_batch) == (3, 512, 128)
    assert (s.n_gpu_layers, s.draft_n_gpu_layers) == (-1, 2)
    assert s.flash_attn == "off" and s.seed == 0
    assert s.draft_length == config.DEFAULT_DRAFT_LENGTH
    s = settings_from_engine(fake_engine(tmp_path, width=4), draft_length=9, seed=3)
    assert s.draft_length == 9 and s.seed == 3 and s.flash_attn == "auto"


def test_prompts_are_the_text_edgespec_decodes(tmp_path):
    engine = fake_engine(tmp_path)
    chat = BenchPrompt("c", "chat", messages=({"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "hello"}))
    one = BenchPrompt("u", "code", prompt="write f", max_tokens=9)
    raw = BenchPrompt("r", "code", prompt="def f(", raw=True)
    got = anchor_prompts(engine, [chat, one, raw], 50)
    assert got[0].text == "<|system|>be brief\n<|user|>hello\n<|assistant|>"
    assert got[1].text == "<|user|>write f\n<|assistant|>" and got[1].max_tokens == 9
    assert got[2].text == "def f(" and got[0].max_tokens == 50
    for p, a in zip([chat, one, raw], got):
        assert a.n_tokens == len(engine.prompt_tokens(p.payload, chat=not p.raw))


# ---- running ------------------------------------------------------------------------------------


def script(path: Path, body: str, *, executable: bool = True) -> Path:
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(0o755 if executable else 0o644)
    return path


def test_find_tools_takes_executables_only(tmp_path):
    script(tmp_path / LLAMA_BENCH, "pass")
    script(tmp_path / LOOKUP, "pass", executable=False)
    assert find_tools(tmp_path) == {LLAMA_BENCH: tmp_path / LLAMA_BENCH,
                                    SPECULATIVE_SIMPLE: None, LOOKUP: None}


def test_run_tool_returns_the_output_or_one_line_why_not(tmp_path):
    ok = script(tmp_path / "ok", "print('out'); print('err', file=sys.stderr)")
    assert run_tool([str(ok)]) == ("out\n", "err\n")
    bad = script(tmp_path / "bad", "print('error: failed to load model x', file=sys.stderr); sys.exit(1)")
    with pytest.raises(AnchorError, match="^exit code 1: error: failed to load model x$"):
        run_tool([str(bad)])
    with pytest.raises(AnchorError, match="cannot run it"):
        run_tool([str(tmp_path / "missing")])
    slow = script(tmp_path / "slow", "import time; time.sleep(10)")
    with pytest.raises(AnchorError, match="no result within 1 s"):
        run_tool([str(slow)], timeout=1)


class FakeTools:
    """Stands in for :func:`run_tool`: the tools' real outputs, or a failure where told."""

    def __init__(self, fail: dict[tuple[str, str], str] | None = None, garbage: set[str] = frozenset()):
        self.fail = fail or {}
        self.garbage = garbage
        self.calls: list[list[str]] = []

    def __call__(self, cmd, timeout):
        self.calls.append(list(cmd))
        tool = Path(cmd[0]).name
        prompt = Path(flag(cmd, "-f")).read_text() if "-f" in cmd else None
        for (t, text), error in self.fail.items():
            if t == tool and (prompt or "").startswith(text):
                raise AnchorError(error)
        if tool in self.garbage:
            return "| model | size |\n", ""
        if tool == LLAMA_BENCH:
            return fixture("llama-bench.stdout"), ""
        return "", fixture(f"{tool}.stderr")


def prompts2():
    return [AnchorPrompt("a", "edit", "alpha", 63, 32), AnchorPrompt("b", "chat", "beta", 39, 32)]


def test_every_tool_runs_every_prompt_each_repeat(tmp_path):
    tools = {t: Path(f"/bin/{t}") for t in (LLAMA_BENCH, SPECULATIVE_SIMPLE, LOOKUP)}
    fake = FakeTools()
    result = run_anchors(new_result(tmp_path, SETTINGS), tools, SETTINGS, prompts2(), 2, tmp_path,
                         execute=fake)
    assert result["errors"] == []
    order = [(r["repeat"], r["prompt"], r["tool"]) for r in result["runs"]]
    assert order == [(r, p, t) for r in (0, 1) for p in "ab"
                     for t in (LLAMA_BENCH, SPECULATIVE_SIMPLE, LOOKUP)]
    assert (tmp_path / "prompt-0.txt").read_text() == "alpha\n"
    assert set(result["commands"]) == set(tools)
    lookup = [r for r in result["runs"] if r["tool"] == LOOKUP][0]
    assert lookup["tokens_per_second"] == pytest.approx(56.882)
    assert lookup["detail"]["edgespec_prompt_tokens"] == 63


def test_missing_failing_and_unparseable_tools_are_one_line_each_and_the_rest_goes_on(tmp_path):
    tools = {LLAMA_BENCH: Path("/bin/llama-bench"), SPECULATIVE_SIMPLE: Path("/bin/llama-speculative-simple"),
             LOOKUP: None}
    fake = FakeTools(fail={(SPECULATIVE_SIMPLE, "alpha"): "exit code 1: error: out of memory"},
                     garbage={LLAMA_BENCH})
    result = run_anchors(new_result(Path("/tools"), SETTINGS), tools, SETTINGS, prompts2(), 3,
                         tmp_path, execute=fake)
    assert result["errors"] == [
        {"tool": LOOKUP, "prompt": None, "error": "not found in /tools"},
        {"tool": LLAMA_BENCH, "prompt": "a", "error": "no tg test result in its JSON output"},
        {"tool": SPECULATIVE_SIMPLE, "prompt": "a", "error": "exit code 1: error: out of memory"},
        {"tool": LLAMA_BENCH, "prompt": "b", "error": "no tg test result in its JSON output"},
    ]
    # a failed (tool, prompt) is not run again; the working one ran every repeat
    assert [(r["tool"], r["prompt"]) for r in result["runs"]] == [(SPECULATIVE_SIMPLE, "b")] * 3
    assert len(fake.calls) == 2 + 2 + 2  # repeat 0: 4 calls, then only speculative-simple on b
    lines = []
    print_anchors({"anchors": {**result, "aggregates": aggregate_anchors(result["runs"], [])}},
                  lines.append)
    text = "\n".join(lines)
    assert "llama-lookup: not found in /tools" in text
    assert "llama-bench failed on a, b: no tg test result in its JSON output" in text
    assert "llama-speculative-simple failed on a: exit code 1: error: out of memory" in text


def test_without_a_draft_model_speculative_simple_is_skipped_with_a_line(tmp_path):
    s = replace(SETTINGS, draft=None, draft_n_gpu_layers=None)
    tools = {SPECULATIVE_SIMPLE: Path("/bin/llama-speculative-simple"), LOOKUP: Path("/bin/llama-lookup")}
    fake = FakeTools()
    result = run_anchors(new_result(tmp_path, s), tools, s, prompts2()[:1], 1, tmp_path, execute=fake)
    assert result["errors"] == [{"tool": SPECULATIVE_SIMPLE, "prompt": None,
                                 "error": "no draft model loaded"}]
    assert [Path(c[0]).name for c in fake.calls] == [LOOKUP]


# ---- aggregation and the table ------------------------------------------------------------------


def anchor_run(tool, prompt, tps, *, drafted=None, accepted=None, kind="edit", tokens=40, ours=40):
    return {"tool": tool, "prompt": prompt, "kind": kind, "repeat": 0, "tokens_per_second": tps,
            "generated": 32, "decode_time": 1.0, "prompt_tokens": tokens, "drafted": drafted,
            "accepted": accepted, "detail": {"edgespec_prompt_tokens": ours}}


def edgespec_row(prompt, config, tps, temperature=0.0):
    return {"prompt": prompt, "config": config, "temperature": temperature, "draft_length": None,
            "tokens_per_second": tps}


def test_anchor_ratios_are_against_greedy_none_on_the_same_prompt():
    runs = [anchor_run(LLAMA_BENCH, "a", 30.0), anchor_run(LLAMA_BENCH, "a", 50.0),
            anchor_run(LLAMA_BENCH, "a", 40.0), anchor_run(LLAMA_BENCH, "b", 10.0),
            anchor_run(LOOKUP, "a", 60.0, drafted=10, accepted=4),
            anchor_run(LOOKUP, "a", 66.0, drafted=10, accepted=6)]
    per_prompt = [edgespec_row("a", "none", 20.0), edgespec_row("a", "lookup", 33.0),
                  edgespec_row("a", "none", 99.0, temperature=0.8), edgespec_row("b", "none", 40.0)]
    agg = aggregate_anchors(runs, per_prompt)
    rows = {(a["prompt"], a["tool"]): a for a in agg["per_prompt"]}
    assert rows["a", LLAMA_BENCH]["tokens_per_second"] == 40.0  # median of the repeats
    assert rows["a", LLAMA_BENCH]["ratio_vs_none"] == pytest.approx(2.0)
    assert rows["b", LLAMA_BENCH]["ratio_vs_none"] == pytest.approx(0.25)
    assert rows["a", LOOKUP]["ratio_vs_none"] == pytest.approx(63.0 / 20.0)
    assert rows["a", LOOKUP]["acceptance_rate"] == pytest.approx(0.5)
    assert rows["a", LOOKUP]["edgespec_config"] == "lookup"
    assert rows["a", LOOKUP]["edgespec_tokens_per_second"] == 33.0
    assert rows["a", LLAMA_BENCH]["acceptance_rate"] is None
    overall = {o["tool"]: o for o in agg["overall"]}
    assert overall[LLAMA_BENCH]["ratio_vs_none"] == pytest.approx(((2.0 * 0.25) ** 0.5))
    assert overall[LLAMA_BENCH]["tokens_per_second"] == pytest.approx(25.0)
    assert aggregate_anchors(runs, [])["per_prompt"][0]["ratio_vs_none"] is None  # no greedy none


def test_the_table_is_labelled_as_llama_cpps_tools_and_flags_a_different_tokenization():
    runs = [anchor_run(LLAMA_BENCH, "a", 40.0),
            anchor_run(SPECULATIVE_SIMPLE, "a", 30.0, drafted=8, accepted=6, tokens=41, ours=40)]
    anchors = {**new_result(Path("/tools"), SETTINGS), "runs": runs,
               "aggregates": aggregate_anchors(runs, [edgespec_row("a", "none", 20.0)])}
    lines: list[str] = []
    print_anchors({"anchors": anchors}, lines.append)
    text = "\n".join(lines)
    assert "llama.cpp's own tools from /tools" in text and "not edgespec runs" in text
    assert "k=6, -ngl -1, -ngld 7, -fa off, -t 3, -c 2048" in text
    [bench_row] = [ln for ln in lines if ln.startswith("a ")]
    assert bench_row.split()[1:4] == [LLAMA_BENCH, "40.0", "2.00x"]
    [spec_row] = [ln for ln in lines if ln.strip().startswith(SPECULATIVE_SIMPLE) and "75%" in ln]
    assert "1.50x" in spec_row and "model" in spec_row
    assert f"{SPECULATIVE_SIMPLE} on a: the prompt is 41 tokens for it, 40 for edgespec" in text


# ---- the whole command over fake models and fake tools --------------------------------------------


FAKE_TOOL = """
import json, os
log = os.path.join(os.path.dirname(sys.argv[0]), "calls.jsonl")
args = sys.argv[1:]
prompt = open(args[args.index("-f") + 1], encoding="utf-8").read() if "-f" in args else None
with open(log, "a") as f:
    f.write(json.dumps({"tool": os.path.basename(sys.argv[0]), "args": args, "prompt": prompt}) + "\\n")
"""


def fake_tool_dir(tmp_path: Path, tools=(LLAMA_BENCH, SPECULATIVE_SIMPLE, LOOKUP), fail=()) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        if tool in fail:
            body = FAKE_TOOL + "print('error: unknown argument: -fit', file=sys.stderr); sys.exit(1)"
        elif tool == LLAMA_BENCH:
            body = FAKE_TOOL + f"sys.stdout.write(open({str(DATA / 'llama-bench.stdout')!r}).read())"
        else:
            body = FAKE_TOOL + f"sys.stderr.write(open({str(DATA / (tool + '.stderr'))!r}).read())"
        script(bin_dir / tool, body)
    return bin_dir


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    """`edgespec bench` over fake models carrying real-looking options; short prompts."""
    engine = fake_engine(tmp_path)
    closed = []
    engine_close = engine.close

    def close():
        closed.append(True)
        engine_close()

    engine.close = close

    @contextlib.contextmanager
    def load(opts):
        with engine:
            yield engine

    monkeypatch.setattr(bench_cli, "_load", load)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"id": "e1", "kind": "edit", "prompt": "abcabcabcabcabc abcabcabc"}\n'
        '{"id": "t1", "kind": "chat", "max_tokens": 5, "messages": [{"role": "system", '
        '"content": "hi"}, {"role": "user", "content": "hello there"}]}\n')

    def invoke(*args):
        return CliRunner().invoke(cli, ["bench", "--prompts", str(prompts), "--json",
                                        str(tmp_path / "r.json"), "--drafters", "none,lookup",
                                        "-n", "8", "--no-warmup", *args])

    return invoke, tmp_path, engine, closed


def calls(bin_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (bin_dir / "calls.jsonl").read_text().splitlines()]


def test_bench_runs_llama_cpps_tools_on_the_same_prompts_and_reports_anchors(fake_bench):
    invoke, tmp, engine, closed = fake_bench
    bin_dir = fake_tool_dir(tmp)
    res = invoke("--llama-cpp-bin", str(bin_dir), "--repeats", "2", "--seed", "3")
    assert res.exit_code == 0, res.output
    assert "anchors: llama.cpp's own tools" in res.output and "anchors overall" in res.output
    doc = json.loads((tmp / "r.json").read_text())
    anchors = doc["anchors"]
    assert anchors["errors"] == [] and len(anchors["runs"]) == 2 * 2 * 3
    assert doc["settings"]["anchors"]["n_gpu_layers"] == -1
    assert doc["settings"]["llama_cpp_bin"] == str(bin_dir)
    none = {a["prompt"]: a["tokens_per_second"] for a in doc["aggregates"]["per_prompt"]
            if a["config"] == "none"}
    for row in anchors["aggregates"]["per_prompt"]:
        assert row["ratio_vs_none"] == pytest.approx(row["tokens_per_second"] / none[row["prompt"]])
    seen = calls(bin_dir)
    assert len(seen) == 12
    chat = [c for c in seen if c["tool"] == LOOKUP and "-n" in c["args"]
            and c["args"][c["args"].index("-n") + 1] == "5"][0]
    text = engine.target.chat_prompt([{"role": "system", "content": "hi"},
                                      {"role": "user", "content": "hello there"}])
    assert chat["prompt"] == text + "\n"  # the template applied; -f drops the last newline
    for c in seen:
        ngl = c["args"][c["args"].index("-ngl") + 1]
        assert ngl == ("-1" if c["tool"] == LLAMA_BENCH else "all")
        assert c["args"][c["args"].index("-t") + 1] == "3"
        assert c["args"][c["args"].index("-fa") + 1] == "off"
    spec = next(c["args"] for c in seen if c["tool"] == SPECULATIVE_SIMPLE)
    assert flag(spec, "-ngld") == "2" and flag(spec, "-s") == "3"


def test_the_tools_run_after_the_models_are_unloaded(fake_bench, monkeypatch):
    invoke, tmp, engine, closed = fake_bench
    bin_dir = fake_tool_dir(tmp)
    seen_closed = []
    from edgespec.bench import anchors as anchors_mod

    real = anchors_mod.run_anchors

    def spy(*args, **kwargs):
        seen_closed.append(bool(closed))
        return real(*args, **kwargs)

    monkeypatch.setattr(anchors_mod, "run_anchors", spy)
    res = invoke("--llama-cpp-bin", str(bin_dir), "--repeats", "1")
    assert res.exit_code == 0, res.output
    assert seen_closed == [True]


def test_a_missing_or_failing_tool_is_one_line_and_the_bench_goes_on(fake_bench):
    invoke, tmp, _, _ = fake_bench
    bin_dir = fake_tool_dir(tmp, tools=(LLAMA_BENCH, LOOKUP), fail=(LOOKUP,))
    res = invoke("--llama-cpp-bin", str(bin_dir), "--repeats", "1")
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert f"llama-speculative-simple: not found in {bin_dir}" in res.output
    assert "llama-lookup failed on e1, t1: exit code 1: error: unknown argument: -fit" in res.output
    doc = json.loads((tmp / "r.json").read_text())
    assert {r["tool"] for r in doc["anchors"]["runs"]} == {LLAMA_BENCH}
    assert {r["config"] for r in doc["runs"]} == {"none", "lookup"}


@pytest.mark.parametrize("where, message", [
    ("missing", "does not exist"),
    ("file", "is not a directory"),
    ("empty", "holds none of llama-bench, llama-speculative-simple, llama-lookup"),
    ("not-executable", "holds none of"),
    ("tools", "drop --no-runs"),
])
def test_a_bad_llama_cpp_bin_is_one_error_line_before_any_model_loads(fake_bench, monkeypatch,
                                                                      where, message):
    invoke, tmp, _, _ = fake_bench
    bin_dir = tmp / where
    if where == "file":
        bin_dir.write_text("")
    elif where == "empty":
        bin_dir.mkdir()
    elif where == "not-executable":
        bin_dir.mkdir()
        script(bin_dir / LLAMA_BENCH, "pass", executable=False)
    elif where == "tools":
        bin_dir = fake_tool_dir(tmp)
    loaded = []
    monkeypatch.setattr(bench_cli, "_load", lambda opts: loaded.append(opts))
    extra = ["--no-runs", "--sweep"] if where == "tools" else []
    res = invoke("--llama-cpp-bin", str(bin_dir), *extra)
    assert res.exit_code == 2 and loaded == []
    [line] = res.output.strip().splitlines()
    assert line.startswith("error: ") and message in line


def test_a_tool_that_is_not_executable_is_named_so(tmp_path):
    script(tmp_path / LOOKUP, "pass", executable=False)
    tools = {LLAMA_BENCH: None, LOOKUP: None}
    result = run_anchors(new_result(tmp_path, SETTINGS), tools, SETTINGS, [], 1, tmp_path,
                         execute=FakeTools())
    assert result["errors"] == [
        {"tool": LLAMA_BENCH, "prompt": None, "error": f"not found in {tmp_path}"},
        {"tool": LOOKUP, "prompt": None, "error": f"not executable in {tmp_path}"}]


# ---- the real tools -------------------------------------------------------------------------------

REAL_BIN = Path(os.environ.get("EDGESPEC_LLAMA_CPP_BIN",
                               Path.home() / ".cache" / "edgespec" / "llama-tools" / "bin"))


@pytest.mark.real
@pytest.mark.skipif(not all(find_tools(REAL_BIN).values()),
                    reason=f"llama.cpp's tools are not built in {REAL_BIN}")
def test_the_real_tools_accept_the_commands_and_tokenize_as_edgespec(tiny_engine, tmp_path):
    # one thread: this checks that the tools take the flags and read the prompt as edgespec does
    s = replace(settings_from_engine(tiny_engine, draft_length=4, seed=0), threads=1)
    prompts = anchor_prompts(tiny_engine, [BenchPrompt("c", "chat", prompt="Name three colors.")], 8)
    result = run_anchors(new_result(REAL_BIN, s), find_tools(REAL_BIN), s, prompts, 1, tmp_path)
    assert result["errors"] == []
    assert {r["tool"] for r in result["runs"]} == {LLAMA_BENCH, SPECULATIVE_SIMPLE, LOOKUP}
    for r in result["runs"]:
        assert r["tokens_per_second"] > 0 and r["generated"] > 0
        if r["tool"] != LLAMA_BENCH:
            assert r["prompt_tokens"] == prompts[0].n_tokens
