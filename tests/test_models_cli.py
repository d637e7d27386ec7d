"""``edgespec models drafts | list | info`` on hybrid models: what the GGUF header of a file that
is here says (architecture, hybrid, MTP layers), else what the catalog records; and the MTP
drafter explained for a target that carries MTP layers. The fake hub and the synthetic headers
are test_drafts_hybrid's; a plain attention target's report is as it always was."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgespec.cli.main import cli

from .test_drafts_hybrid import LFM2, QWEN35, family_hub, header, local  # noqa: F401 (a fixture)


def run(*args: str):
    result = CliRunner().invoke(cli, ["models", *args])
    assert "Traceback" not in result.output, result.output
    return result


MTP_LINE = ("mtp: unsloth/Qwen3.5-9B-MTP-GGUF carries 1 MTP layer: `--drafter mtp` drafts with the "
            "model's own layers (no second model); the alternative is the draft model qwen3.5-0.8b-q4_k_m "
            "(same tokenizer, `--drafter model`)")


def test_drafts_for_a_qwen35_target_explains_the_mtp_drafter(family_hub):
    res = run("drafts", "unsloth/Qwen3.5-9B-MTP-GGUF")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["DRAFT", "COMPATIBLE", "WHY", "NOT"]
    assert lines[1].split()[:2] == ["qwen3.5-0.8b-q4_k_m", "yes"]  # the pair's draft first
    table = {line.split()[0]: line.split()[1] for line in lines[1:9]}
    assert table["qwen3.5-2b-q4_k_m"] == table["qwen3.5-4b-q4_k_m"] == "yes"
    assert table["qwen2.5-0.5b-instruct-q4_k_m"] == table["qwen2.5-coder-0.5b-instruct-q4_k_m"] == "no"
    assert lines[-3:] == [
        "picked: qwen3.5-0.8b-q4_k_m: the catalog pairs qwen3.5-9b-q4_k_m with it (pair 'qwen3.5-9b')",
        "target: qwen35, hybrid, MTP layers: 1",
        MTP_LINE,
    ]
    data = json.loads(run("drafts", "--json", "unsloth/Qwen3.5-9B-MTP-GGUF").stdout)
    assert data["picked"] == "qwen3.5-0.8b-q4_k_m"
    assert (data["arch"], data["kind"], data["mtp_layers"]) == ("qwen35", "hybrid", 1)
    assert data["mtp_note"] == MTP_LINE.removeprefix("mtp: ")


def test_drafts_for_a_hybrid_target_without_mtp_layers(family_hub, tmp_path):
    target = local(tmp_path, "lfm2.gguf", header("lfm2", LFM2))
    res = run("drafts", str(target))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[-2].startswith("picked: none (lookup drafting only): no catalog draft shares")
    assert lines[-1] == "target: lfm2, hybrid"


def test_drafts_for_a_plain_target_ends_at_the_pick(family_hub):
    res = run("drafts", "qwen2.5-7b-instruct-q4_k_m")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[-2:] == ["", "picked: qwen2.5-0.5b-instruct-q4_k_m: the catalog pairs "
                              "qwen2.5-7b-instruct-q4_k_m with it (pair 'qwen2.5-7b')"]
    assert not [line for line in lines if line.startswith(("target:", "mtp:"))]
    data = json.loads(run("drafts", "--json", "qwen2.5-7b-instruct-q4_k_m").stdout)
    assert (data["arch"], data["kind"], data["mtp_layers"], data["mtp_note"]) == ("qwen2", "attention", 0, None)


def _arch_column(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    start, end = lines[0].index("ARCH"), lines[0].index("PAIRS")
    return {line.split()[0]: line[start:end].strip() for line in lines[1:] if line and not line.startswith("PAIR")}


def test_list_says_hybrid_and_mtp_from_the_catalog_then_from_the_file(family_hub):
    before = _arch_column(run("list").stdout)
    assert before["qwen3.5-9b-q4_k_m"] == "qwen35, hybrid, MTP"
    assert before["qwen3.5-35b-a3b-ud-q4_k_xl"] == "qwen35moe, hybrid, MTP"
    assert before["qwen3.5-0.8b-q4_k_m"] == "qwen35, hybrid"
    assert before["qwen2.5-7b-instruct-q4_k_m"] == ""  # nothing recorded, nothing here
    assert run("pull", "-q", "qwen3.5-9b", "qwen2.5-7b-instruct-q4_k_m").exit_code == 0
    after = _arch_column(run("list").stdout)
    assert after["qwen3.5-9b-q4_k_m"] == "qwen35, hybrid, MTP layers: 1"  # its header says how many
    assert after["qwen3.5-0.8b-q4_k_m"] == "qwen35, hybrid"
    assert after["qwen2.5-7b-instruct-q4_k_m"] == "qwen2"
    models = {m["name"]: m for m in json.loads(run("list", "--json").stdout)["models"]}
    nine = models["qwen3.5-9b-q4_k_m"]
    assert {k: nine[k] for k in ("arch", "kind", "hybrid", "mtp", "mtp_layers", "arch_from")} == {
        "arch": "qwen35", "kind": "hybrid", "hybrid": True, "mtp": True, "mtp_layers": 1, "arch_from": "file"}
    big = models["qwen3.5-27b-q4_k_m"]
    assert {k: big[k] for k in ("arch", "kind", "hybrid", "mtp", "mtp_layers", "arch_from")} == {
        "arch": "qwen35", "kind": "hybrid", "hybrid": True, "mtp": True, "mtp_layers": None,
        "arch_from": "catalog"}
    old = models["qwen3-8b-q4_k_m"]
    assert (old["arch"], old["hybrid"], old["mtp"], old["arch_from"]) == (None, None, None, None)


def test_info(family_hub, tmp_path):
    res = run("info", "qwen3.5-27b-q4_k_m")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        "model:        qwen3.5-27b-q4_k_m",
        "path:         not here",
        "architecture: qwen35 (hybrid: recurrent layers beside attention)",
        "MTP layers:   yes (the catalog's record)",
        "read from:    the catalog",
        "pairs:        qwen3.5-27b (target), qwen3.5-27b-4b (target)",
    ]
    pulled = run("pull", "-q", "unsloth/Qwen3.5-27B-MTP-GGUF").stdout.strip()
    res = run("info", "unsloth/Qwen3.5-27B-MTP-GGUF")
    assert res.stdout.splitlines()[1:5] == [
        "catalog:      qwen3.5-27b-q4_k_m",
        f"path:         {pulled}",
        "architecture: qwen35 (hybrid: recurrent layers beside attention)",
        "MTP layers:   1",
    ]
    lfm2 = local(tmp_path, "lfm2.gguf", header("lfm2", LFM2))
    data = json.loads(run("info", "--json", str(lfm2)).stdout)
    assert {k: data[k] for k in ("catalog", "path", "arch", "kind", "mtp_layers", "pairs")} == {
        "catalog": None, "path": str(lfm2), "arch": "lfm2", "kind": "hybrid", "mtp_layers": 0, "pairs": []}
    missing = run("info", str(tmp_path / "nope.gguf"))
    assert missing.exit_code == 1 and missing.stderr.startswith("error: model file not found")
    unknown = run("info", "qwen9-1t")
    assert unknown.exit_code == 2 and unknown.stderr.startswith("error: unknown model 'qwen9-1t'")


def test_info_of_a_file_without_a_gguf_header(family_hub, tmp_path):
    junk = local(tmp_path, "junk.gguf", b"not a model")
    res = run("info", str(junk))
    assert res.exit_code == 0, res.output
    assert "architecture: unknown" in res.stdout and "MTP layers:   unknown" in res.stdout
