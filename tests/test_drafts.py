"""The draft picked for a target (``edgespec.models.drafts``), on small synthetic GGUF headers and a
test catalog: the catalog pair for a known target however it is named, else the smallest draft
whose tokenizer matches, judged from a record or from the draft's header read off the fake hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli.main import cli
from edgespec.models import download as dl
from edgespec.models import hub
from edgespec.models.catalog import load_catalog
from edgespec.models.drafts import choose_draft, judge_all
from edgespec.models.gguf_meta import tokens_digest
from edgespec.models.hubref import parse_ref

from .fake_hub import FakeHub
from .test_gguf_meta import ARRAY, STRING, U32, gguf

VOCAB = [f"t{i}" for i in range(300)]
OTHER = [f"o{i}" for i in range(300)]


def header(tokens: list[str], *, bos: int = 1, eos: int = 2) -> bytes:
    return gguf([("tokenizer.ggml.model", STRING, "gpt2"),
                 ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
                 ("tokenizer.ggml.bos_token_id", U32, bos),
                 ("tokenizer.ggml.eos_token_id", U32, eos)])


def record(tokens: list[str]) -> str:
    return (f'{{ model = "gpt2", bos = 1, eos = 2, n_tokens = {len(tokens)}, '
            f'sha256 = "{tokens_digest(tokens)}" }}')


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A fake hub and a catalog: a pinned target paired with a pinned draft, a hub target paired
    with a hub draft, and drafts of several sizes and tokenizers."""
    pinned = tmp_path / "pinned-target.gguf"
    pinned.write_bytes(header(VOCAB))
    with FakeHub() as h:
        h.add("acme/HubDraft-GGUF", "d-Q4_K_M.gguf", data=header(VOCAB))
        h.add("acme/HubTarget-GGUF", "t-Q4_K_M.gguf", data=header(VOCAB))
        h.add("acme/Unknown-GGUF", "u-Q4_K_M.gguf", data=header(VOCAB + ["pad1", "pad2"]))
        h.add("acme/Alien-GGUF", "a-Q4_K_M.gguf", data=header(OTHER))
        h.add("acme/Lonely-GGUF", "l-Q4_K_M.gguf", data=header(VOCAB, eos=3))
        catalog = tmp_path / "catalog.toml"
        sha = dl.sha256_file(pinned)
        catalog.write_text(f"""
schema = 2

[models.pinned-target]
file = "pinned-target.gguf"
size = {pinned.stat().st_size}
sha256 = "{sha}"
params = 7.0
[[models.pinned-target.sources]]
kind = "hf"
repo = "acme/Pinned-GGUF"
filename = "pinned-target-Q4_K_M.gguf"

[models.alien-draft]
repo = "acme/AlienDraft-GGUF"
quant = "Q4_K_M"
params = 0.1
tokenizer = {record(OTHER)}

[models.hub-draft]
repo = "acme/HubDraft-GGUF"
quant = "Q4_K_M"
params = 0.5

[models.big-draft]
repo = "acme/BigDraft-GGUF"
quant = "Q4_K_M"
params = 1.0
tokenizer = {record(VOCAB)}

[models.hub-target]
repo = "acme/HubTarget-GGUF"
quant = "Q4_K_M"
params = 8.0

[pairs.p1]
target = "pinned-target"
draft = "big-draft"

[pairs.p2]
target = "hub-target"
draft = "hub-draft"

[pairs.p3]
target = "hub-target"
draft = "alien-draft"
""")
        monkeypatch.setenv("EDGESPEC_CATALOG", str(catalog))
        h.reach(monkeypatch, tmp_path)
        yield h, pinned, tmp_path


def _file(h: FakeHub, repo: str) -> Path:
    return hub.resolve(parse_ref(repo), progress=False).path


def test_known_targets_get_their_pair_however_named(setup):
    h, pinned, _ = setup
    hub_target = _file(h, "acme/HubTarget-GGUF")
    for name in ("hub-target", "acme/hubtarget-gguf", "acme/HubTarget-GGUF:q4_k_m"):
        choice = choose_draft(name, hub_target)
        assert choice.draft == "hub-draft", name  # the first pair naming it
        assert "the catalog pairs hub-target with it (pair 'p2')" in choice.reason
    # a pinned model named by its hub repository and quant
    assert choose_draft("acme/Pinned-GGUF:Q4_K_M", pinned).draft == "big-draft"
    # or a file this machine verified as the pinned model (its sha256 marker)
    entry = load_catalog().model("pinned-target")
    assert dl.verify_file(pinned, entry) is None
    assert choose_draft(str(pinned), pinned).draft == "big-draft"


def test_unknown_target_gets_the_smallest_compatible_draft(setup):
    h, _, _ = setup
    target = _file(h, "acme/Unknown-GGUF")  # the same tokens plus 2 padding entries
    asked = len(h.requests)
    choice = choose_draft("acme/Unknown-GGUF", target)
    assert choice.draft == "hub-draft"
    assert choice.reason.startswith("the smallest catalog draft whose tokenizer matches")
    # alien-draft (smaller) was refused on its record alone; hub-draft judged from its header,
    # read with ranged requests and never downloaded whole
    new = h.requests[asked:]
    assert not [p for _, p, _ in new if "AlienDraft" in p]
    file_gets = [hd for m, p, hd in new if m == "GET" and p.endswith("/d-Q4_K_M.gguf")]
    assert file_gets and all(g.get("range", "").startswith("bytes=") for g in file_gets)
    assert not (hub.HubSettings.from_env().cache_dir / "models--acme--HubDraft-GGUF" / "blobs").exists()
    # the header is remembered by its sha256: judging again asks for listings, not the file
    asked = len(h.requests)
    assert choose_draft("acme/Unknown-GGUF", target).draft == "hub-draft"
    assert not [p for m, p, _ in h.requests[asked:] if m == "GET" and "/resolve/" in p]
    rows = dict(judge_all("acme/Unknown-GGUF", target)[1])
    assert rows == {"alien-draft": "token texts differ within the first 300 tokens",
                    "hub-draft": None, "big-draft": None}


def test_alien_target_gets_the_alien_draft_and_a_lonely_one_none(setup, monkeypatch):
    h, _, _ = setup
    alien = _file(h, "acme/Alien-GGUF")
    assert choose_draft("acme/Alien-GGUF", alien).draft == "alien-draft"
    lonely = _file(h, "acme/Lonely-GGUF")  # the usual tokens, another end-of-text token
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub draft's header cannot be read now
    choice = choose_draft("acme/Lonely-GGUF", lonely)
    assert choice.draft is None
    assert choice.reason == ("no catalog draft shares acme/Lonely-GGUF's tokenizer (gpt2, 300 tokens): "
                             "lookup drafting only")
    rows = dict(judge_all("acme/Lonely-GGUF", lonely)[1])
    assert rows["alien-draft"] == "special tokens differ (BOS/EOS 1/3 vs 1/2)"
    assert rows["hub-draft"].startswith("its tokenizer is unknown here")
    assert rows["big-draft"] == "special tokens differ (BOS/EOS 1/3 vs 1/2)"


def test_the_target_itself_is_never_its_draft(setup, tmp_path):
    h, _, _ = setup
    draft_file = _file(h, "acme/HubDraft-GGUF")  # now cached: a local, verified draft
    rows = dict(judge_all(str(draft_file), draft_file)[1])
    assert rows["hub-draft"] == "it is the target itself"
    assert choose_draft(str(draft_file), draft_file).draft == "big-draft"


def test_cli_models_drafts(setup):
    h, _, _ = setup
    res = CliRunner().invoke(cli, ["models", "drafts", "acme/Unknown-GGUF"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["DRAFT", "COMPATIBLE", "WHY", "NOT"]
    assert [line.split()[:2] for line in lines[1:4]] == [["alien-draft", "no"], ["hub-draft", "yes"],
                                                         ["big-draft", "yes"]]
    assert lines[-1].startswith("picked: hub-draft: the smallest catalog draft")
    res = CliRunner().invoke(cli, ["models", "drafts", "--json", "hub-target"])
    data = json.loads(res.stdout)
    assert data["picked"] == "hub-draft" and data["drafts"][0] == {
        "name": "hub-draft", "compatible": True, "why_not": None}
