"""Hub references against a fake hub on 127.0.0.1 (``tests/fake_hub.py``), reached through
``HF_ENDPOINT`` exactly as the real one would be: listing, quant choice, download into the hub
cache, sha256 check, resume, gated repositories, offline use, and the CLI's one-line errors.
Small synthetic files here; the real tiny model loads from the hub in ``test_hub_real.py``."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.errors import DownloadError, ModelError
from edgespec.models import hub
from edgespec.models.hubref import HubRef, parse_ref

from .fake_hub import FakeHub

REPO = "acme/Tiny-GGUF"
#: Larger than huggingface-hub's 10 MiB read chunk, so that a cut after 12 MB has written one
BIG = os.urandom(24_000_000)


@pytest.fixture
def fake_hub():
    with FakeHub() as h:
        h.add(REPO, "tiny-Q4_K_M.gguf", data=BIG)
        h.add(REPO, "tiny-Q8_0.gguf", data=b"q8" * 500)
        h.add(REPO, "README.md", data=b"# tiny")
        h.add("acme/Split-GGUF", "s-Q4_K_M-00001-of-00002.gguf", data=b"a" * 1000)
        h.add("acme/Split-GGUF", "s-Q4_K_M-00002-of-00002.gguf", data=b"b" * 1000)
        h.add("acme/Bad-GGUF", "bad-Q4_K_M.gguf", data=b"z" * 1000, sha256="0" * 64)
        h.add("acme/Docs", "README.md", data=b"no weights")
        h.gate("acme/Gated-GGUF")
        h.add("acme/Gated-GGUF", "g-Q4_K_M.gguf", data=b"g" * 100)
        yield h


@pytest.fixture
def env(tmp_path, monkeypatch, fake_hub):
    fake_hub.reach(monkeypatch, tmp_path)
    return tmp_path


def _get(ref: str, **kw):
    return hub.resolve(parse_ref(ref), progress=False, **kw)


def _blobs(tmp_path: Path, repo: str) -> list[Path]:
    d = tmp_path / "hub" / ("models--" + repo.replace("/", "--")) / "blobs"
    return sorted(d.iterdir()) if d.exists() else []


def test_pull_by_quant_default_and_exact_file(env, fake_hub):
    q8 = _get(f"{REPO}:q8_0")
    assert q8.path.read_bytes() == b"q8" * 500 and q8.path.name == "tiny-Q8_0.gguf"
    default = _get(REPO)
    assert default.path.name == "tiny-Q4_K_M.gguf"
    assert hashlib.sha256(default.path.read_bytes()).hexdigest() == hashlib.sha256(BIG).hexdigest()
    assert _get(f"{REPO}/tiny-Q8_0.gguf").path == q8.path
    # the standard hub cache: a snapshot link to a blob named by its sha256
    assert q8.path.is_relative_to(env / "hub") and Path(os.path.realpath(q8.path)).name == \
        hashlib.sha256(b"q8" * 500).hexdigest()


def test_split_gguf_gives_all_parts_side_by_side(env):
    got = _get("acme/Split-GGUF")
    assert [p.name for p in got.paths] == ["s-Q4_K_M-00001-of-00002.gguf", "s-Q4_K_M-00002-of-00002.gguf"]
    assert got.path == got.paths[0] and got.paths[0].parent == got.paths[1].parent


def test_wrong_sha256_is_refused_and_nothing_stays(env):
    with pytest.raises(DownloadError, match="bad-Q4_K_M.gguf failed verification: sha256 mismatch.*removed"):
        _get("acme/Bad-GGUF")
    assert _blobs(env, "acme/Bad-GGUF") == []
    snap = env / "hub" / "models--acme--Bad-GGUF" / "snapshots"
    assert not [p for p in snap.rglob("*") if p.is_file() or p.is_symlink()]
    # and offline, nothing is found either
    with pytest.raises(ModelError, match="not in the hub cache"):
        hub.resolve(parse_ref("acme/Bad-GGUF"), progress=False, download=False)


def test_interrupted_download_is_resumed_with_a_range_request(env, fake_hub):
    fake_hub.cut_after["tiny-Q4_K_M.gguf"] = 12_345_678
    got = _get(REPO)
    assert got.path.read_bytes() == BIG
    gets = fake_hub.downloads("tiny-Q4_K_M.gguf")
    assert len(gets) == 2 and "range" not in gets[0]
    # the second request asks only for what had not been written (whole 10 MiB chunks)
    start = int(re.fullmatch(r"bytes=(\d+)-", gets[1]["range"]).group(1))
    assert 0 < start <= 12_345_678


def test_missing_quant_lists_the_available_ones(env):
    with pytest.raises(ModelError, match=f"{REPO} on the hub has no Q5_K_M GGUF; it has: Q4_K_M, Q8_0"):
        _get(f"{REPO}:Q5_K_M")


def test_unknown_repo_and_repo_without_gguf(env):
    with pytest.raises(ModelError, match="repository acme/Nope not found on the hub"):
        _get("acme/Nope")
    with pytest.raises(ModelError, match="acme/Docs on the hub has no GGUF file"):
        _get("acme/Docs")


def test_gated_repo_needs_a_token(env, monkeypatch, fake_hub):
    with pytest.raises(DownloadError, match="acme/Gated-GGUF is gated: .*set HF_TOKEN"):
        _get("acme/Gated-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(DownloadError, match="token in HF_TOKEN has no access"):
        _get("acme/Gated-GGUF")
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    assert _get("acme/Gated-GGUF").path.read_bytes() == b"g" * 100


def test_offline_uses_the_cache_and_asks_nothing(env, monkeypatch, fake_hub):
    online = _get(f"{REPO}:Q8_0")
    asked = len(fake_hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _get(f"{REPO}:Q8_0").path == online.path
    assert _get(f"{REPO}/tiny-Q8_0.gguf").path == online.path
    assert len(fake_hub.requests) == asked
    with pytest.raises(ModelError, match=f"{REPO} in the hub cache has no Q4_K_M GGUF; it has: Q8_0;"
                                         r".*\(HF_HUB_OFFLINE is set\)"):
        _get(f"{REPO}:Q4_K_M")
    # with no quant named, the only cached GGUF of the repository is what offline has to offer
    assert _get(REPO).path == online.path
    with pytest.raises(ModelError, match="acme/Split-GGUF is not in the hub cache .* HF_HUB_OFFLINE is set"):
        _get("acme/Split-GGUF")


def test_offline_cache_is_still_verified(env, monkeypatch):
    path = _get(f"{REPO}:Q8_0").path
    blob = Path(os.path.realpath(path))
    os.chmod(blob, 0o644)
    blob.write_bytes(b"Q8" * 500)  # same size, other bytes: the marker no longer vouches (mtime)
    os.utime(blob, ns=(1, 1))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="sha256 mismatch.*removed it from the cache"):
        _get(f"{REPO}:Q8_0")
    assert not blob.exists()


def test_unreachable_hub_falls_back_to_the_cache(env, monkeypatch, capsys):
    path = _get(f"{REPO}:Q8_0").path
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    got = hub.resolve(parse_ref(f"{REPO}:Q8_0"), progress=True)
    assert got.path == path
    assert "hub unreachable" in capsys.readouterr().err
    with pytest.raises(DownloadError, match="cannot fetch acme/Split-GGUF: hub unreachable"):
        _get("acme/Split-GGUF")


def test_is_cached_never_hashes_or_asks(env, fake_hub):
    ref = HubRef(REPO, "Q8_0")
    assert hub.is_cached(ref) is None
    path = _get(str(ref)).path
    asked = len(fake_hub.requests)
    assert hub.is_cached(ref) == path and len(fake_hub.requests) == asked


def _cli(*args: str, env_vars: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, text=True,
                          env={**os.environ, **env_vars}, timeout=120)


def test_cli_pull_and_path_and_one_line_errors(env, fake_hub):
    env_vars = {"HF_ENDPOINT": fake_hub.url, "HF_HUB_CACHE": str(env / "hub"),
                "EDGESPEC_CACHE": str(env / "edgespec")}
    done = _cli("models", "pull", "-q", f"{REPO}:Q8_0", "acme/Split-GGUF", env_vars=env_vars)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [Path(p).name for p in lines] == ["tiny-Q8_0.gguf", "s-Q4_K_M-00001-of-00002.gguf"]
    done = _cli("models", "path", f"{REPO}:Q8_0", env_vars={**env_vars, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and done.stdout.strip() == lines[0]
    for ref, expected in [
        (f"{REPO}:Q2_K", f"error: {REPO} on the hub has no Q2_K GGUF; it has: Q4_K_M, Q8_0"),
        ("acme/Nope", "error: repository acme/Nope not found on the hub"),
        ("acme/Gated-GGUF", "error: acme/Gated-GGUF is gated"),
    ]:
        done = _cli("models", "pull", "-q", ref, env_vars=env_vars)
        assert done.returncode == 1
        assert done.stderr.startswith(expected) and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
